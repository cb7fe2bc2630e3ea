// The operands of an FP4-weight GEMM launch, shared by the cuda backend's GEMMs (mm_small_m.cu,
// mm_wgmma.cu): plain pointers and sizes, no torch or CUDA types (the CPU emulation includes it).
#pragma once

#include <cstdint>

namespace torch_fp4 {

// act: [m, k] bf16/fp16 (act_fp16), w: [n, k/2] packed FP4, w_scale: 128x4 [np, kp] bytes (mx:
// MXFP4, else NVFP4), out: [m, n] of out_dtype (launch.h's DType code), alpha: one fp32 value or
// null; w_gs (NVFP4, with alpha null): the weights' global scale, from which the epilogue forms
// alpha = RN(1 / RN(a_gs * w_gs)), or RN(1 / w_gs) when a_gs is null (formats.nvfp4_alpha), so that
// no launch computes it; packed: w is in the "sm90" fragment layout (docs/NUMERICS.md 4b; n % 128 == 0,
// k % 64 == 0), else row-major. Each GEMM's argument struct adds its tactic.
//
// Grouped (block_expert not null; the Hopper GEMM only): the rows of act and out are blocks of
// block_m rows (the tactic's), block b multiplying expert block_expert[b]'s weights: w [experts,
// n, k/2], w_scale [experts, np, kp] (w_expert and s_expert bytes apart), alpha [experts] (or
// null); blocks with block_expert[b] < 0 come after every used block and are skipped (their out
// rows are not written).
struct MmOperands {
  const uint16_t* act;
  const uint8_t* w;
  const uint8_t* w_scale;
  const float* alpha;
  const float* w_gs;
  const float* a_gs;
  void* out;
  int64_t m, n, k, kp;
  int act_fp16, mx, out_dtype, packed;
  const int* block_expert;
  int64_t experts, w_expert, s_expert;
  // Dense launches: bias [n] (bias_dtype: launch.h's DType, bf16 / fp16 / fp32) added in fp32 to
  // RN(alpha * acc) before the output's rounding (docs/NUMERICS.md section 5), or null.
  const void* bias;
  int bias_dtype;
};

// The kernel variants of each GEMM, by index: (fp16 activations ? 2 : MXFP4 ? 4 : 0) + "sm90"
// weights (fp16 activations with MXFP4 are not compiled: fp16 cannot hold every MXFP4 value).
// Each variant of each GEMM is a kernel library of its own (torch_fp4/kernels/cuda/build.py:
// the source compiled with -DTORCH_FP4_PARTS=mask holds the kernels of the variants whose bits
// are set only (one, or fused_moe's fp16 decode path: fp16 FC1, bf16 FC2), and its dispatch and
// C entry points refuse the others), built when a call first needs it; without TORCH_FP4_PARTS a
// source holds every variant.
struct MmVariant {
  bool fp16, mx, packed;
};
constexpr MmVariant kMmVariants[] = {{false, false, false}, {false, false, true}, {true, false, false},
                                     {true, false, true},   {false, true, false}, {false, true, true}};
constexpr int kNumMmVariants = sizeof(kMmVariants) / sizeof(kMmVariants[0]);

// The variant index of a launch, or -1 when none is compiled for it.
constexpr int mm_variant(const MmOperands& a) {
  return a.act_fp16 && a.mx ? -1 : (a.act_fp16 ? 2 : a.mx ? 4 : 0) + (a.packed ? 1 : 0);
}

template <int kV>
struct MmVariantIndex {
  static constexpr int value = kV;
  static constexpr MmVariant variant = kMmVariants[kV];
};

// Whether this translation unit holds variant kV's kernels.
template <int kV>
constexpr bool mm_variant_compiled() {
#if defined(TORCH_FP4_PARTS)
  return ((TORCH_FP4_PARTS) >> kV) & 1;
#else
  return true;
#endif
}

// Kernel groups of a GEMM source by the M it serves, so that a first call builds only the kernels
// its M needs: the source compiled with -DTORCH_FP4_GROUP=g holds group g's kernels only (and its
// dispatch refuses the others); without TORCH_FP4_GROUP, every group. mm_small_m.cu: group 0
// M <= 8 (one 8-row block), group 1 M = 9-64; mm_wgmma.cu: group 0 block_m <= 64, group 1
// block_m >= 96; moe_small_m.cu: group 0 block_m 8, group 1 block_m 16-64
// (torch_fp4/kernels/cuda/build.py names the libraries).
template <int kGroup>
constexpr bool group_compiled() {
#if defined(TORCH_FP4_GROUP)
  return (TORCH_FP4_GROUP) == kGroup;
#else
  return true;
#endif
}

// f(MmVariantIndex<v>{}) for the runtime index v (false for an index with no variant).
template <class F>
bool with_mm_variant(int v, F&& f) {
  switch (v) {
    case 0: return f(MmVariantIndex<0>{});
    case 1: return f(MmVariantIndex<1>{});
    case 2: return f(MmVariantIndex<2>{});
    case 3: return f(MmVariantIndex<3>{});
    case 4: return f(MmVariantIndex<4>{});
    case 5: return f(MmVariantIndex<5>{});
    default: return false;
  }
}
static_assert(kNumMmVariants == 6, "with_mm_variant covers every variant");

// The operands of a C entry point's arguments (capi.h), in MmOperands' field order.
inline MmOperands make_mm_operands(const void* act, const void* w, const void* w_scale, const float* alpha,
                                   const float* w_gs, const float* a_gs, void* out, int64_t m, int64_t n,
                                   int64_t k, int64_t kp, int act_fp16, int mx, int out_dtype, int packed) {
  MmOperands a{};
  a.act = static_cast<const uint16_t*>(act);
  a.w = static_cast<const uint8_t*>(w);
  a.w_scale = static_cast<const uint8_t*>(w_scale);
  a.alpha = alpha;
  a.w_gs = w_gs;
  a.a_gs = a_gs;
  a.out = out;
  a.m = m;
  a.n = n;
  a.k = k;
  a.kp = kp;
  a.act_fp16 = act_fp16;
  a.mx = mx;
  a.out_dtype = out_dtype;
  a.packed = packed;
  a.experts = 1;
  return a;
}

}  // namespace torch_fp4
