// The exact values of a quantization block: code * block scale (e4m3 for NVFP4, 2^(e - 127) for
// MXFP4) as bf16, exact, as dequantize.cu forms them without a global scale. fused_moe's W4A4
// hands its 16-bit GEMMs these values instead of codes and scales (quantize.cu's exact-values
// mode, moe_swiglu.cu).
#pragma once

#include <cstdint>

#include "fp4_numerics.cuh"
#include "source_block.cuh"

namespace torch_fp4 {

// A block's 16 or 32 codes (packed, element i in bits 4i..4i+3 of word i / 8) and scale byte ->
// its values as bf16 at dst. The decoded codes carry 2^-6, folded into the scale unless that
// overflows (UE8M0 bytes 249..254: times 2^6 first).
template <int kBlock>
__device__ __forceinline__ void store_exact_values(uint16_t* dst, const uint32_t* codes, uint32_t scale_byte) {
  const float sf = kBlock == 16 ? e4m3_to_float(scale_byte) : ue8m0_to_float(scale_byte);
  const float sf64 = __fmul_rn(sf, 64.0f);
  const bool fold = (__float_as_uint(sf64) & 0x7FFFFFFFu) != 0x7F800000u;
  float v[kBlock];
#pragma unroll
  for (int j = 0; j < kBlock / 8; ++j) e2m1_decode8_scaled(codes[j], v + 8 * j);   // +-LUT * 2^-6, exact
#pragma unroll
  for (int i = 0; i < kBlock; ++i) v[i] = fold ? __fmul_rn(v[i], sf64) : __fmul_rn(__fmul_rn(v[i], 64.0f), sf);
  store_values<kBFloat16, kBlock>(reinterpret_cast<uint8_t*>(dst), v);
}

// The exact values of one block of fp32 values v (16: NVFP4 with global scale gs; 32: MXFP4),
// quantized by the rules of quantize.cu (NaN blocks all NaN, MXFP4 clamped to mxfp4_limit).
template <int kBlock>
__device__ __forceinline__ void quantize_exact_block(uint16_t* dst, const float* v, float gs) {
  uint32_t amax_bits = 0;
#pragma unroll
  for (int i = 0; i < kBlock; ++i) amax_bits = max(amax_bits, __float_as_uint(v[i]) & 0x7FFFFFFFu);
  const float amax = __uint_as_float(amax_bits);   // NaN patterns exceed Inf's: a NaN makes it NaN
  const BlockScale bs = kBlock == 16 ? nvfp4_block_scale(amax, gs, __frcp_rn(gs)) : mxfp4_block_scale(amax);
  const bool clamp = kBlock == 32 && block_products_never_nan(amax, bs.o);
  const float limit = mxfp4_limit(bs.byte);
  uint32_t codes[kBlock / 8];
#pragma unroll
  for (int j = 0; j < kBlock / 8; ++j) {
    float w[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      w[i] = __fmul_rn(v[8 * j + i], bs.o);
      if (clamp) w[i] = fminf(fmaxf(w[i], -limit), limit);
    }
    codes[j] = e2m1_encode8_nan_safe(w);
  }
  store_exact_values<kBlock>(dst, codes, bs.byte);
}

}  // namespace torch_fp4
