// The small-M FP4 GEMM run grouped: fused_moe's decode GEMMs (torch_fp4/kernels/cuda/moe.py). The
// kernel body is mm_small_m.cuh's with Config::kGrouped: grid z walks the blocks of routed rows
// (block_m = 8 * kNB rows of one expert each, moe_align's layout), x the weight tiles and y the
// K split (a cluster), so each CTA streams one tile of one routed expert's weights once for all
// the expert's rows of the block. FC1 gathers its activation rows from x through the pairs
// (row_index[r] / top_k) and forms SwiGLU in the epilogue (a CTA holds the gate and the up rows
// of the same columns); FC2 writes its rows in pair order (row_index[r]) for the finalize.
#include <algorithm>
#include <cstdint>

#include <cuda_runtime.h>

#include "capi.h"
#include "launch.h"
#include "small_m_device.cuh"

namespace torch_fp4 {

// The small-M tactic and operands (SmallMMmArgs) plus the grouping: blocks of block_m rows,
// block_expert [blocks] (mm_operands.h), row_index / expert_end / top_k (mm_small_m.cuh Params),
// and the three per-GEMM modes gather, swiglu (bf16 output; qdq_gs: NVFP4 intermediates) and
// scatter.
struct SmallMMoeArgs : SmallMMmArgs {
  int block_m;
  int64_t blocks;
  const int* row_index;
  const int* expert_end;
  int top_k, gather, swiglu, scatter;
  const float* qdq_gs;
  int qdq_gs_stride;
  const float* w_gs;
  const float* a_gs;
  int a_gs_stride;
};

namespace small_m {

constexpr int kMaxDevices = 64;
constexpr int64_t kMaxBlocks = 65535;   // grid z

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks) small_m_moe_kernel(const GroupedParams p,
                                                                                     int stages) {
  extern __shared__ __align__(16) char smem[];
  DeviceCtx ctx{smem};
  small_m_mm<Cfg>(p, ctx, stages);
}

template <class Cfg>
bool launch_cfg(const SmallMMoeArgs& a, cudaStream_t stream, bool pdl) {
  constexpr int kHalf = Cfg::kBN / 2;
  if (a.swiglu && a.out_dtype != kOutBf16) return false;
  const int steps = static_cast<int>((a.k + Cfg::kBK - 1) / Cfg::kBK);
  const int split = std::max(1, std::min(a.split_k, std::max(steps, 1)));
  GroupedParams p{};
  static_cast<Params&>(p) = operand_params(a, (steps + split - 1) / split);
  p.w_aligned16 = (a.k % 32 == 0 && reinterpret_cast<uintptr_t>(a.w) % 16 == 0 && a.w_expert % 16 == 0) ? 1 : 0;
  p.row_index = a.row_index;
  p.expert_end = a.expert_end;
  p.top_k = a.top_k;
  p.gather = a.gather;
  p.swiglu = a.swiglu;
  p.scatter = a.scatter;
  p.qdq_gs = a.swiglu ? a.qdq_gs : nullptr;
  p.qdq_gs_stride = a.qdq_gs_stride;
  p.w_gs = a.w_gs;
  p.a_gs = a.a_gs;
  p.a_gs_stride = a.a_gs_stride;

  const int smem = smem_bytes<Cfg>(a.stages);
  auto kernel = small_m_moe_kernel<Cfg>;
  static int configured[kMaxDevices] = {};
  reserve_smem(kernel, smem, configured);
  const int64_t tiles = (a.n + (a.swiglu ? kHalf : Cfg::kBN) - 1) / (a.swiglu ? kHalf : Cfg::kBN);
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(split), static_cast<unsigned>(a.blocks));
  launch_cluster(kernel, grid, dim3(static_cast<unsigned>(Cfg::kThreads), 1, 1), smem,
                 dim3(1, static_cast<unsigned>(split), 1), stream, pdl, p, a.stages);
  return true;
}

// The tile shapes of mm_small_m.cu (with_tile), grouped.
template <int kNB, bool kFp16, bool kMx>
bool launch_nb(const SmallMMoeArgs& a, cudaStream_t stream, bool pdl) {
  return with_tile<kNB, kFp16, kMx, false, true>(a, [&](auto cfg) { return launch_cfg<decltype(cfg)>(a, stream, pdl); });
}

template <bool kFp16, bool kMx>
bool launch_format(const SmallMMoeArgs& a, cudaStream_t stream, bool pdl) {
  switch (a.block_m) {
    case 8: return launch_nb<1, kFp16, kMx>(a, stream, pdl);
    case 16: return launch_nb<2, kFp16, kMx>(a, stream, pdl);
    case 32: return launch_nb<4, kFp16, kMx>(a, stream, pdl);
    case 64: return launch_nb<8, kFp16, kMx>(a, stream, pdl);
    default: return false;
  }
}

// Variant kV's kernels (mm_operands.h), where this unit holds them; row-major weights only.
template <int kV>
bool launch_variant(const SmallMMoeArgs& a, cudaStream_t stream, bool pdl) {
  if constexpr (mm_variant_compiled<kV>() && !kMmVariants[kV].packed) {
    constexpr MmVariant v = kMmVariants[kV];
    return launch_format<v.fp16, v.mx>(a, stream, pdl);
  } else {
    return false;
  }
}

}  // namespace small_m

bool launch_small_m_moe(const SmallMMoeArgs& a, cudaStream_t stream, bool pdl) {
  if (a.stages < 2 || a.stages > 6 || a.split_k < 1 || a.split_k > small_m::kMaxSplit) return false;
  if (a.block_expert == nullptr || a.row_index == nullptr || a.expert_end == nullptr || a.top_k < 1) return false;
  if (a.w_gs == nullptr) return false;
  if (a.blocks > small_m::kMaxBlocks) return false;
  if (a.blocks <= 0 || a.n <= 0) return true;
  return with_mm_variant(mm_variant(a), [&](auto v) {
    return small_m::launch_variant<decltype(v)::value>(a, stream, pdl);
  });
}

}  // namespace torch_fp4

// C entry point (capi.h): the grouped small-M GEMM on MmOperands (make_mm_operands; m: the grouped
// rows, blocks * block_m) with the small-M tactic (warps, tiles_per_warp, block_k, stages, split_k)
// and the grouping (block_m, block_expert [blocks], experts and the bytes between their weights
// and scales, row_index, expert_end, top_k, gather, swiglu, scatter); with swiglu, qdq_gs (null,
// or [1] / [experts] with qdq_gs_stride 0 / 1) makes FC1's output NVFP4-exact (Ctx::nvfp4_qdq);
// each block's alpha is formed from w_gs [experts] and a_gs (null, or [1] / [experts] with
// a_gs_stride 0 / 1): alpha is ignored.
TORCH_FP4_CAPI int torch_fp4_moe_small_m(int device, void* stream, int pdl, const void* act, const void* w,
                                         const void* w_scale, const float* alpha, void* out, int64_t m, int64_t n,
                                         int64_t k, int64_t kp, int act_fp16, int mx, int out_dtype, int packed,
                                         int warps, int tiles_per_warp, int block_k, int stages, int split_k,
                                         int block_m, const int* block_expert, int64_t blocks, int64_t experts,
                                         int64_t w_expert, int64_t s_expert, const int* row_index,
                                         const int* expert_end, int top_k, int gather, int swiglu, int scatter,
                                         const float* qdq_gs, int qdq_gs_stride, const float* w_gs,
                                         const float* a_gs, int a_gs_stride) {
  if (const int e = torch_fp4::capi_begin(device)) return e;
  torch_fp4::SmallMMoeArgs a{};
  static_cast<torch_fp4::SmallMMmArgs&>(a) = torch_fp4::small_m_args(
      torch_fp4::make_mm_operands(act, w, w_scale, alpha, out, m, n, k, kp, act_fp16, mx, out_dtype, packed), warps,
      tiles_per_warp, block_k, stages, split_k);
  a.block_m = block_m;
  a.block_expert = block_expert;
  a.blocks = blocks;
  a.experts = experts;
  a.w_expert = w_expert;
  a.s_expert = s_expert;
  a.row_index = row_index;
  a.expert_end = expert_end;
  a.top_k = top_k;
  a.gather = gather;
  a.swiglu = swiglu;
  a.scatter = scatter;
  a.qdq_gs = qdq_gs;
  a.qdq_gs_stride = qdq_gs_stride;
  a.w_gs = w_gs;
  a.a_gs = a_gs;
  a.a_gs_stride = a_gs_stride;
  return torch_fp4::capi_end(torch_fp4::launch_small_m_moe(a, static_cast<cudaStream_t>(stream), pdl != 0));
}
