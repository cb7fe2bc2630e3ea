// Scale-factor layouts (spec section 4) and the index arithmetic of the kernels.
#pragma once

#include <cstdint>

#include "launch.h"

namespace torch_fp4 {

// n / d and n % d for n, d < 2^31 by a multiply-high and a shift (d fixed at launch).
// shift = ceil(log2 d), mul = floor(2^32 * (2^shift - d) / d) + 1, q = (umulhi(n, mul) + n) >> shift.
struct FastDivmod {
  uint32_t divisor;
  uint32_t mul;
  uint32_t shift;

  __host__ __device__ FastDivmod() : divisor(1), mul(1), shift(0) {}

  __host__ explicit FastDivmod(uint32_t d) : divisor(d) {
    shift = 0;
    while ((uint64_t{1} << shift) < d) ++shift;
    mul = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << shift) - d)) / d + 1);
  }

  __device__ __forceinline__ void divmod(uint32_t n, uint32_t& q, uint32_t& r) const {
    q = (__umulhi(n, mul) + n) >> shift;
    r = n - q * divisor;
  }
};

// Byte offset of scale (m, kb) inside one [Mp, Kp] scale matrix.
__device__ __forceinline__ uint32_t scale_offset(int layout, uint32_t m, uint32_t kb, uint32_t kp) {
  if (layout == kLayout128x4) {
    return ((m >> 7) * (kp >> 2) + (kb >> 2)) * 512u + (m & 31u) * 16u + ((m >> 5) & 3u) * 4u +
           (kb & 3u);
  }
  if (layout == kLayout8x4) {
    return ((m >> 3) * (kp >> 2) + (kb >> 2)) * 32u + (m & 7u) * 4u + (kb & 3u);
  }
  return m * kp + kb;
}

}  // namespace torch_fp4
