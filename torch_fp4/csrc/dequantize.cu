// FP4 dequantization kernel (spec sections 2-4) on raw pointers.
//
// out = RN_out(RN(RN(LUT(q) * scale) * RN(1/gs))), the last multiply only with a global scale.
// One thread per 16 elements (two packed words) for bf16/fp16 results and per 8 elements (one
// word) for fp32, always inside one scale block, so each thread writes 32 contiguous bytes and
// loads one scale byte; blockIdx.y strides over the batch.
#include <algorithm>
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "fp4_numerics.cuh"
#include "capi.h"
#include "launch.h"
#include "pdl.cuh"
#include "scale_layout.cuh"
#include "source_block.cuh"

namespace torch_fp4 {
namespace {

constexpr int kThreads = 256;

struct DequantizeParams {
  const uint8_t* data;
  const uint8_t* scale;
  const float* gs;
  int64_t gs_stride;
  uint8_t* out;
  int64_t batch;
  uint32_t kb_padded;
  uint32_t units;           // threads per matrix: rows * k / (8 * words per thread)
  uint32_t scale_entries;   // rows_padded * kb_padded
  FastDivmod by_units_per_row;
  int layout;
};

// kWords packed words at p: one 4- or 8-byte load when aligned, else byte loads.
template <int kWords, bool kVec>
__device__ __forceinline__ void load_packed(const uint8_t* p, uint32_t* w) {
  if constexpr (kVec && kWords == 2) {
    const uint2 u = __ldg(reinterpret_cast<const uint2*>(p));
    w[0] = u.x;
    w[1] = u.y;
  } else if constexpr (kVec) {
    w[0] = __ldg(reinterpret_cast<const uint32_t*>(p));
  } else {
    load_words<kWords, 1, false>(p, w);
  }
}

template <int kOutDType>
constexpr int words_per_thread() {
  return kOutDType == kFloat32 ? 1 : 2;
}

template <int kOutDType, bool kNvfp4, bool kVec>
__global__ void __launch_bounds__(kThreads) dequantize_kernel(const DequantizeParams p) {
  constexpr int kWords = words_per_thread<kOutDType>();
  constexpr int kCount = 8 * kWords;
  constexpr uint32_t kUnitsPerBlock = (kNvfp4 ? 2 : 4) / kWords;
  constexpr int kOutBytes = kOutDType == kFloat32 ? 4 : 2;

  pdl_wait();  // before any global-memory access (the previous kernel's writes are visible)
  const uint32_t index = blockIdx.x * kThreads + threadIdx.x;
  if (index >= p.units) return;
  uint32_t m, unit_in_row;
  p.by_units_per_row.divmod(index, m, unit_in_row);
  const uint32_t scale_in_matrix = scale_offset(p.layout, m, unit_in_row / kUnitsPerBlock, p.kb_padded);

  for (int64_t b = blockIdx.y; b < p.batch; b += gridDim.y) {
    const uint32_t byte = __ldg(p.scale + b * static_cast<int64_t>(p.scale_entries) + scale_in_matrix);
    const float sf = kNvfp4 ? e4m3_to_float(byte) : ue8m0_to_float(byte);
    // The decoded values carry a factor 2^-6; folding 2^6 into the scale keeps each product
    // LUT * scale exact, so its rounding is the reference's. Scales whose 2^6 multiple overflows
    // (UE8M0 bytes 249..254) multiply by 2^6 first instead.
    const float sf64 = __fmul_rn(sf, 64.0f);
    const bool fold = (__float_as_uint(sf64) & 0x7FFFFFFFu) != 0x7F800000u;
    const int64_t unit = b * static_cast<int64_t>(p.units) + index;

    uint32_t w[kWords];
    load_packed<kWords, kVec>(p.data + unit * (4 * kWords), w);
    if (b == blockIdx.y) pdl_launch_dependents();  // once, after this thread's first loads
    float v[kCount];
#pragma unroll
    for (int j = 0; j < kWords; ++j) e2m1_decode8_scaled(w[j], v + 8 * j);
    if (fold) {
#pragma unroll
      for (int i = 0; i < kCount; ++i) v[i] = __fmul_rn(v[i], sf64);
    } else {
#pragma unroll
      for (int i = 0; i < kCount; ++i) v[i] = __fmul_rn(__fmul_rn(v[i], 64.0f), sf);
    }
    if (p.gs != nullptr) {
      const float rgs = __frcp_rn(__ldg(p.gs + b * p.gs_stride));
#pragma unroll
      for (int i = 0; i < kCount; ++i) v[i] = __fmul_rn(v[i], rgs);
    }
    store_values<kOutDType, kCount>(p.out + unit * (kCount * kOutBytes), v);
  }
}

template <int kOutDType, bool kNvfp4>
void launch_typed(const DequantizeArgs& a, cudaStream_t stream, bool pdl) {
  const int64_t units_per_row = a.k / (8 * words_per_thread<kOutDType>());
  const int64_t units = a.rows * units_per_row;
  if (a.batch <= 0 || units <= 0) return;

  DequantizeParams p;
  p.data = a.data;
  p.scale = a.scale;
  p.gs = a.gs;
  p.gs_stride = a.gs_stride;
  p.out = static_cast<uint8_t*>(a.out);
  p.batch = a.batch;
  p.kb_padded = static_cast<uint32_t>(a.kb_padded);
  p.units = static_cast<uint32_t>(units);
  p.scale_entries = static_cast<uint32_t>(a.rows_padded * a.kb_padded);
  p.by_units_per_row = FastDivmod(static_cast<uint32_t>(units_per_row));
  p.layout = a.layout;

  const dim3 grid(static_cast<unsigned>((units + kThreads - 1) / kThreads),
                  static_cast<unsigned>(std::min<int64_t>(a.batch, 65535)));
  if (reinterpret_cast<uintptr_t>(a.data) % (4 * words_per_thread<kOutDType>()) == 0) {
    launch_kernel(dequantize_kernel<kOutDType, kNvfp4, true>, grid, kThreads, stream, pdl, p);
  } else {
    launch_kernel(dequantize_kernel<kOutDType, kNvfp4, false>, grid, kThreads, stream, pdl, p);
  }
}

template <bool kNvfp4>
void launch(const DequantizeArgs& a, cudaStream_t stream, bool pdl) {
  switch (a.out_dtype) {
    case kBFloat16: launch_typed<kBFloat16, kNvfp4>(a, stream, pdl); break;
    case kFloat16: launch_typed<kFloat16, kNvfp4>(a, stream, pdl); break;
    case kFloat32: launch_typed<kFloat32, kNvfp4>(a, stream, pdl); break;
    default: break;
  }
}

}  // namespace

void launch_dequantize(const DequantizeArgs& args, int block_size, cudaStream_t stream, bool pdl) {
  if (block_size == 16) {
    launch<true>(args, stream, pdl);
  } else {
    launch<false>(args, stream, pdl);
  }
}

}  // namespace torch_fp4

// C entry point (capi.h): data [batch, rows, k/2] + scales -> out [batch, rows, k] (DequantizeArgs);
// gs may be null; block_size 16 (NVFP4) or 32 (MXFP4); out_dtype: launch.h's DType.
TORCH_FP4_CAPI int torch_fp4_dequantize(int device, void* stream, int pdl, const void* data, const void* scale,
                                        const float* gs, int64_t gs_stride, void* out, int64_t batch, int64_t rows,
                                        int64_t k, int64_t rows_padded, int64_t kb_padded, int layout,
                                        int out_dtype, int block_size) {
  if (const int e = torch_fp4::capi_begin(device)) return e;
  if ((block_size != 16 && block_size != 32) || out_dtype < torch_fp4::kBFloat16 || out_dtype > torch_fp4::kFloat32)
    return torch_fp4::kNotCompiled;
  torch_fp4::DequantizeArgs a{};
  a.data = static_cast<const uint8_t*>(data);
  a.scale = static_cast<const uint8_t*>(scale);
  a.gs = gs;
  a.gs_stride = gs_stride;
  a.out = out;
  a.batch = batch;
  a.rows = rows;
  a.k = k;
  a.rows_padded = rows_padded;
  a.kb_padded = kb_padded;
  a.layout = layout;
  a.out_dtype = out_dtype;
  torch_fp4::launch_dequantize(a, block_size, static_cast<cudaStream_t>(stream), pdl != 0);
  return torch_fp4::capi_end(true);
}
