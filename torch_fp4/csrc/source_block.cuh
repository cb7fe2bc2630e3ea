// One quantization block of a source tensor: raw words (16-byte loads when aligned), the block's
// absolute maximum with NaN propagation, exact fp32 values, and the sign bits of its elements;
// and the way back, a block of fp32 values stored rounded to an output type (store_values).
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "launch.h"

namespace torch_fp4 {

template <int kDType>
struct SourceType;
template <>
struct SourceType<kBFloat16> { static constexpr int kBytes = 2; };
template <>
struct SourceType<kFloat16> { static constexpr int kBytes = 2; };
template <>
struct SourceType<kFloat32> { static constexpr int kBytes = 4; };
template <>
struct SourceType<kFloat8E4M3> { static constexpr int kBytes = 1; };

// kWords 32-bit words starting at p. kVec: p is 16-byte aligned and kWords a multiple of 4, so
// the words come in 16-byte loads; otherwise p is only aligned to kElemBytes.
template <int kWords, int kElemBytes, bool kVec>
__device__ __forceinline__ void load_words(const uint8_t* p, uint32_t* w) {
  if constexpr (kVec) {
    static_assert(kWords % 4 == 0, "16-byte loads need whole uint4s");
    const uint4* q = reinterpret_cast<const uint4*>(p);
#pragma unroll
    for (int i = 0; i < kWords / 4; ++i) {
      const uint4 u = __ldg(q + i);
      w[4 * i + 0] = u.x;
      w[4 * i + 1] = u.y;
      w[4 * i + 2] = u.z;
      w[4 * i + 3] = u.w;
    }
  } else if constexpr (kElemBytes == 4) {
#pragma unroll
    for (int i = 0; i < kWords; ++i) w[i] = __ldg(reinterpret_cast<const uint32_t*>(p) + i);
  } else if constexpr (kElemBytes == 2) {
    const uint16_t* q = reinterpret_cast<const uint16_t*>(p);
#pragma unroll
    for (int i = 0; i < kWords; ++i) {
      w[i] = static_cast<uint32_t>(__ldg(q + 2 * i)) | (static_cast<uint32_t>(__ldg(q + 2 * i + 1)) << 16);
    }
  } else {
#pragma unroll
    for (int i = 0; i < kWords; ++i) {
      uint32_t x = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) x |= static_cast<uint32_t>(__ldg(p + 4 * i + j)) << (8 * j);
      w[i] = x;
    }
  }
}

__device__ __forceinline__ float half_bits_to_float(uint32_t bits16) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits16)));
}

// The fp32 bit pattern of max |x| over kWords words of kDType elements, computed on the source's
// own absolute-value bit patterns (they order like the magnitudes, and every NaN pattern lies
// above Inf's, so a NaN element makes the result a NaN pattern).
template <int kDType, int kWords>
__device__ __forceinline__ uint32_t block_amax_bits(const uint32_t* w) {
  uint32_t acc = 0;
  if constexpr (kDType == kFloat32) {
#pragma unroll
    for (int i = 0; i < kWords; ++i) acc = max(acc, w[i] & 0x7FFFFFFFu);
    return acc;
  } else if constexpr (kDType == kBFloat16 || kDType == kFloat16) {
#pragma unroll
    for (int i = 0; i < kWords; ++i) acc = __vmaxu2(acc, w[i] & 0x7FFF7FFFu);
    const uint32_t top = max(acc & 0xFFFFu, acc >> 16);
    return kDType == kBFloat16 ? top << 16 : __float_as_uint(half_bits_to_float(top));
  } else {
#pragma unroll
    for (int i = 0; i < kWords; ++i) acc = __vmaxu4(acc, w[i] & 0x7F7F7F7Fu);
    const uint32_t top = max(max(acc & 0xFFu, (acc >> 8) & 0xFFu), max((acc >> 16) & 0xFFu, acc >> 24));
    const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(top), __NV_E4M3);
    return __float_as_uint(half_bits_to_float(h.x));
  }
}

// Elements 8g..8g+7 of the words as fp32 values (exact).
template <int kDType>
__device__ __forceinline__ void widen8(const uint32_t* w, int g, float* v) {
  if constexpr (kDType == kFloat32) {
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = __uint_as_float(w[8 * g + i]);
  } else if constexpr (kDType == kBFloat16) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[2 * i] = __uint_as_float(w[4 * g + i] << 16);
      v[2 * i + 1] = __uint_as_float(w[4 * g + i] & 0xFFFF0000u);
    }
  } else if constexpr (kDType == kFloat16) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[2 * i] = half_bits_to_float(w[4 * g + i] & 0xFFFFu);
      v[2 * i + 1] = half_bits_to_float(w[4 * g + i] >> 16);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint32_t word = w[2 * g + i];
      const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(word & 0xFFFFu), __NV_E4M3);
      const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(word >> 16), __NV_E4M3);
      v[4 * i + 0] = half_bits_to_float(lo.x);
      v[4 * i + 1] = half_bits_to_float(lo.y);
      v[4 * i + 2] = half_bits_to_float(hi.x);
      v[4 * i + 3] = half_bits_to_float(hi.y);
    }
  }
}

// Sign bits of elements 8g..8g+7 of a block, element 8g+i's at bit 4i+3 (the sign bit of its
// E2M1 nibble), gathered from the source words with byte permutes: the even elements' sign bytes
// go to `even` (element 2j's sign at bit 8j+7, shifted down by 4), the odd elements' to `odd`
// (element 2j+1's sign already at bit 8j+7 = 4(2j+1)+3).
template <int kDType>
__device__ __forceinline__ uint32_t sign_nibbles(const uint32_t* w, int g) {
  uint32_t even, odd;
  if constexpr (kDType == kFloat32) {
    const uint32_t* q = w + 8 * g;  // one element per word, sign in byte 3
    even = __byte_perm(__byte_perm(q[0], q[2], 0x0073), __byte_perm(q[4], q[6], 0x0073), 0x5410);
    odd = __byte_perm(__byte_perm(q[1], q[3], 0x0073), __byte_perm(q[5], q[7], 0x0073), 0x5410);
  } else if constexpr (kDType == kBFloat16 || kDType == kFloat16) {
    const uint32_t* q = w + 4 * g;  // two elements per word, signs in bytes 1 and 3
    const uint32_t p01 = __byte_perm(q[0], q[1], 0x7531);
    const uint32_t p23 = __byte_perm(q[2], q[3], 0x7531);
    even = __byte_perm(p01, p23, 0x6420);
    odd = __byte_perm(p01, p23, 0x7531);
  } else {
    const uint32_t* q = w + 2 * g;  // four elements per word, one per byte
    even = __byte_perm(q[0], q[1], 0x6420);
    odd = __byte_perm(q[0], q[1], 0x7531);
  }
  return ((even >> 4) & 0x08080808u) | (odd & 0x80808080u);
}

// kCount fp32 values -> out_dtype at p (16-byte aligned), RNE.
template <int kOutDType, int kCount>
__device__ __forceinline__ void store_values(uint8_t* p, const float* v) {
  uint4* q = reinterpret_cast<uint4*>(p);
  if constexpr (kOutDType == kFloat32) {
#pragma unroll
    for (int i = 0; i < kCount / 4; ++i) {
      q[i] = make_uint4(__float_as_uint(v[4 * i]), __float_as_uint(v[4 * i + 1]),
                        __float_as_uint(v[4 * i + 2]), __float_as_uint(v[4 * i + 3]));
    }
  } else {
    uint32_t pairs[kCount / 2];
#pragma unroll
    for (int i = 0; i < kCount / 2; ++i) {
      if constexpr (kOutDType == kBFloat16) {
        const __nv_bfloat162 h = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
        pairs[i] = *reinterpret_cast<const uint32_t*>(&h);
      } else {
        const __half2 h = __floats2half2_rn(v[2 * i], v[2 * i + 1]);
        pairs[i] = *reinterpret_cast<const uint32_t*>(&h);
      }
    }
#pragma unroll
    for (int i = 0; i < kCount / 8; ++i) {
      q[i] = make_uint4(pairs[4 * i], pairs[4 * i + 1], pairs[4 * i + 2], pairs[4 * i + 3]);
    }
  }
}

}  // namespace torch_fp4
