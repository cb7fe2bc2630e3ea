// The small-M FP4 GEMM run grouped: fused_moe's decode GEMMs (torch_fp4/kernels/cuda/moe.py). The
// kernel body is mm_small_m.cuh's with Config::kGrouped: grid z walks the blocks of routed rows
// (block_m = 8 * kNB rows of one expert each, moe_align's layout), x the weight tiles and y the
// K split (a cluster), so each CTA streams one tile of one routed expert's weights once for all
// the expert's rows of the block. FC1 gathers its activation rows from x through the pairs
// (row_index[r] / top_k) and forms SwiGLU in the epilogue (a CTA holds the gate and the up rows
// of the same columns); FC2 writes its rows in pair order (row_index[r]) for the finalize. Experts
// row-major, or in the "sm90" layout (block_m <= 16: the kernels mm_small_m.cu compiles for it).
#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include <cuda_runtime.h>

#include "capi.h"
#include "graph_launch.cuh"
#include "launch.h"
#include "moe_decode.h"
#include "moe_route.cuh"
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
  int qdq_mx;              // swiglu: MXFP4 intermediates (no global scale)
  int a_gs_stride;         // (w_gs and a_gs, the experts' global scales: MmOperands')
  // gpt-oss's features (GroupedParams): MmOperands' bias as [experts, bias_cols] (or null), the
  // clamped SwiGLU
  int64_t bias_cols;
  int clamped;
  float glu_alpha, glu_limit;
};

namespace small_m {

constexpr int kMaxDevices = 64;
constexpr int64_t kMaxBlocks = 65535;   // grid z
constexpr int kPackedMaxBlockM = 16;     // "sm90" experts (PACKED_MAX_BLOCK_M in moe_small_m_tactics.py)

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
  p.qdq_mx = a.swiglu ? a.qdq_mx : 0;
  p.a_gs_stride = a.a_gs_stride;
  p.bias_cols = a.bias_cols;
  p.clamped = a.swiglu ? a.clamped : 0;
  p.glu_alpha = a.glu_alpha;
  p.glu_limit = a.glu_limit;

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

// The tile shapes of mm_small_m.cu (with_tile), grouped; "sm90" experts up to kPackedMaxBlockM.
// Kernel group (group_compiled): 0 for blocks of 8 routed rows, 1 for 16-64.
template <int kNB, bool kFp16, bool kMx, bool kPacked>
bool launch_nb(const SmallMMoeArgs& a, cudaStream_t stream, bool pdl) {
  if constexpr ((kPacked && 8 * kNB > kPackedMaxBlockM) || !group_compiled<kNB == 1 ? 0 : 1>()) {
    return false;
  } else {
    return with_tile<kNB, kFp16, kMx, kPacked, true>(a, [&](auto cfg) {
      return launch_cfg<decltype(cfg)>(a, stream, pdl);
    });
  }
}

template <bool kFp16, bool kMx, bool kPacked>
bool launch_format(const SmallMMoeArgs& a, cudaStream_t stream, bool pdl) {
  switch (a.block_m) {
    case 8: return launch_nb<1, kFp16, kMx, kPacked>(a, stream, pdl);
    case 16: return launch_nb<2, kFp16, kMx, kPacked>(a, stream, pdl);
    case 32: return launch_nb<4, kFp16, kMx, kPacked>(a, stream, pdl);
    case 64: return launch_nb<8, kFp16, kMx, kPacked>(a, stream, pdl);
    default: return false;
  }
}

// Variant kV's kernels (mm_operands.h), where this unit holds them.
template <int kV>
bool launch_variant(const SmallMMoeArgs& a, cudaStream_t stream, bool pdl) {
  if constexpr (mm_variant_compiled<kV>()) {
    constexpr MmVariant v = kMmVariants[kV];
    return launch_format<v.fp16, v.mx, v.packed>(a, stream, pdl);
  } else {
    return false;
  }
}

}  // namespace small_m

bool launch_small_m_moe(const SmallMMoeArgs& a, cudaStream_t stream, bool pdl) {
  if (a.stages < 2 || a.stages > 6 || a.split_k < 1 || a.split_k > small_m::kMaxSplit) return false;
  if (a.block_expert == nullptr || a.row_index == nullptr || a.expert_end == nullptr || a.top_k < 1) return false;
  if (a.w_gs == nullptr && !a.mx) return false;   // NVFP4 experts have global scales
  if (a.blocks > small_m::kMaxBlocks) return false;
  // "sm90" experts: whole 128 x 64 tiles (N counts FC1's gate and up rows together)
  if (a.packed && ((a.swiglu ? 2 * a.n : a.n) % 128 != 0 || a.k % 64 != 0)) return false;
  if (a.blocks <= 0 || a.n <= 0) return true;
  return with_mm_variant(mm_variant(a), [&](auto v) {
    return small_m::launch_variant<decltype(v)::value>(a, stream, pdl);
  });
}

// One GEMM of the decode path over every block of `ws`: act [.., k] times each block's expert's
// weights (weight_rows rows of k / 2 bytes per expert) into out [.., n] bf16.
SmallMMoeArgs decode_gemm(const MoeDecodePlan& p, const MoeDecodeWorkspace& ws, char* base, const void* act,
                          int act_fp16, const void* w, const void* w_scale, const float* w_gs, void* out, int64_t n,
                          int64_t k, int64_t weight_rows, int64_t kp, int64_t s_expert, int64_t split,
                          const void* bias, int64_t bias_cols, int64_t bias_dtype) {
  SmallMMoeArgs a{};
  static_cast<SmallMMmArgs&>(a) = small_m_args(
      make_mm_operands(act, w, w_scale, nullptr, w_gs, nullptr, out, ws.rows, n, k, kp, act_fp16,
                       static_cast<int>(p.mx), kBFloat16, static_cast<int>(p.packed)),
                   static_cast<int>(p.warps), static_cast<int>(p.tiles_per_warp), static_cast<int>(p.block_k),
                   static_cast<int>(p.stages), static_cast<int>(split));
  a.block_m = static_cast<int>(p.block_m);
  a.block_expert = reinterpret_cast<const int*>(base + ws.block_expert);
  a.blocks = ws.blocks;
  a.experts = p.experts;
  a.w_expert = weight_rows * (k / 2);
  a.s_expert = s_expert;
  a.row_index = reinterpret_cast<const int*>(base + ws.sorted_pairs);
  a.expert_end = reinterpret_cast<const int*>(base + ws.expert_end);
  a.top_k = static_cast<int>(p.top_k);
  a.bias = bias;
  a.bias_cols = bias_cols;
  a.bias_dtype = bias_dtype == kFloat32 ? small_m::kOutF32 : small_m::kOutBf16;
  return a;
}

// Whether the decode path can run plan p (sizes, experts within the alignment's tables, block_m,
// grouped rows within 32-bit indices and the grid).
bool decode_plan_ok(const MoeDecodePlan& p) {
  if (p.tokens < 1 || p.top_k < 1 || p.experts < 1 || p.hidden < 16 || p.inter < 16) return false;
  if (p.hidden % moe_route::kSumColumns || p.experts > moe_route::kMaxExperts) return false;
  if (p.block_m != 8 && p.block_m != 16 && p.block_m != 32 && p.block_m != 64) return false;
  if (p.mx != 0 && p.mx != 1) return false;
  if (p.act_mx != 0 && (p.act_mx != 1 || p.mx != 1 || p.inter % 32)) return false;   // MXFP4 experts only
  for (const int64_t d : {p.bias1_dtype, p.bias2_dtype})
    if (d != kBFloat16 && d != kFloat32) return false;
  if (p.activation != 0 && p.activation != 1) return false;
  // "sm90" experts: block_m <= kPackedMaxBlockM, whole 128 x 64 tiles in w1 [2I, H] and w2 [H, I]
  if (p.packed != 0 && (p.packed != 1 || p.block_m > small_m::kPackedMaxBlockM || (2 * p.inter) % 128 || p.hidden % 128 || p.inter % 64))
    return false;
  const MoeDecodeWorkspace ws = moe_decode_workspace(p);
  return ws.rows < (int64_t{1} << 31) && ws.blocks <= small_m::kMaxBlocks;
}

}  // namespace torch_fp4

// C entry points (capi.h) of fused_moe's decode path on the plan (moe_decode.h). The workspace's
// size in bytes (moe_decode_workspace), or -1 when the decode path cannot run the plan.
TORCH_FP4_CAPI int64_t torch_fp4_moe_decode_workspace_bytes(const torch_fp4::MoeDecodePlan* plan) {
  if (plan == nullptr || !torch_fp4::decode_plan_ok(*plan)) return -1;
  return torch_fp4::moe_decode_workspace(*plan).bytes;
}

// out [tokens, hidden] (plan.out_dtype) of fused_moe: x [tokens, hidden] (bf16/fp16, 16-byte
// aligned; W4A4: the exact bf16 values of its NVFP4, or with plan.act_mx MXFP4, quantization),
// w1 [E, 2I, H/2] / w2 [E, H, I/2]
// row-major with 128x4 scales, w1_gs / w2_gs [E] contiguous, topk_ids int32 / topk_weights fp32
// [tokens, top_k] contiguous, a1_gs / a2_gs null (W4A16) or the activations' global scales,
// workspace torch_fp4_moe_decode_workspace_bytes bytes, 256-byte aligned. Four launches: align,
// FC1 (gather, SwiGLU; W4A4: the intermediate's NVFP4 / MXFP4 exact values), FC2 (rows in pair order),
// the top-k sum; none reads anything back. graph: null, or a handle of
// torch_fp4_moe_decode_graph_create for this plan, through which the four launches are enqueued
// as one CUDA graph launch (graph_launch.cuh) when the stream is not being captured.
TORCH_FP4_CAPI int torch_fp4_moe_decode(int device, void* stream, int pdl, const torch_fp4::MoeDecodePlan* plan,
                                        const void* x, const void* w1, const void* w1_scale, const float* w1_gs,
                                        const void* w2, const void* w2_scale, const float* w2_gs,
                                        const int* topk_ids, const float* topk_weights, const float* a1_gs,
                                        const float* a2_gs, const void* w1_bias, const void* w2_bias, void* out,
                                        void* workspace, void* graph) {
  using namespace torch_fp4;
  if (const int e = capi_begin(device)) return e;
  if (plan == nullptr || !decode_plan_ok(*plan) || workspace == nullptr) return kNotCompiled;
  const MoeDecodePlan& p = *plan;
  const MoeDecodeWorkspace ws = moe_decode_workspace(p);
  char* base = static_cast<char*>(workspace);
  const bool use_pdl = pdl != 0;
  const int lo = static_cast<int>(p.local_offset), experts = static_cast<int>(p.experts);
  auto enqueue = [&](cudaStream_t s) {
    moe_route::launch_align(topk_ids, p.tokens * p.top_k, lo, experts, static_cast<int>(p.block_m), ws.blocks,
                            reinterpret_cast<int*>(base + ws.sorted_pairs), reinterpret_cast<int*>(base + ws.block_expert),
                            reinterpret_cast<int*>(base + ws.expert_end), s, use_pdl);

    SmallMMoeArgs fc1 = decode_gemm(p, ws, base, x, static_cast<int>(p.act_fp16), w1, w1_scale, w1_gs, base + ws.h,
                                    p.inter, p.hidden, 2 * p.inter, p.w1_kp, p.w1_s_expert, p.fc1_split, w1_bias,
                                    2 * p.inter, p.bias1_dtype);
    fc1.gather = 1;
    fc1.swiglu = 1;
    fc1.clamped = static_cast<int>(p.activation);
    fc1.glu_alpha = small_m::bits_to_float(static_cast<uint32_t>(p.swiglu_alpha_bits));
    fc1.glu_limit = small_m::bits_to_float(static_cast<uint32_t>(p.swiglu_limit_bits));
    fc1.qdq_gs = a2_gs;
    fc1.qdq_gs_stride = static_cast<int>(p.a2_gs_stride);
    fc1.qdq_mx = static_cast<int>(p.act_mx);
    fc1.a_gs = a1_gs;   // one value: a_gs_stride 0
    bool launched = launch_small_m_moe(fc1, s, use_pdl);

    SmallMMoeArgs fc2 = decode_gemm(p, ws, base, base + ws.h, 0, w2, w2_scale, w2_gs, base + ws.y, p.hidden, p.inter,
                                    p.hidden, p.w2_kp, p.w2_s_expert, p.fc2_split, w2_bias, p.hidden,
                                    p.bias2_dtype);
    fc2.scatter = 1;
    fc2.a_gs = a2_gs;
    fc2.a_gs_stride = static_cast<int>(p.a2_gs_stride);
    launched = launched && launch_small_m_moe(fc2, s, use_pdl);

    return launched && moe_route::launch_topk_sum(reinterpret_cast<const uint16_t*>(base + ws.y), topk_ids,
                                                  topk_weights, out, static_cast<int>(p.out_dtype), p.tokens,
                                                  static_cast<int>(p.hidden), static_cast<int>(p.top_k), lo, experts,
                                                  p.strict != 0, s, use_pdl);
  };
  return launch_through_graph(static_cast<LaunchGraph*>(graph), static_cast<cudaStream_t>(stream), use_pdl, enqueue);
}

// A graph handle for torch_fp4_moe_decode (one plan and device; built by its first call that is
// not being captured), null when out of memory; freed by torch_fp4_moe_decode_graph_destroy.
TORCH_FP4_CAPI void* torch_fp4_moe_decode_graph_create(int device) {
  if (torch_fp4::capi_begin(device)) return nullptr;
  return new (std::nothrow) torch_fp4::LaunchGraph();
}

// Frees a handle of torch_fp4_moe_decode_graph_create (graph launches still in flight complete);
// returns 0.
TORCH_FP4_CAPI int torch_fp4_moe_decode_graph_destroy(int device, void* graph) {
  if (const int e = torch_fp4::capi_begin(device)) return e;
  delete static_cast<torch_fp4::LaunchGraph*>(graph);
  return 0;
}

// A handle's state: 0 not built yet, 1 built (calls are graph launches), 2 building failed (calls
// launch directly).
TORCH_FP4_CAPI int torch_fp4_moe_decode_graph_state(void* graph) {
  auto* g = static_cast<torch_fp4::LaunchGraph*>(graph);
  if (g == nullptr) return 2;
  std::lock_guard<std::mutex> lock(g->mutex);
  return static_cast<int>(g->state);
}
