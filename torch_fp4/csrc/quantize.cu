// NVFP4 and MXFP4 quantization kernels (spec sections 1-4) on raw pointers.
//
// One thread per entry of the padded scale matrix [rows_padded, kb_padded] of one batch entry
// (blockIdx.y strides over the batch). A thread whose entry lies in the padding writes a zero
// scale byte; every other thread loads its whole block (16-byte loads), computes the block scale,
// encodes the block's elements and writes its packed bytes and its scale byte. Every output byte
// is written by exactly one thread.
//
// The exact-values mode (kExact): the same quantization, but each thread writes its block's
// dequantized values without the global scale, code * block scale (e4m3 for NVFP4, 2^(e - 127)
// for MXFP4; exact in bf16), as bf16 [batch, rows, k] instead of codes and scales: quantize then
// fp4_dequantize without a global scale in one launch, for GEMMs that take 16-bit activations
// (fused_moe's W4A4). Gathered (src_pairs, batch 1): output row m holds the exact values of x's
// row src_pairs[m] / src_div (fused_moe's rows grouped by expert: pair index / top_k).
#include <algorithm>
#include <cstdint>

#include "fp4_numerics.cuh"
#include "capi.h"
#include "exact_values.cuh"
#include "launch.h"
#include "pdl.cuh"
#include "scale_layout.cuh"
#include "source_block.cuh"

namespace torch_fp4 {
namespace {

constexpr int kThreads = 256;

struct QuantizeParams {
  const uint8_t* x;
  const float* gs;
  int64_t gs_stride;
  uint8_t* data;
  uint8_t* scale;
  int64_t batch;
  uint32_t rows;
  uint32_t k_blocks;
  uint32_t kb_padded;
  uint32_t entries;  // rows_padded * kb_padded
  FastDivmod by_kb_padded;
  int layout;
  uint16_t* exact;   // kExact: bf16 [batch, rows, k] (data and scale unused)
  const int32_t* src_pairs;   // kExact, gathered: x's row of output row m is src_pairs[m] / src_div
  int32_t src_div;
};

template <int kWords>
__device__ __forceinline__ void store_words(uint8_t* p, const uint32_t* w) {
  if constexpr (kWords == 2) {
    *reinterpret_cast<uint2*>(p) = make_uint2(w[0], w[1]);
  } else {
    static_assert(kWords == 4, "an NVFP4 block packs to 8 bytes, an MXFP4 block to 16");
    *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

template <int kDType, bool kNvfp4, bool kVec, bool kExact = false>
__global__ void __launch_bounds__(kThreads) quantize_kernel(const QuantizeParams p) {
  constexpr int kBlock = kNvfp4 ? 16 : 32;
  constexpr int kElemBytes = SourceType<kDType>::kBytes;
  constexpr int kInWords = kBlock * kElemBytes / 4;
  constexpr int kOutWords = kBlock / 8;

  pdl_wait();  // before any global-memory access (the previous kernel's writes are visible)
  const uint32_t entry = blockIdx.x * kThreads + threadIdx.x;
  if (entry >= p.entries) return;
  uint32_t m, kb;
  p.by_kb_padded.divmod(entry, m, kb);
  const uint32_t scale_in_matrix = scale_offset(p.layout, m, kb, p.kb_padded);
  const bool in_data = m < p.rows && kb < p.k_blocks;

  for (int64_t b = blockIdx.y; b < p.batch; b += gridDim.y) {
    // the scale byte's address (no scale matrix in the exact-values mode)
    uint8_t* scale = kExact ? nullptr : p.scale + b * static_cast<int64_t>(p.entries) + scale_in_matrix;
    if (!in_data) {
      if constexpr (!kExact) *scale = 0;
      continue;
    }
    const int64_t block = (b * p.rows + m) * static_cast<int64_t>(p.k_blocks) + kb;
    int64_t src_block = block;
    if constexpr (kExact) {
      if (p.src_pairs != nullptr) src_block = static_cast<int64_t>(__ldg(p.src_pairs + m) / p.src_div) * p.k_blocks + kb;
    }

    uint32_t w[kInWords];
    load_words<kInWords, kElemBytes, kVec>(p.x + src_block * (kBlock * kElemBytes), w);
    if (b == blockIdx.y) pdl_launch_dependents();  // once, after this thread's first loads
    const float amax = __uint_as_float(block_amax_bits<kDType, kInWords>(w));

    BlockScale bs;
    if constexpr (kNvfp4) {
      const float gs = __ldg(p.gs + b * p.gs_stride);
      bs = nvfp4_block_scale(amax, gs, __frcp_rn(gs));
    } else {
      bs = mxfp4_block_scale(amax);
    }

    // Eight elements at a time: widen, scale by o (one RN multiply each), encode.
    uint32_t out[kOutWords];
    float v[8];
    if (block_products_never_nan(amax, bs.o)) {  // every MXFP4 block whose e is 253 or 254 lands here
#if !TORCH_FP4_HAS_E2M1_CVT
      // sign(x * o) = sign(x) xor sign(o) for every non-NaN product.
      const uint32_t flip = (__float_as_uint(bs.o) >> 31) * 0x88888888u;
#endif
      const float limit = kNvfp4 ? 6.0f : mxfp4_limit(bs.byte);
#pragma unroll
      for (int j = 0; j < kOutWords; ++j) {
        widen8<kDType>(w, j, v);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          v[i] = __fmul_rn(v[i], bs.o);
          if constexpr (!kNvfp4) v[i] = fminf(fmaxf(v[i], -limit), limit);  // no NaN on this path
        }
#if TORCH_FP4_HAS_E2M1_CVT
        out[j] = e2m1_encode8_hw(v);
#else
        out[j] = e2m1_magnitudes8(v) | (sign_nibbles<kDType>(w, j) ^ flip);
#endif
      }
    } else {
#pragma unroll
      for (int j = 0; j < kOutWords; ++j) {
        widen8<kDType>(w, j, v);
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = __fmul_rn(v[i], bs.o);
        out[j] = e2m1_encode8_nan_safe(v);
      }
    }
    if constexpr (kExact) {
      store_exact_values<kBlock>(p.exact + block * kBlock, out, bs.byte);
    } else {
      store_words<kOutWords>(p.data + block * (kBlock / 2), out);
      *scale = static_cast<uint8_t>(bs.byte);
    }
  }
}

template <bool kNvfp4, bool kExact = false>
void launch_quantize(const QuantizeArgs& a, cudaStream_t stream, bool pdl) {
  const int block = kNvfp4 ? 16 : 32;
  const int64_t entries = a.rows_padded * a.kb_padded;
  if (a.batch <= 0 || entries <= 0) return;

  QuantizeParams p;
  p.x = static_cast<const uint8_t*>(a.x);
  p.gs = a.gs;
  p.gs_stride = a.gs_stride;
  p.data = a.data;
  p.scale = a.scale;
  p.batch = a.batch;
  p.rows = static_cast<uint32_t>(a.rows);
  p.k_blocks = static_cast<uint32_t>(a.k / block);
  p.kb_padded = static_cast<uint32_t>(a.kb_padded);
  p.entries = static_cast<uint32_t>(entries);
  p.by_kb_padded = FastDivmod(p.kb_padded);
  p.layout = a.layout;
  p.exact = kExact ? static_cast<uint16_t*>(a.exact) : nullptr;
  p.src_pairs = kExact ? a.src_pairs : nullptr;
  p.src_div = a.src_div > 0 ? static_cast<int32_t>(a.src_div) : 1;

  const dim3 grid(static_cast<unsigned>((entries + kThreads - 1) / kThreads),
                  static_cast<unsigned>(std::min<int64_t>(a.batch, 65535)));
  const bool vec = reinterpret_cast<uintptr_t>(a.x) % 16 == 0;

#define TORCH_FP4_LAUNCH(DT)                                                                     \
  do {                                                                                           \
    if (vec)                                                                                     \
      launch_kernel(quantize_kernel<DT, kNvfp4, true, kExact>, grid, kThreads, stream, pdl, p);  \
    else                                                                                         \
      launch_kernel(quantize_kernel<DT, kNvfp4, false, kExact>, grid, kThreads, stream, pdl, p); \
  } while (0)

  switch (a.in_dtype) {
    case kBFloat16: TORCH_FP4_LAUNCH(kBFloat16); break;
    case kFloat16: TORCH_FP4_LAUNCH(kFloat16); break;
    case kFloat32: TORCH_FP4_LAUNCH(kFloat32); break;
    case kFloat8E4M3: TORCH_FP4_LAUNCH(kFloat8E4M3); break;
    default: break;
  }
#undef TORCH_FP4_LAUNCH
}

}  // namespace

void launch_nvfp4_quantize(const QuantizeArgs& args, cudaStream_t stream, bool pdl) {
  launch_quantize<true>(args, stream, pdl);
}

void launch_mxfp4_quantize(const QuantizeArgs& args, cudaStream_t stream, bool pdl) {
  launch_quantize<false>(args, stream, pdl);
}

void launch_nvfp4_exact_values(const QuantizeArgs& args, cudaStream_t stream, bool pdl) {
  launch_quantize<true, true>(args, stream, pdl);
}

void launch_mxfp4_exact_values(const QuantizeArgs& args, cudaStream_t stream, bool pdl) {
  launch_quantize<false, true>(args, stream, pdl);
}

}  // namespace torch_fp4

// C entry points (capi.h): x [batch, rows, k] -> data and scales (QuantizeArgs); gs is ignored by
// MXFP4. in_dtype: launch.h's DType.
namespace {
torch_fp4::QuantizeArgs quantize_args(const void* x, const float* gs, int64_t gs_stride, void* data, void* scale,
                                      int64_t batch, int64_t rows, int64_t k, int64_t rows_padded,
                                      int64_t kb_padded, int layout, int in_dtype) {
  torch_fp4::QuantizeArgs a{};
  a.x = x;
  a.gs = gs;
  a.gs_stride = gs_stride;
  a.data = static_cast<uint8_t*>(data);
  a.scale = static_cast<uint8_t*>(scale);
  a.batch = batch;
  a.rows = rows;
  a.k = k;
  a.rows_padded = rows_padded;
  a.kb_padded = kb_padded;
  a.layout = layout;
  a.in_dtype = in_dtype;
  return a;
}

bool known_input(int in_dtype) { return in_dtype >= torch_fp4::kBFloat16 && in_dtype <= torch_fp4::kFloat8E4M3; }

using QuantizeLauncher = void (*)(const torch_fp4::QuantizeArgs&, cudaStream_t, bool);

int quantize_entry(QuantizeLauncher launch, int device, void* stream, int pdl, const torch_fp4::QuantizeArgs& a) {
  if (const int e = torch_fp4::capi_begin(device)) return e;
  if (!known_input(a.in_dtype)) return torch_fp4::kNotCompiled;
  launch(a, static_cast<cudaStream_t>(stream), pdl != 0);
  return torch_fp4::capi_end(true);
}
}  // namespace

TORCH_FP4_CAPI int torch_fp4_nvfp4_quantize(int device, void* stream, int pdl, const void* x, const float* gs,
                                            int64_t gs_stride, void* data, void* scale, int64_t batch, int64_t rows,
                                            int64_t k, int64_t rows_padded, int64_t kb_padded, int layout,
                                            int in_dtype) {
  return quantize_entry(torch_fp4::launch_nvfp4_quantize, device, stream, pdl,
                        quantize_args(x, gs, gs_stride, data, scale, batch, rows, k, rows_padded, kb_padded, layout,
                                      in_dtype));
}

// x [batch, rows, k] -> exact [batch, rows, k] bf16: the values of its NVFP4 (block_size 16, gs
// element b * gs_stride for batch entry b) or MXFP4 (32, gs unused) quantization, dequantized
// without gs. src_pairs (batch 1; may be null): output row m from x's row src_pairs[m] / src_div.
TORCH_FP4_CAPI int torch_fp4_exact_values(int device, void* stream, int pdl, const void* x, const float* gs,
                                          int64_t gs_stride, void* exact, int64_t batch, int64_t rows, int64_t k,
                                          int in_dtype, int block_size, const int32_t* src_pairs, int64_t src_div) {
  if (block_size != 16 && block_size != 32) return torch_fp4::kNotCompiled;
  if (src_pairs != nullptr && (batch != 1 || src_div < 1)) return torch_fp4::kNotCompiled;
  torch_fp4::QuantizeArgs a = quantize_args(x, gs, gs_stride, nullptr, nullptr, batch, rows, k, rows,
                                            k / block_size, torch_fp4::kLayoutLinear, in_dtype);
  a.exact = exact;
  a.src_pairs = src_pairs;
  a.src_div = src_div;
  return quantize_entry(block_size == 16 ? torch_fp4::launch_nvfp4_exact_values : torch_fp4::launch_mxfp4_exact_values,
                        device, stream, pdl, a);
}

TORCH_FP4_CAPI int torch_fp4_mxfp4_quantize(int device, void* stream, int pdl, const void* x, const float* gs,
                                            int64_t gs_stride, void* data, void* scale, int64_t batch, int64_t rows,
                                            int64_t k, int64_t rows_padded, int64_t kb_padded, int layout,
                                            int in_dtype) {
  return quantize_entry(torch_fp4::launch_mxfp4_quantize, device, stream, pdl,
                        quantize_args(x, gs, gs_stride, data, scale, batch, rows, k, rows_padded, kb_padded, layout,
                                      in_dtype));
}
