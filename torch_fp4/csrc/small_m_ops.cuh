// Per-thread operations of the small-M FP4 GEMM (mm_small_m.cuh): the E2M1 bit placements, the
// scale table, 16-bit multiplies and roundings, each as a device instruction and as its exact host
// model (the CPU emulation of tests/test_cuda_mm_emulation.py runs the same code).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#define TORCH_FP4_HD __host__ __device__ __forceinline__
#define TORCH_FP4_DEV __device__ __forceinline__
#else
#define TORCH_FP4_HD inline
#define TORCH_FP4_DEV inline
#endif

namespace torch_fp4 {
namespace small_m {

// Output dtype codes (the values of launch.h's DType).
constexpr int kOutBf16 = 0;
constexpr int kOutF16 = 1;
constexpr int kOutF32 = 2;

struct alignas(16) U128 {
  uint32_t x, y, z, w;
};

struct alignas(16) F4 {
  float x, y, z, w;
};

// Keeps a loop-invariant value in a register: without it the compiler recomputes the per-thread
// copy plan inside the main loop to save registers the kernel does not need.
template <class T>
TORCH_FP4_HD T opaque(T v) {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(T) == 4) {
    uint32_t u;
    std::memcpy(&u, &v, 4);
    asm volatile("" : "+r"(u));
    std::memcpy(&v, &u, 4);
  }
#endif
  return v;
}

// Bytes of {b, a} selected by the four low nibbles of sel (PTX prmt without sign replication).
TORCH_FP4_HD uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(a, b, sel);
#else
  const uint64_t bytes = (uint64_t{b} << 32) | a;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) r |= static_cast<uint32_t>((bytes >> (8 * ((sel >> (4 * i)) & 7))) & 0xFF) << (8 * i);
  return r;
#endif
}

// Eight E2M1 codes (element i in nibble i) -> bf16x2 (element 0 low) pairs (0,4), (1,5), (2,6), (3,7)
// holding LUT[code] * 2^-126: magnitude bits to bits 6..8 (mantissa MSB and exponent LSBs, so the
// E = 0 code 0.5 is the subnormal 2^-127), sign to bit 15. One multiply by (2^6 + 2^12) or
// (2^2 + 2^8) makes two disjoint copies of the nibble; the mask keeps magnitude from one and the
// sign from the other.
TORCH_FP4_HD void place_bf16(uint32_t w, uint32_t (&d)[4]) {
  const uint32_t w8 = w >> 8;
  d[0] = ((w & 0x000F000Fu) * 0x1040u) & 0x81C081C0u;
  d[1] = ((w & 0x00F000F0u) * 0x0104u) & 0x81C081C0u;
  d[2] = ((w8 & 0x000F000Fu) * 0x1040u) & 0x81C081C0u;
  d[3] = ((w8 & 0x00F000F0u) * 0x0104u) & 0x81C081C0u;
}

// The same as fp16x2 holding LUT[code] * 2^-14: magnitude to bits 9..11, sign to bit 15 (the two
// shifts overlap by one bit, so magnitude and sign are masked separately).
TORCH_FP4_HD void place_f16(uint32_t w, uint32_t (&d)[4]) {
  d[0] = ((w & 0x00070007u) << 9) | ((w << 12) & 0x80008000u);
  d[1] = ((w & 0x00700070u) << 5) | ((w << 8) & 0x80008000u);
  d[2] = ((w & 0x07000700u) << 1) | ((w << 4) & 0x80008000u);
  d[3] = ((w & 0x70007000u) >> 3) | (w & 0x80008000u);
}

TORCH_FP4_HD uint32_t rotl32(uint32_t x, int s) {
#if defined(__CUDA_ARCH__)
  return __funnelshift_l(x, x, s);
#else
  return (x << s) | (x >> ((32 - s) & 31));
#endif
}

// One "sm90"-layout word -> the four A registers of a k16 step (mma.sync / wgmma fragment order:
// row r, K 2c..2c+1; row r + 8; row r, K 2c+8..2c+9; row r + 8) as bf16x2 words holding
// LUT[code] * 2^-126, the placement of place_bf16: reg 0 = the word's bits at their final places,
// reg 1 = the word rotated left by 13, reg 2 = its bits 0, 3-5 (16, 19-21) copied 3 and 15 places
// up, reg 3 = its bits 12-14, 17 (28-30, 1) rotated right by 6 and copied 0 and 4 places up; each
// masked to the two codes' magnitude and sign bits (docs/NUMERICS.md 4b gives the layout,
// formats.to_weight_layout writes it). The products never carry into a kept bit.
TORCH_FP4_HD void place_sm90_bf16(uint32_t x, uint32_t (&a)[4]) {
  constexpr uint32_t kKeep = 0x81C081C0u;
  a[0] = x & kKeep;
  a[1] = rotl32(x, 13) & kKeep;
  a[2] = ((x & 0x00390039u) * 0x8008u) & kKeep;
  a[3] = ((rotl32(x, 26) & 0x09C009C0u) * 17u) & kKeep;
}

// The same as fp16x2 holding LUT[code] * 2^-14 (place_f16's placement: magnitude 3 places up).
TORCH_FP4_HD void place_sm90_f16(uint32_t x, uint32_t (&a)[4]) {
  place_sm90_bf16(x, a);
#pragma unroll
  for (int e = 0; e < 4; ++e) a[e] = ((a[e] & 0x01C001C0u) << 3) | (a[e] & 0x80008000u);
}

// An activation unit x0..x7 (four bf16x2/fp16x2 words) -> (x0,x4), (x1,x5), (x2,x6), (x3,x7).
TORCH_FP4_HD U128 pair_for_decode(U128 x) {
  return U128{prmt(x.x, x.z, 0x5410u), prmt(x.x, x.z, 0x7632u), prmt(x.y, x.w, 0x5410u),
              prmt(x.y, x.w, 0x7632u)};
}

// ---- host models of the 16-bit formats (the emulator's arithmetic) -----------------------------
TORCH_FP4_HD float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TORCH_FP4_HD uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// fp32 -> bf16, round to nearest even (NaN kept quiet).
TORCH_FP4_HD uint32_t host_f32_to_bf16(float f) {
  const uint32_t u = float_to_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return ((u >> 16) | 0x40u) & 0xFFFFu;
  return ((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16) & 0xFFFFu;
}

TORCH_FP4_HD float host_bf16_to_f32(uint32_t h) { return bits_to_float((h & 0xFFFFu) << 16); }

TORCH_FP4_HD float host_f16_to_f32(uint32_t h) {
  const uint32_t s = (h >> 15) & 1u, e = (h >> 10) & 31u, m = h & 1023u;
  float v;
  if (e == 0) {
    v = static_cast<float>(m) * (1.0f / 16777216.0f);  // m * 2^-24, exact
  } else if (e == 31) {
    v = m ? bits_to_float(0x7FC00000u) : bits_to_float(0x7F800000u);
  } else {
    v = bits_to_float(((e + 112u) << 23) | (m << 13));
  }
  return s ? -v : v;
}

// fp32 -> fp16, round to nearest even, overflow to Inf, subnormals kept.
TORCH_FP4_HD uint32_t host_f32_to_f16(float f) {
  const uint32_t u = float_to_bits(f);
  const uint32_t s = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return s | 0x7E00u;
  if (a >= 0x477FF000u) return s | 0x7C00u;  // >= 65520 rounds to Inf
  if (a < 0x38800000u) {                     // below 2^-14: subnormal result, units of 2^-24
    const uint32_t e = a >> 23;
    if (e < 102) return s;                   // below 2^-25: rounds to zero
    const uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126 - e;          // value = m * 2^(e - 150), result units 2^-24
    const uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
    const uint32_t r = q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
    return s | r;
  }
  const uint32_t r = a - 0x38000000u;        // rebias exponent 127 -> 15 (bits 13.. of fp16 << 13)
  const uint32_t q = r >> 13, rem = r & 0x1FFFu;
  return s | (q + ((rem > 0x1000u || (rem == 0x1000u && (q & 1u))) ? 1u : 0u));
}

// d = a * b per 16-bit half (bf16 or fp16), round to nearest even; a * b + (-0), as the device's
// fma.rn with a negative-zero addend.
template <bool kFp16>
TORCH_FP4_HD uint32_t mul2(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  if constexpr (kFp16) {
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
  } else {
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
  }
  return d;
#else
  uint32_t d = 0;
  for (int h = 0; h < 2; ++h) {
    const uint32_t x = (a >> (16 * h)) & 0xFFFFu, y = (b >> (16 * h)) & 0xFFFFu;
    // Both formats' products of our operands are exact in fp32 (at most 22 significant bits, and
    // fp32 spans both ranges), so the only rounding is the final one.
    if constexpr (kFp16) {
      d |= host_f32_to_f16(host_f16_to_f32(x) * host_f16_to_f32(y)) << (16 * h);
    } else {
      d |= host_f32_to_bf16(host_bf16_to_f32(x) * host_bf16_to_f32(y)) << (16 * h);
    }
  }
  return d;
#endif
}

// Scale byte -> the 16-bit multiplier of the decoded codes, twice (a bf16x2 / fp16x2 word). Exact.
// NVFP4 (e4m3; 0x7F/0xFF NaN): scale * 2^119 as bf16 (codes placed as LUT * 2^-126) or
// scale * 2^7 as fp16 (codes placed as LUT * 2^-14), so that the product is code * scale * 2^-7.
// MXFP4 (UE8M0; 0 is 2^-127, 255 NaN): scale as bf16.
template <class Cfg>
TORCH_FP4_HD uint32_t scale_table_entry(uint32_t byte) {
  uint32_t h;
  if constexpr (Cfg::kMx) {
    h = byte == 0 ? 0x0040u : (byte == 255 ? 0x7FC0u : byte << 7);
  } else {
    const uint32_t s = (byte >> 7) << 15, e = (byte >> 3) & 15u, m = byte & 7u;
    const bool fp16 = Cfg::kFp16;
    // Biased exponent of 2^(e - 7) (normal) in the target format, the 2^7 / 2^119 fold included.
    const uint32_t bias = fp16 ? 8u + 7u : 120u + 119u;
    if (e == 15 && m == 7) {
      h = fp16 ? 0x7E00u : 0x7FC0u;
    } else if (e != 0) {
      h = s | (fp16 ? ((e + bias) << 10) | (m << 7) : ((e + bias) << 7) | (m << 4));
    } else if (m == 0) {
      h = s;
    } else {  // subnormal e4m3 m * 2^-9 = 2^(p - 9) * (m / 2^p), p = floor(log2 m): normal here,
      // with the exponent of 2^(p - 9) = 2^(e - 7) for e = p - 2
      const uint32_t p = m >= 4 ? 2 : (m >= 2 ? 1 : 0);
      const uint32_t frac = m - (1u << p);
      h = s | (fp16 ? ((bias - 2u + p) << 10) | (frac << (10 - p)) : ((bias - 2u + p) << 7) | (frac << (7 - p)));
    }
  }
  return h | (h << 16);
}

// A placed code pair (place_bf16 / place_f16 / place_sm90_*) times its scale-table entry: code *
// scale * 2^-7 for NVFP4 (folded table), code * scale for MXFP4 (times 2^126 (2^14) first). Exact.
template <class Cfg>
TORCH_FP4_HD uint32_t apply_scale(uint32_t placed, uint32_t entry) {
  constexpr uint32_t kUnit = Cfg::kFp16 ? 0x74007400u : 0x7E807E80u;  // 2^14 (fp16) / 2^126 (bf16)
  return Cfg::kFold ? mul2<Cfg::kFp16>(placed, entry) : mul2<Cfg::kFp16>(mul2<Cfg::kFp16>(placed, kUnit), entry);
}

// Word j (0..3) of a 16-byte vector (j a compile-time constant after unrolling).
TORCH_FP4_HD uint32_t word_of(const U128& v, int j) { return j == 0 ? v.x : (j == 1 ? v.y : (j == 2 ? v.z : v.w)); }

// fp32 -> output element bits (RN).
template <int kOut>
TORCH_FP4_HD uint32_t round_out(float v) {
#if defined(__CUDA_ARCH__)
  if constexpr (kOut == kOutBf16) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(v));
  } else {
    return __half_as_ushort(__float2half_rn(v));
  }
#else
  return kOut == kOutBf16 ? host_f32_to_bf16(v) : host_f32_to_f16(v);
#endif
}

// Separately rounded fp32 operations (never contracted into an FMA).
TORCH_FP4_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

TORCH_FP4_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

TORCH_FP4_HD float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// e^x as PyTorch's CUDA kernels and libdevice compute it (expf, no fast math); the host model is
// the C library's expf, which need not agree in the last place.
TORCH_FP4_HD float exp_f32(float x) {
#if defined(__CUDA_ARCH__)
  return expf(x);
#else
  return std::exp(x);
#endif
}

// SwiGLU of one output element from its fp32 gate and up sums (alpha applied): RN_bf16 of both
// (FC1's bf16 h), then silu(gate) * up in fp32 (spec section 6; store_out rounds it).
TORCH_FP4_HD float swiglu_of(float gate, float up) {
  const float g = host_bf16_to_f32(round_out<kOutBf16>(gate)), u = host_bf16_to_f32(round_out<kOutBf16>(up));
  return mul_rn(div_rn(g, add_rn(1.0f, exp_f32(-g))), u);
}

// gpt-oss's clamped SwiGLU of one output element (spec section 6): gate and up rounded to bf16
// (FC1's h), g = min(gate, L), u = clamp(up, -L, L) (NaN stays NaN), (u + 1) * (g * s) with
// s = 1 / (1 + exp(-(alpha * g))), each fp32 operation rounded in this order (store_out rounds it).
TORCH_FP4_HD float clamped_swiglu_of(float gate, float up, float alpha, float limit) {
  float g = host_bf16_to_f32(round_out<kOutBf16>(gate)), u = host_bf16_to_f32(round_out<kOutBf16>(up));
  g = g > limit ? limit : g;
  u = u < -limit ? -limit : (u > limit ? limit : u);
  const float s = div_rn(1.0f, add_rn(1.0f, exp_f32(-mul_rn(alpha, g))));
  return mul_rn(add_rn(u, 1.0f), mul_rn(g, s));
}

TORCH_FP4_HD float load_alpha(const float* p) {
#if defined(__CUDA_ARCH__)
  return __ldg(p);
#else
  return *p;
#endif
}

}  // namespace small_m
}  // namespace torch_fp4
