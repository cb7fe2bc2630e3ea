// fused_moe's activation between the cuda backend's grouped Hopper GEMMs (kernels/cuda/moe.py):
// h [rows, 2I] ([gate | up] columns of FC1's result, rows in blocks of block_m of one expert) ->
// bf16 [rows, I], the spec's (section 6) RN_bf16(act(RN_bf16(gate), RN_bf16(up))) with act the
// SwiGLU or gpt-oss's clamped SwiGLU (small_m_ops.cuh, as the decode path's FC1 epilogue). h is
// bf16, or fp32 FC1 results RN(alpha1 * acc) to which the expert's w1_bias row is added first.
// W4A4 (kExact): the result's exact quantized values instead (exact_values.cuh: NVFP4 with the
// global scale of the row's expert, or MXFP4), FC2's 16-bit activations. Rows of unused blocks
// (expert -1, never written by the GEMM) come out as zeros without being read.
// One thread per quantization block (16 or 32 output columns) of one row; 16-byte loads.
#include <cstdint>

#include "capi.h"
#include "exact_values.cuh"
#include "pdl.cuh"
#include "small_m_ops.cuh"

namespace torch_fp4 {
namespace {

constexpr int kThreads = 256;

struct SwigluParams {
  const void* h;                 // [rows, 2I]: bf16, or fp32 (kF32)
  const void* bias;              // [E, 2I] (bias_fp32: fp32, else bf16), or null
  int bias_fp32;
  const int32_t* block_expert;   // [rows / block_m]
  int64_t block_m;
  int64_t rows;
  int64_t inter;
  int64_t groups;                // inter / columns per thread
  int clamped;
  float alpha, limit;
  const float* gs;               // kExact 16: the NVFP4 global scale of expert e at gs[e * gs_stride]
  int64_t gs_stride;
  uint16_t* out;                 // bf16 [rows, I]
};

template <int kCount>
__device__ __forceinline__ void load_row_values(const void* base, int64_t offset, bool f32, float* v) {
  if (f32) {
    const uint4* q = reinterpret_cast<const uint4*>(static_cast<const float*>(base) + offset);
#pragma unroll
    for (int i = 0; i < kCount / 4; ++i) {
      const uint4 w = __ldg(q + i);
      v[4 * i] = __uint_as_float(w.x), v[4 * i + 1] = __uint_as_float(w.y);
      v[4 * i + 2] = __uint_as_float(w.z), v[4 * i + 3] = __uint_as_float(w.w);
    }
  } else {
    const uint4* q = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(base) + offset);
#pragma unroll
    for (int i = 0; i < kCount / 8; ++i) {
      const uint4 w = __ldg(q + i);
      const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        v[8 * i + 2 * j] = small_m::host_bf16_to_f32(words[j] & 0xFFFFu);
        v[8 * i + 2 * j + 1] = small_m::host_bf16_to_f32(words[j] >> 16);
      }
    }
  }
}

template <bool kF32, int kExact>
__global__ void __launch_bounds__(kThreads) swiglu_kernel(const SwigluParams p) {
  constexpr int kCols = kExact == 32 ? 32 : 16;   // output columns per thread
  pdl_wait();  // before any global-memory access
  const int64_t index = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (index >= p.rows * p.groups) return;
  const int64_t r = index / p.groups, c = (index % p.groups) * kCols;
  uint16_t* dst = p.out + r * p.inter + c;
  const int e = __ldg(p.block_expert + r / p.block_m);
  if (e < 0) {
#pragma unroll
    for (int i = 0; i < kCols / 8; ++i) reinterpret_cast<uint4*>(dst)[i] = make_uint4(0, 0, 0, 0);
    return;
  }
  float g[kCols], u[kCols];
  load_row_values<kCols>(p.h, r * 2 * p.inter + c, kF32, g);
  load_row_values<kCols>(p.h, r * 2 * p.inter + p.inter + c, kF32, u);
  pdl_launch_dependents();
  if (p.bias != nullptr) {   // RN_bf16(RN_fp32(alpha1 * acc) + b1[e]): swiglu_of rounds to bf16
    float bg[kCols], bu[kCols];
    load_row_values<kCols>(p.bias, e * 2 * p.inter + c, p.bias_fp32 != 0, bg);
    load_row_values<kCols>(p.bias, e * 2 * p.inter + p.inter + c, p.bias_fp32 != 0, bu);
#pragma unroll
    for (int i = 0; i < kCols; ++i) g[i] = small_m::add_rn(g[i], bg[i]), u[i] = small_m::add_rn(u[i], bu[i]);
  }
  float v[kCols];
#pragma unroll
  for (int i = 0; i < kCols; ++i) {
    const float a = p.clamped ? small_m::clamped_swiglu_of(g[i], u[i], p.alpha, p.limit) : small_m::swiglu_of(g[i], u[i]);
    v[i] = small_m::host_bf16_to_f32(small_m::round_out<small_m::kOutBf16>(a));   // the bf16 intermediate
  }
  if constexpr (kExact == 0) {
    store_values<kBFloat16, kCols>(reinterpret_cast<uint8_t*>(dst), v);
  } else {
    quantize_exact_block<kExact>(dst, v, kExact == 16 ? __ldg(p.gs + e * p.gs_stride) : 1.0f);
  }
}

template <bool kF32, int kExact>
void launch_swiglu(const SwigluParams& p, cudaStream_t stream, bool pdl) {
  const int64_t threads = p.rows * p.groups;
  launch_kernel(swiglu_kernel<kF32, kExact>, dim3(static_cast<unsigned>((threads + kThreads - 1) / kThreads)),
                kThreads, stream, pdl, p);
}

}  // namespace
}  // namespace torch_fp4

// h [rows, 2I] (h_f32: fp32, else bf16; 16-byte aligned rows: I % 16 == 0) -> out bf16 [rows, I];
// bias [E, 2I] or null; clamped: gpt-oss's activation with the fp32 alpha and limit given by their
// bit patterns; exact 0 (the activation), 16 (NVFP4 exact values with gs[e * gs_stride])
// or 32 (MXFP4, I % 32 == 0).
TORCH_FP4_CAPI int torch_fp4_moe_swiglu(int device, void* stream, int pdl, const void* h, int h_f32, const void* bias,
                                        int bias_fp32, const int32_t* block_expert, int64_t block_m, int64_t rows,
                                        int64_t inter, int clamped, int64_t alpha_bits, int64_t limit_bits, int exact,
                                        const float* gs, int64_t gs_stride, void* out) {
  if (const int e = torch_fp4::capi_begin(device)) return e;
  const int cols = exact == 32 ? 32 : 16;
  if ((exact != 0 && exact != 16 && exact != 32) || inter % cols || block_m < 1 || (exact == 16 && gs == nullptr))
    return torch_fp4::kNotCompiled;
  if (rows <= 0 || inter <= 0) return torch_fp4::capi_end(true);
  torch_fp4::SwigluParams p{h, bias, bias_fp32, block_expert, block_m, rows, inter, inter / cols, clamped,
                            torch_fp4::small_m::bits_to_float(static_cast<uint32_t>(alpha_bits)),
                            torch_fp4::small_m::bits_to_float(static_cast<uint32_t>(limit_bits)), gs, gs_stride,
                            static_cast<uint16_t*>(out)};
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const bool d = pdl != 0;
#define TORCH_FP4_SWIGLU(F32)                                                  \
  do {                                                                         \
    if (exact == 0) torch_fp4::launch_swiglu<F32, 0>(p, s, d);                 \
    else if (exact == 16) torch_fp4::launch_swiglu<F32, 16>(p, s, d);          \
    else torch_fp4::launch_swiglu<F32, 32>(p, s, d);                           \
  } while (0)
  if (h_f32) TORCH_FP4_SWIGLU(true); else TORCH_FP4_SWIGLU(false);
#undef TORCH_FP4_SWIGLU
  return torch_fp4::capi_end(true);
}
