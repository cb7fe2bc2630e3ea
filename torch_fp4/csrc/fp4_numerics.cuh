// Device functions for the FP4 numerics contract (spec sections 1-3): E2M1 encode/decode, the
// e4m3 and UE8M0 scale encodings, and the NVFP4/MXFP4 block-scale rules. Every function rounds
// exactly as torch_fp4/formats.py does: each fp32 operation is a separately rounded RN operation
// (__fmul_rn / __fmaf_rn / __frcp_rn), so no contraction or approximate reciprocal changes a bit.
#pragma once

#include <cstdint>

#include <cuda_fp16.h>
#include <cuda_fp8.h>

// cvt.rn.satfinite.e2m1x2.f32 exists on the sm_100-family and later arch/family-specific targets.
#if defined(__CUDA_ARCH_FAMILY_SPECIFIC__) && (__CUDA_ARCH_FAMILY_SPECIFIC__ >= 1000)
#define TORCH_FP4_HAS_E2M1_CVT 1
#else
#define TORCH_FP4_HAS_E2M1_CVT 0
#endif

namespace torch_fp4 {

constexpr uint32_t kR6Bits = 0x3E2AAAABu;     // RN(1/6)
constexpr uint32_t kMagicBits = 0x4B000000u;  // 2^23: fp32 values in [2^23, 2^24) step by 1
constexpr float kMagic = 8388608.0f;          // 2^23

// ---------------------------------------------------------------------------------------------
// Saturating fp32 operations (.sat clamps to [0, 1]; NaN gives +0).
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ float mul_sat(float a, float b) {
  float d;
  asm("mul.rn.sat.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
  return d;
}

__device__ __forceinline__ float fma_sat(float a, float b, float c) {
  float d;
  asm("fma.rn.sat.f32 %0, %1, %2, %3;" : "=f"(d) : "f"(a), "f"(b), "f"(c));
  return d;
}

__device__ __forceinline__ bool is_nan_bits(uint32_t bits) { return (bits & 0x7FFFFFFFu) > 0x7F800000u; }

// ---------------------------------------------------------------------------------------------
// E2M1 encode (spec section 1)
// ---------------------------------------------------------------------------------------------
// 2^23 + the magnitude code of |v| for non-NaN v, as one fp32 value. With m = |v|:
//   code = RN(2*min(m, 2)) + RN(clamp(m - 2, 0, 2) + clamp((m - 4) / 2, 0, 1))
// (codes 0..4 cover m <= 2; above 2 the second term steps at m > 2.5, m >= 3.5 and m > 5).
// s1 = sat(m/2), s2 = sat(m/2 - 1), s3 = sat(m/2 - 2) are exact where not clamped; 2*s2 + s3 is
// exact (s3 > 0 only where s2 == 1); adding 2^23 rounds it to an integer with ties to even
// (2^23 is even); the last FMA adds 4*s1, which rounds (against the even 2^23) only where
// s2 == s3 == 0 and is exactly 4 elsewhere. Inf gives 7; NaN gives 0 (callers handle NaN).
__device__ __forceinline__ float e2m1_magnitude_biased(float v) {
  const float m = fabsf(v);
  const float s1 = mul_sat(m, 0.5f);
  const float s2 = fma_sat(m, 0.5f, -1.0f);
  const float s3 = fma_sat(m, 0.5f, -2.0f);
  const float y = __fadd_rn(__fmaf_rn(s2, 2.0f, s3), kMagic);
  return __fmaf_rn(s1, 4.0f, y);
}

// Eight non-NaN values -> their magnitude codes packed in a word (element i in bits 4i..4i+2;
// the sign bits 4i+3 are left clear for the caller).
__device__ __forceinline__ uint32_t e2m1_magnitudes8(const float* v) {
  uint32_t word = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) word += __float_as_uint(e2m1_magnitude_biased(v[i])) << (4 * i);
  // Each term carried 2^23's pattern (0x4B000000) shifted left by 4i; only the shifts 0 and 4
  // leave bits inside 32 bits (modulo 2^32), and both are removed here.
  return word - (kMagicBits + (kMagicBits << 4));
}

// Eight values of any kind -> packed E2M1 codes: sign kept on zero and Inf, NaN -> 0x7.
__device__ __forceinline__ uint32_t e2m1_encode8_nan_safe(const float* v) {
  uint32_t word = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t bits = __float_as_uint(v[i]);
    uint32_t code = (__float_as_uint(e2m1_magnitude_biased(v[i])) - kMagicBits) | ((bits >> 28) & 8u);
    if (is_nan_bits(bits)) code = 7u;
    word |= code << (4 * i);
  }
  return word;
}

#if TORCH_FP4_HAS_E2M1_CVT
// The hardware conversion (RN, saturating to +-6, sign kept on zero). cvt's first source goes to
// the high nibble, so each pair is given as (odd, even).
__device__ __forceinline__ uint32_t e2m1_encode8_hw(const float* v) {
  uint32_t word;
  asm("{\n"
      ".reg .b8 b0, b1, b2, b3;\n"
      "cvt.rn.satfinite.e2m1x2.f32 b0, %2, %1;\n"
      "cvt.rn.satfinite.e2m1x2.f32 b1, %4, %3;\n"
      "cvt.rn.satfinite.e2m1x2.f32 b2, %6, %5;\n"
      "cvt.rn.satfinite.e2m1x2.f32 b3, %8, %7;\n"
      "mov.b32 %0, {b0, b1, b2, b3};\n"
      "}"
      : "=r"(word)
      : "f"(v[0]), "f"(v[1]), "f"(v[2]), "f"(v[3]), "f"(v[4]), "f"(v[5]), "f"(v[6]), "f"(v[7]));
  return word;
}
#endif

// ---------------------------------------------------------------------------------------------
// E2M1 decode
// ---------------------------------------------------------------------------------------------
// A code's magnitude bits placed at bits 2..4 of an e4m3 byte (sign at bit 7) form the e4m3 value
// LUT[c] * 2^-6 exactly (both formats have an implicit leading 1 for a nonzero exponent field and
// subnormals at exponent field 0; their exponent biases, 1 and 7, differ by 6). So eight packed codes become eight e4m3
// bytes with a few bit operations, and the hardware e4m3x2 -> f16x2 conversion widens them.
// Results: v[i] = +-LUT[code i] * 2^-6 (exact), element i from bits 4i..4i+3 of w.
__device__ __forceinline__ void e2m1_decode8_scaled(uint32_t w, float* v) {
  const uint32_t even = ((w << 2) & 0x1C1C1C1Cu) | ((w << 4) & 0x80808080u);  // codes 0, 2, 4, 6
  const uint32_t odd = ((w >> 2) & 0x1C1C1C1Cu) | (w & 0x80808080u);          // codes 1, 3, 5, 7
  const uint32_t lo = __byte_perm(even, odd, 0x5140);                          // codes 0..3
  const uint32_t hi = __byte_perm(even, odd, 0x7362);                          // codes 4..7
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t pair = ((i < 2 ? lo : hi) >> (16 * (i % 2))) & 0xFFFFu;
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair), __NV_E4M3);
    v[2 * i] = __half2float(__ushort_as_half(h.x));
    v[2 * i + 1] = __half2float(__ushort_as_half(h.y));
  }
}

// ---------------------------------------------------------------------------------------------
// e4m3 (NVFP4 block scale)
// ---------------------------------------------------------------------------------------------
// RNE; |s| > 448 and +-Inf saturate to +-448; NaN (any sign or payload) -> 0x7F.
__device__ __forceinline__ uint32_t e4m3_encode_satfinite(float s) {
  const uint32_t b = static_cast<uint32_t>(__nv_cvt_float_to_fp8(s, __NV_SATFINITE, __NV_E4M3));
  return is_nan_bits(__float_as_uint(s)) ? 0x7Fu : b;
}

__device__ __forceinline__ float e4m3_to_float(uint32_t byte) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(byte), __NV_E4M3);
  return __half2float(__half(h));
}

// ---------------------------------------------------------------------------------------------
// UE8M0 (MXFP4 block scale)
// ---------------------------------------------------------------------------------------------
// Non-negative v -> exponent byte of v rounded up to a power of two (formats.ue8m0_ceil).
__device__ __forceinline__ uint32_t ue8m0_ceil(float v) {
  const uint32_t bits = __float_as_uint(v) & 0x7FFFFFFFu;
  const uint32_t exp = bits >> 23;
  uint32_t e = min(exp + ((bits & 0x7FFFFFu) != 0u ? 1u : 0u), 254u);
  if (exp == 0u) e = bits > 0x00400000u ? 1u : 0u;
  if (bits > 0x7F800000u) e = 255u;
  return e;
}

// 2^(127 - e) for e in [1, 255], exact (subnormal for e >= 254).
__device__ __forceinline__ float ue8m0_reciprocal(uint32_t e) {
  return __uint_as_float(e <= 253u ? (254u - e) << 23 : 1u << (276u - e));
}

// 2^(e - 127); 0 -> 2^-127, 255 -> NaN.
__device__ __forceinline__ float ue8m0_to_float(uint32_t e) {
  const uint32_t bits = e == 0u ? 0x00400000u : (e == 255u ? 0x7FC00000u : e << 23);
  return __uint_as_float(bits);
}

// ---------------------------------------------------------------------------------------------
// Block-scale rules: block amax -> (scale byte, multiplier o)
// ---------------------------------------------------------------------------------------------
struct BlockScale {
  uint32_t byte;
  float o;
};

// NVFP4: S = RN(gs * RN(amax * R6)); s8 = e4m3(S); o = 0 if float(s8) == 0 else
// RN(1 / RN(float(s8) * rgs)) with rgs = RN(1 / gs).
__device__ __forceinline__ BlockScale nvfp4_block_scale(float amax, float gs, float rgs) {
  const float s = __fmul_rn(gs, __fmul_rn(amax, __uint_as_float(kR6Bits)));
  const uint32_t s8 = e4m3_encode_satfinite(s);
  const float sf = e4m3_to_float(s8);
  const float o = sf == 0.0f ? 0.0f : __frcp_rn(__fmul_rn(sf, rgs));
  return {s8, o};
}

// MXFP4: e = ue8m0_ceil(RN(amax * R6)); o = 0 if amax == 0, 1 if e == 0, else 2^(127 - e).
__device__ __forceinline__ BlockScale mxfp4_block_scale(float amax) {
  const uint32_t e = ue8m0_ceil(__fmul_rn(amax, __uint_as_float(kR6Bits)));
  const float o = amax == 0.0f ? 0.0f : (e == 0u ? 1.0f : ue8m0_reciprocal(e));
  return {e, o};
}

// formats.mxfp4_limit: the largest E2M1 magnitude whose product with 2^(e - 127) is finite in
// fp32 (3 for e = 253, 1.5 for e = 254, else 6); x * o is clamped to it before encoding.
__device__ __forceinline__ float mxfp4_limit(uint32_t e) { return e == 253u ? 3.0f : (e == 254u ? 1.5f : 6.0f); }

// True when x * o is NaN for no non-NaN x of a block whose amax is `amax`: the encoder may then
// skip the NaN check (NaN arises from a NaN element, 0 * Inf, or a NaN o).
__device__ __forceinline__ bool block_products_never_nan(float amax, float o) {
  const uint32_t ob = __float_as_uint(o) & 0x7FFFFFFFu;
  const uint32_t ab = __float_as_uint(amax);  // amax >= 0 or NaN
  return (ab < 0x7F800000u && ob < 0x7F800000u) || (ab == 0x7F800000u && ob != 0u && ob < 0x7F800000u);
}

}  // namespace torch_fp4
