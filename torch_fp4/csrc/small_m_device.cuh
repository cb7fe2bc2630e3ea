// The GPU side of the small-M GEMM's kernel context (mm_small_m.cuh's Ctx): thread, tile and
// cluster indices, barriers, cp.async, warp MMA, ldmatrix and distributed shared memory. Shared
// by the dense kernels (mm_small_m.cu) and the grouped MoE kernels (moe_small_m.cu).
#pragma once

#include <cstdint>

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include "fp4_numerics.cuh"
#include "mm_small_m.cuh"
#include "pdl.cuh"

namespace torch_fp4 {
namespace small_m {

namespace cg = cooperative_groups;

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The GPU side of the kernel body's context: indices, barriers, cp.async, warp MMA, cluster.
struct DeviceCtx {
  char* base;

  __device__ __forceinline__ char* smem() const { return base; }
  __device__ __forceinline__ int tid() const { return static_cast<int>(threadIdx.x); }
  __device__ __forceinline__ int tile() const { return static_cast<int>(blockIdx.x); }
  // The K split is blockIdx.y; the launch makes the splits of one tile a cluster (1, split, 1),
  // so it is also the CTA's rank in its cluster.
  // Grouped launches: the block of routed rows (mm_small_m.cuh Params).
  __device__ __forceinline__ int block() const { return static_cast<int>(blockIdx.z); }
  __device__ __forceinline__ int rank() const { return static_cast<int>(blockIdx.y); }
  __device__ __forceinline__ int splits() const { return static_cast<int>(gridDim.y); }

  __device__ __forceinline__ void sync() const { __syncthreads(); }
  template <class T>
  __device__ __forceinline__ T lds(const T* p) const { return *p; }
  __device__ __forceinline__ void pdl_wait() const { torch_fp4::pdl_wait(); }
  __device__ __forceinline__ void pdl_launch_dependents() const { torch_fp4::pdl_launch_dependents(); }

  // Weights: streamed once, L2 only.
  __device__ __forceinline__ void cp_async16_stream(void* dst, const void* src, int bytes) const {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(dst)), "l"(src), "r"(bytes)
                 : "memory");
  }
  // Activations and scales: read by every CTA of the same K range, L1 allocating.
  __device__ __forceinline__ void cp_async16(void* dst, const void* src, int bytes) const {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(dst)), "l"(src), "r"(bytes)
                 : "memory");
  }
  __device__ __forceinline__ void cp_async8(void* dst, const void* src, int bytes) const {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(smem_addr(dst)), "l"(src), "r"(bytes)
                 : "memory");
  }
  __device__ __forceinline__ void cp_async4(void* dst, const void* src, int bytes) const {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(smem_addr(dst)), "l"(src), "r"(bytes)
                 : "memory");
  }
  __device__ __forceinline__ void cp_commit() const { asm volatile("cp.async.commit_group;" ::: "memory"); }
  // At most n (a launch constant, 0..4) of this thread's newest groups still pending.
  __device__ __forceinline__ void cp_wait(int n) const {
    switch (n) {
      case 0: asm volatile("cp.async.wait_group 0;" ::: "memory"); break;
      case 1: asm volatile("cp.async.wait_group 1;" ::: "memory"); break;
      case 2: asm volatile("cp.async.wait_group 2;" ::: "memory"); break;
      case 3: asm volatile("cp.async.wait_group 3;" ::: "memory"); break;
      default: asm volatile("cp.async.wait_group 4;" ::: "memory"); break;
    }
  }
  __device__ __forceinline__ void cp_wait_all() const { asm volatile("cp.async.wait_all;" ::: "memory"); }

  // Four 8x8 b16 matrices: lane l gives the 16-byte row l % 8 of matrix l / 8 and receives word
  // l % 4 of row l / 4 of each matrix.
  __device__ __forceinline__ U128 ldmatrix_x4(const void* row) const {
    U128 r;
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "r"(smem_addr(row)));
    return r;
  }

  // d += A * B for one m16n8k16 tile: A rows (a0: row g, k 2t..2t+1; a1: row g+8; a2, a3: k + 8),
  // B columns (b0: k 2t..2t+1 of column g; b1: k + 8), fp32 accumulators.
  template <bool kFp16>
  __device__ __forceinline__ void mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                      uint32_t b0, uint32_t b1) const {
    if constexpr (kFp16) {
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
          "{%0,%1,%2,%3};"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
          : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    } else {
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
          "{%0,%1,%2,%3};"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
          : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
  }

  // The grouped FC1's quantize-dequantize of its output, 4 consecutive columns of one row per
  // thread, a block of kLanes * 4 columns over kLanes consecutive lanes: the four values rounded
  // to bf16 (the intermediate), and the bits of the block's largest magnitude (NaN patterns win).
  template <int kLanes>
  __device__ __forceinline__ uint32_t bf16_block_amax(float (&a)[4]) const {
    const unsigned group = ((1u << kLanes) - 1u) << (threadIdx.x & (32u - kLanes));
    uint32_t amax = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      a[i] = __bfloat162float(__float2bfloat16_rn(a[i]));
      amax = max(amax, __float_as_uint(a[i]) & 0x7FFFFFFFu);
    }
#pragma unroll
    for (int d = 1; d < kLanes; d <<= 1) amax = max(amax, __shfl_xor_sync(group, amax, d));
    return amax;
  }

  // Each a[i] * o encoded to E2M1 (clamped to +-limit first when `clamp`; NaN to code 7), times
  // the block scale's value sf: the exact value of the code.
  __device__ __forceinline__ F4 exact_values4(const float (&a)[4], float o, float sf, bool clamp, float limit) const {
    float out[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float q = __fmul_rn(a[i], o);
      if (clamp) q = fminf(fmaxf(q, -limit), limit);
      const uint32_t bits = __float_as_uint(q);
      uint32_t m = __float_as_uint(e2m1_magnitude_biased(q)) - kMagicBits;
      if (is_nan_bits(bits)) m = 7u;
      const float mag = m < 4u ? 0.5f * static_cast<float>(m) : (m == 7u ? 6.0f : static_cast<float>(m - 2u));
      const float code = (bits >> 31) && !is_nan_bits(bits) ? -mag : mag;
      out[i] = __fmul_rn(code, sf);
    }
    return F4{out[0], out[1], out[2], out[3]};
  }

  // NVFP4 intermediates (lanes 4j..4j+3 hold one 16-column block): the values of
  // nvfp4_quantize(RN_bf16(v), gs) dequantized without the global scale, code * e4m3 block scale
  // (exact in bf16), as quantize.cu then dequantize.cu.
  __device__ __forceinline__ F4 nvfp4_qdq(F4 v, float gs) const {
    float a[4] = {v.x, v.y, v.z, v.w};
    const uint32_t amax = bf16_block_amax<4>(a);
    const BlockScale bs = nvfp4_block_scale(__uint_as_float(amax), gs, __frcp_rn(gs));
    return exact_values4(a, bs.o, e4m3_to_float(bs.byte), false, 0.0f);
  }

  // MXFP4 intermediates (W4A4 with MXFP4 activations; lanes 8j..8j+7 hold one 32-column block):
  // the values of mxfp4_quantize(RN_bf16(v)) dequantized, code * 2^(e - 127) (exact in bf16), by
  // quantize.cu's rules (clamped to mxfp4_limit where no product is NaN; a NaN block all NaN).
  __device__ __forceinline__ F4 mxfp4_qdq(F4 v) const {
    float a[4] = {v.x, v.y, v.z, v.w};
    const uint32_t amax = bf16_block_amax<8>(a);
    const BlockScale bs = mxfp4_block_scale(__uint_as_float(amax));
    return exact_values4(a, bs.o, ue8m0_to_float(bs.byte), block_products_never_nan(__uint_as_float(amax), bs.o),
                         mxfp4_limit(bs.byte));
  }

  __device__ __forceinline__ void cluster_sync() const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cg::this_cluster().sync();
#endif
  }
  // The same shared-memory location in the CTA of cluster rank r (distributed shared memory).
  __device__ __forceinline__ const float* remote(const float* p, int r) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    return cg::this_cluster().map_shared_rank(const_cast<float*>(p), static_cast<unsigned>(r));
#else
    return p;
#endif
  }
};

}  // namespace small_m
}  // namespace torch_fp4
