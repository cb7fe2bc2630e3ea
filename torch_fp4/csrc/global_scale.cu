// NVFP4 global scale of a whole tensor in one launch: gs = RN(2688 / amax) over the finite
// elements, 1.0 when amax == 0 or the quotient is not finite (formats.global_scale_from_amax).
//
// Each CTA (2 per SM) reduces a grid-stride slice to the fp32 bit pattern of its max |x| over the
// finite elements (absolute-value patterns order like magnitudes; Inf and NaN lanes count as 0)
// and folds it into workspace[0] with atomicMax. The CTA that increments workspace[1] last reads
// the maximum, writes gs and sets both words back to zero for the next launch. No host
// synchronization.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "capi.h"
#include "launch.h"
#include "pdl.cuh"

namespace torch_fp4 {
namespace {

constexpr int kThreads = 512;
constexpr int kUnroll = 8;  // 16-byte loads in flight per thread and iteration

// Running max of absolute-value bit patterns in the source type's own width (lanes of a word).
template <int kDType>
struct AbsMax {
  uint32_t acc = 0;

  // One lane's magnitude bits, and its Inf pattern (magnitudes from it up are Inf or NaN; e4m3
  // has only NaN, 0x7F).
  static constexpr uint32_t kMag = kDType == kFloat32 ? 0x7FFFFFFFu : kDType == kFloat8E4M3 ? 0x7Fu : 0x7FFFu;
  static constexpr uint32_t kInf = kDType == kFloat32 ? 0x7F800000u : kDType == kBFloat16 ? 0x7F80u
                                   : kDType == kFloat16 ? 0x7C00u : 0x7Fu;

  // kFinite: non-finite lanes count as 0. The kernel's first pass takes every lane (fewer
  // instructions) and reruns a thread's elements with kFinite only where that found Inf or NaN.
  template <bool kFinite>
  __device__ __forceinline__ void add_word(uint32_t w) {
    if constexpr (kDType == kFloat32) {
      add_element<kFinite>(w);
    } else if constexpr (kDType == kFloat8E4M3) {
      const uint32_t a = w & (kMag * 0x01010101u);
      acc = __vmaxu4(acc, kFinite ? a & __vcmpltu4(a, kInf * 0x01010101u) : a);
    } else {
      const uint32_t a = w & (kMag * 0x00010001u);
      acc = __vmaxu2(acc, kFinite ? a & __vcmpltu2(a, kInf * 0x00010001u) : a);
    }
  }

  // One element given in the low bits of `bits`.
  template <bool kFinite>
  __device__ __forceinline__ void add_element(uint32_t bits) {
    const uint32_t a = bits & kMag;
    acc = max(acc, !kFinite || a < kInf ? a : 0u);
  }

  // The fp32 bit pattern of the maximum (monotone in the narrow pattern).
  __device__ __forceinline__ uint32_t fp32_bits() const {
    if constexpr (kDType == kFloat32) {
      return acc;
    } else if constexpr (kDType == kBFloat16) {
      return max(acc & 0xFFFFu, acc >> 16) << 16;
    } else if constexpr (kDType == kFloat16) {
      const uint32_t top = max(acc & 0xFFFFu, acc >> 16);
      return __float_as_uint(__half2float(__ushort_as_half(static_cast<unsigned short>(top))));
    } else {
      const uint32_t top = max(max(acc & 0xFFu, (acc >> 8) & 0xFFu), max((acc >> 16) & 0xFFu, acc >> 24));
      const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(top), __NV_E4M3);
      return __float_as_uint(__half2float(__ushort_as_half(h.x)));
    }
  }
};

template <int kElemBytes>
__device__ __forceinline__ uint32_t load_element(const uint8_t* x, int64_t i) {
  if constexpr (kElemBytes == 4) return __ldg(reinterpret_cast<const uint32_t*>(x) + i);
  if constexpr (kElemBytes == 2) return __ldg(reinterpret_cast<const uint16_t*>(x) + i);
  return __ldg(x + i);
}

template <int kDType, int kElemBytes>
__global__ void __launch_bounds__(kThreads) global_scale_kernel(const uint8_t* x, int64_t n,
                                                                 float* out, uint32_t* workspace) {
  // Before any global-memory access: the previous kernel (possibly an earlier launch on this
  // workspace, whose last CTA resets it) has completed and its writes are visible.
  pdl_wait();
  AbsMax<kDType> am;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;

  // 16-byte vectors over the aligned body (kUnroll loads in flight per thread; vectors past the
  // end read as zero, which no maximum of absolute values changes), then single elements for the
  // unaligned head and the tail.
  const int64_t head = std::min<int64_t>(n, ((16 - reinterpret_cast<uintptr_t>(x) % 16) % 16) / kElemBytes);
  const uint4* body = reinterpret_cast<const uint4*>(x + head * kElemBytes);
  const int64_t vectors = (n - head) * kElemBytes / 16;
  const int64_t tail = head + vectors * 16 / kElemBytes;
  auto scan = [&](auto finite) {
    constexpr bool kFinite = decltype(finite)::value;
    for (int64_t v = tid; v < vectors; v += kUnroll * stride) {
      uint4 u[kUnroll];
#pragma unroll
      for (int j = 0; j < kUnroll; ++j) {
        u[j] = v + j * stride < vectors ? __ldg(body + v + j * stride) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int j = 0; j < kUnroll; ++j) {
        am.template add_word<kFinite>(u[j].x);
        am.template add_word<kFinite>(u[j].y);
        am.template add_word<kFinite>(u[j].z);
        am.template add_word<kFinite>(u[j].w);
      }
    }
    for (int64_t i = tid; i < head; i += stride) am.template add_element<kFinite>(load_element<kElemBytes>(x, i));
    for (int64_t i = tail + tid; i < n; i += stride) am.template add_element<kFinite>(load_element<kElemBytes>(x, i));
  };
  scan(std::false_type{});
  if (am.fp32_bits() >= 0x7F800000u) {   // this thread's elements hold Inf or NaN: again without them
    am.acc = 0;
    scan(std::true_type{});
  }
  // Every input load is done; the next kernel may start (it waits for this grid, workspace reset
  // included, before touching memory).
  pdl_launch_dependents();

  // CTA reduction of the fp32 patterns.
  __shared__ uint32_t warp_max[kThreads / 32];
  const uint32_t mine = __reduce_max_sync(0xFFFFFFFFu, am.fp32_bits());
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = mine;
  __syncthreads();
  if (threadIdx.x >= 32) return;
  const uint32_t cta = __reduce_max_sync(0xFFFFFFFFu, threadIdx.x < kThreads / 32 ? warp_max[threadIdx.x] : 0u);
  if (threadIdx.x != 0) return;

  atomicMax(workspace, cta);
  __threadfence();
  const uint32_t done = atomicAdd(workspace + 1, 1u);
  if (done != gridDim.x - 1) return;

  // Last CTA: every other CTA's atomicMax precedes its counter increment.
  __threadfence();
  const float amax = __uint_as_float(atomicExch(workspace, 0u));
  atomicExch(workspace + 1, 0u);
  const float gs = __fdiv_rn(2688.0f, amax);
  const bool ok = amax != 0.0f && (__float_as_uint(gs) & 0x7FFFFFFFu) < 0x7F800000u;
  out[0] = ok ? gs : 1.0f;
}

template <int kDType, int kElemBytes>
void launch_typed(const void* x, int64_t n, float* out, uint32_t* workspace, int num_sms,
                  cudaStream_t stream, bool pdl) {
  const int64_t per_cta = int64_t{kThreads} * kUnroll * 16 / kElemBytes;
  const int64_t wanted = (n + per_cta - 1) / per_cta;
  const int ctas = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(wanted, int64_t{num_sms} * 2)));
  launch_kernel(global_scale_kernel<kDType, kElemBytes>, ctas, kThreads, stream, pdl,
                static_cast<const uint8_t*>(x), n, out, workspace);
}

}  // namespace

void launch_global_scale(const void* x, int64_t n, int in_dtype, float* out, uint32_t* workspace,
                         int num_sms, cudaStream_t stream, bool pdl) {
  switch (in_dtype) {
    case kBFloat16: launch_typed<kBFloat16, 2>(x, n, out, workspace, num_sms, stream, pdl); break;
    case kFloat16: launch_typed<kFloat16, 2>(x, n, out, workspace, num_sms, stream, pdl); break;
    case kFloat32: launch_typed<kFloat32, 4>(x, n, out, workspace, num_sms, stream, pdl); break;
    case kFloat8E4M3: launch_typed<kFloat8E4M3, 1>(x, n, out, workspace, num_sms, stream, pdl); break;
    default: break;
  }
}

}  // namespace torch_fp4

// C entry point (capi.h): out[0] = the NVFP4 global scale of the n elements at x (in_dtype:
// launch.h's DType); workspace: two uint32 words, zero before and after the call.
TORCH_FP4_CAPI int torch_fp4_global_scale(int device, void* stream, int pdl, const void* x, int64_t n, int in_dtype,
                                          float* out, void* workspace) {
  if (const int e = torch_fp4::capi_begin(device)) return e;
  if (in_dtype < torch_fp4::kBFloat16 || in_dtype > torch_fp4::kFloat8E4M3) return torch_fp4::kNotCompiled;
  int num_sms = 0;
  if (const cudaError_t e = cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device))
    return static_cast<int>(e);
  torch_fp4::launch_global_scale(x, n, in_dtype, out, static_cast<uint32_t*>(workspace), num_sms,
                                 static_cast<cudaStream_t>(stream), pdl != 0);
  return torch_fp4::capi_end(true);
}
