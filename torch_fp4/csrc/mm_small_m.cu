// Small-M FP4 GEMM (M <= 64) of the cuda backend: device context, kernel and launcher. The kernel
// body, its shared-memory layout and the decode are in mm_small_m.cuh (see the design notes there).
#include <algorithm>
#include <cstdint>

#include <cuda_runtime.h>

#include "capi.h"
#include "launch.h"
#include "small_m_device.cuh"

namespace torch_fp4 {
namespace small_m {

static_assert(kOutBf16 == kBFloat16 && kOutF16 == kFloat16 && kOutF32 == kFloat32,
              "output dtype codes must match launch.h");

constexpr int kMaxDevices = 64;

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks) small_m_mm_kernel(const Params p, int stages) {
  extern __shared__ __align__(16) char smem[];
  DeviceCtx ctx{smem};
  small_m_mm<Cfg>(p, ctx, stages);
}

template <class Cfg>
void launch_cfg(const SmallMMmArgs& a, cudaStream_t stream, bool pdl) {
  const int steps = static_cast<int>((a.k + Cfg::kBK - 1) / Cfg::kBK);
  const int split = std::max(1, std::min(a.split_k, std::max(steps, 1)));
  Params p = operand_params(a, (steps + split - 1) / split);
  p.w_aligned16 = (a.k % 32 == 0 && reinterpret_cast<uintptr_t>(a.w) % 16 == 0) ? 1 : 0;  // always, "sm90"

  const int smem = smem_bytes<Cfg>(a.stages);
  auto kernel = small_m_mm_kernel<Cfg>;
  static int configured[kMaxDevices] = {};
  reserve_smem(kernel, smem, configured);
  const dim3 grid(static_cast<unsigned>((a.n + Cfg::kBN - 1) / Cfg::kBN), static_cast<unsigned>(split), 1);
  // The splits of one weight tile form a cluster along y (reduced through distributed smem).
  launch_cluster(kernel, grid, dim3(static_cast<unsigned>(Cfg::kThreads), 1, 1), smem,
                 dim3(1, static_cast<unsigned>(split), 1), stream, pdl, p, a.stages);
}

// The compiled tile shapes (warps, MMA tiles per warp, block_k): tile_compiled() in mm_small_m.cuh;
// the tactic space (torch_fp4/kernels/cuda/mm_tactics.py) offers exactly these.
// Kernel group (group_compiled): 0 for one 8-row block (M <= 8), 1 for more.
template <int kNB, bool kFp16, bool kMx, bool kPacked>
bool launch_nb(const SmallMMmArgs& a, cudaStream_t stream, bool pdl) {
  if constexpr (!group_compiled<kNB == 1 ? 0 : 1>()) {
    return false;
  } else {
    return with_tile<kNB, kFp16, kMx, kPacked, false>(a, [&](auto cfg) {
      launch_cfg<decltype(cfg)>(a, stream, pdl);
      return true;
    });
  }
}

template <bool kFp16, bool kMx, bool kPacked>
bool launch_format(const SmallMMmArgs& a, cudaStream_t stream, bool pdl) {
  const int64_t nb = (a.m + 7) / 8;
  if constexpr (kPacked) {  // "sm90" weights: whole 128 x 64 tiles, compiled for packed_compiled
    if (a.n % 128 != 0 || a.k % 64 != 0 || reinterpret_cast<uintptr_t>(a.w) % 16 != 0) return false;
    static_assert(packed_compiled(4, 4, 1) && !packed_compiled(5, 4, 1), "the dispatch below");
    if (nb <= 1) return launch_nb<1, kFp16, kMx, true>(a, stream, pdl);
    if (nb <= 2) return launch_nb<2, kFp16, kMx, true>(a, stream, pdl);
    if (nb <= 4) return launch_nb<4, kFp16, kMx, true>(a, stream, pdl);
    return false;
  } else {
    if (nb <= 1) return launch_nb<1, kFp16, kMx, false>(a, stream, pdl);
    if (nb <= 2) return launch_nb<2, kFp16, kMx, false>(a, stream, pdl);
    if (nb <= 4) return launch_nb<4, kFp16, kMx, false>(a, stream, pdl);
    if (nb <= 8) return launch_nb<8, kFp16, kMx, false>(a, stream, pdl);
    return false;
  }
}

// Variant kV's kernels (mm_operands.h), where this unit holds them.
template <int kV>
bool launch_variant(const SmallMMmArgs& a, cudaStream_t stream, bool pdl) {
  if constexpr (mm_variant_compiled<kV>()) {
    constexpr MmVariant v = kMmVariants[kV];
    return launch_format<v.fp16, v.mx, v.packed>(a, stream, pdl);
  } else {
    return false;
  }
}

}  // namespace small_m

bool launch_small_m_mm(const SmallMMmArgs& args, cudaStream_t stream, bool pdl) {
  if (args.stages < 2 || args.stages > 6 || args.split_k < 1 || args.split_k > small_m::kMaxSplit) return false;
  if (args.m <= 0 || args.n <= 0) return true;
  return with_mm_variant(mm_variant(args), [&](auto v) {
    return small_m::launch_variant<decltype(v)::value>(args, stream, pdl);
  });
}

}  // namespace torch_fp4

// C entry point (capi.h): the small-M GEMM on MmOperands (make_mm_operands) and a bias [n] (or null;
// bias_dtype: launch.h's DType) with the tactic warps, tiles_per_warp, block_k, stages, split_k.
TORCH_FP4_CAPI int torch_fp4_mm_small_m(int device, void* stream, int pdl, const void* act, const void* w,
                                        const void* w_scale, const float* alpha, const float* w_gs,
                                        const float* a_gs, void* out, int64_t m, int64_t n, int64_t k, int64_t kp,
                                        int act_fp16, int mx, int out_dtype, int packed, const void* bias,
                                        int bias_dtype, int warps, int tiles_per_warp, int block_k, int stages,
                                        int split_k) {
  if (const int e = torch_fp4::capi_begin(device)) return e;
  torch_fp4::MmOperands ops = torch_fp4::make_mm_operands(act, w, w_scale, alpha, w_gs, a_gs, out, m, n, k, kp,
                                                          act_fp16, mx, out_dtype, packed);
  ops.bias = bias;
  ops.bias_dtype = bias_dtype;
  const torch_fp4::SmallMMmArgs a = torch_fp4::small_m_args(ops, warps, tiles_per_warp, block_k, stages, split_k);
  return torch_fp4::capi_end(torch_fp4::launch_small_m_mm(a, static_cast<cudaStream_t>(stream), pdl != 0));
}
