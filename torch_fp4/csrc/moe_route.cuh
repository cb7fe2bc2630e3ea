// The routing kernels of fused_moe's decode path (moe_small_m.cu's torch_fp4_moe_decode), around
// its two grouped GEMMs:
// - align_kernel groups the routed pairs by local expert, in the layout of
//   torch_fp4/kernels/triton/moe_align.py: pair p = t * top_k + j belongs to local expert
//   e = ids[p] - lo when 0 <= e < experts (other pairs are dropped); expert e owns the rows
//   [start[e], start[e] + padded[e]) with padded[e] its pair count rounded up to block_m, its pairs
//   first in increasing pair order (the layout is a function of the ids alone), then padding rows
//   holding pair 0; block_expert[b] is the expert of rows [b * block_m, (b + 1) * block_m), -1
//   past the used rows (whose rows also hold pair 0).
// - topk_sum_kernel is the finalize of spec section 6: out[t] = RN_out(sum_j w[t, j] * y[t k + j])
//   in fp32, j in order from +0 (a multiply and an add, each rounded), a pair of no local expert
//   adding w * 0; with `strict` (no expert parallelism) a token with such a pair is NaN in every
//   column.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "launch.h"
#include "pdl.cuh"

namespace torch_fp4 {
namespace moe_route {

constexpr int kAlignThreads = 1024;
constexpr int kMaxExperts = 2048;                        // the alignment's shared-memory tables
constexpr int kExpertsPerThread = kMaxExperts / kAlignThreads;
constexpr int kScatterUnroll = 8;                        // 32-pair steps whose ids load at once
constexpr int kSumThreads = 128;
constexpr int kSumColumns = 8;                           // columns per thread (16-byte rows of y)

__device__ __forceinline__ int local_expert(const int* ids, int64_t p, int lo, int experts) {
  const int64_t e = static_cast<int64_t>(ids[p]) - lo;
  return e >= 0 && e < experts ? static_cast<int>(e) : -1;
}

// One CTA. Every thread: the pair count of each expert (shared-memory atomics: a count does not
// depend on the order of its increments), the exclusive scan of the padded counts, expert_end,
// the block map and the padding rows. Then warp 0 writes the pairs' rows in pair order, 32 pairs
// per step: a pair's rank among the step's pairs of its expert comes from __match_any_sync, and
// the lowest lane of each expert advances that expert's next row.
__global__ void __launch_bounds__(kAlignThreads) align_kernel(const int* ids, int64_t pairs, int lo, int experts,
                                                              int block_m, int64_t blocks, int* sorted_pairs,
                                                              int* block_expert, int* expert_end) {
  __shared__ int next_row[kMaxExperts];   // pairs of each expert, then the next row of each
  __shared__ int warp_prefix[kAlignThreads / 32];
  __shared__ int used_rows;
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  pdl_wait();
  pdl_launch_dependents();
  for (int e = tid; e < experts; e += kAlignThreads) next_row[e] = 0;
  __syncthreads();
  for (int64_t p = tid; p < pairs; p += kAlignThreads) {
    const int e = local_expert(ids, p, lo, experts);
    if (e >= 0) atomicAdd(&next_row[e], 1);
  }
  __syncthreads();

  // Thread tid owns experts [tid * kExpertsPerThread, (tid + 1) * kExpertsPerThread).
  int count[kExpertsPerThread], padded[kExpertsPerThread], own = 0;
#pragma unroll
  for (int i = 0; i < kExpertsPerThread; ++i) {
    const int e = tid * kExpertsPerThread + i;
    count[i] = e < experts ? next_row[e] : 0;
    padded[i] = (count[i] + block_m - 1) / block_m * block_m;
    own += padded[i];
  }
  int inclusive = own;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const int v = __shfl_up_sync(0xffffffffu, inclusive, d);
    if (lane >= d) inclusive += v;
  }
  if (lane == 31) warp_prefix[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    const int total = warp_prefix[lane];
    int before = total;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, before, d);
      if (lane >= d) before += v;
    }
    warp_prefix[lane] = before - total;
    if (lane == 31) used_rows = before;
  }
  __syncthreads();
  int row = warp_prefix[warp] + inclusive - own;   // the first row of this thread's experts
#pragma unroll
  for (int i = 0; i < kExpertsPerThread; ++i) {
    const int e = tid * kExpertsPerThread + i;
    if (e < experts) {
      const int end = row + count[i], stop = row + padded[i];
      expert_end[e] = end;
      for (int r = end; r < stop; ++r) sorted_pairs[r] = 0;
      for (int b = row / block_m; b < stop / block_m; ++b) block_expert[b] = e;
      next_row[e] = row;
      row = stop;
    }
  }
  const int used = used_rows;
  for (int64_t b = used / block_m + tid; b < blocks; b += kAlignThreads) block_expert[b] = -1;
  for (int64_t r = used + tid; r < blocks * block_m; r += kAlignThreads) sorted_pairs[r] = 0;
  __syncthreads();

  if (warp != 0) return;
  const unsigned below = (1u << lane) - 1u;
  for (int64_t base = 0; base < pairs; base += 32 * kScatterUnroll) {
    int e[kScatterUnroll];
#pragma unroll
    for (int u = 0; u < kScatterUnroll; ++u) {
      const int64_t p = base + u * 32 + lane;
      e[u] = p < pairs ? local_expert(ids, p, lo, experts) : -1;
    }
#pragma unroll
    for (int u = 0; u < kScatterUnroll; ++u) {
      const unsigned peers = __match_any_sync(0xffffffffu, e[u]);
      if (e[u] >= 0) sorted_pairs[next_row[e[u]] + __popc(peers & below)] = static_cast<int>(base + u * 32 + lane);
      __syncwarp();
      if (e[u] >= 0 && (peers & below) == 0) next_row[e[u]] += __popc(peers);
      __syncwarp();
    }
  }
}

__device__ __forceinline__ uint16_t out_bits(float v, __nv_bfloat16*) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }
__device__ __forceinline__ uint16_t out_bits(float v, __half*) { return __half_as_ushort(__float2half_rn(v)); }

// Token blockIdx.x, columns [kSumColumns * (blockIdx.y * kSumThreads + threadIdx.x), + kSumColumns)
// (hidden % kSumColumns == 0: the NVFP4 block size divides it).
template <class Out>
__global__ void __launch_bounds__(kSumThreads) topk_sum_kernel(const uint16_t* y, const int* ids, const float* tw,
                                                               Out* out, int hidden, int top_k, int lo, int experts,
                                                               int strict) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t t = blockIdx.x;
  const int64_t col = (static_cast<int64_t>(blockIdx.y) * kSumThreads + threadIdx.x) * kSumColumns;
  if (col >= hidden) return;
  float acc[kSumColumns];
#pragma unroll
  for (int i = 0; i < kSumColumns; ++i) acc[i] = 0.0f;
  bool stray = false;
  for (int j = 0; j < top_k; ++j) {
    const int64_t pair = t * top_k + j;
    const bool local = local_expert(ids, pair, lo, experts) >= 0;
    const float w = tw[pair];
    uint4 raw = make_uint4(0, 0, 0, 0);   // bf16 +0 (a pair of no local expert adds w * 0)
    if (local) raw = *reinterpret_cast<const uint4*>(y + pair * hidden + col);
    stray |= !local;
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < kSumColumns; ++i) {
      const uint32_t bits = (words[i / 2] >> (16 * (i % 2))) & 0xffffu;
      acc[i] = __fadd_rn(acc[i], __fmul_rn(w, __uint_as_float(bits << 16)));
    }
  }
  if (strict && stray) {
#pragma unroll
    for (int i = 0; i < kSumColumns; ++i) acc[i] = __int_as_float(0x7fc00000);
  }
  Out* dst = out + t * hidden + col;
  if constexpr (sizeof(Out) == 4) {
    reinterpret_cast<float4*>(dst)[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
    reinterpret_cast<float4*>(dst)[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
  } else {
    uint32_t packed[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      packed[i] = out_bits(acc[2 * i], static_cast<Out*>(nullptr)) |
                  (static_cast<uint32_t>(out_bits(acc[2 * i + 1], static_cast<Out*>(nullptr))) << 16);
    }
    *reinterpret_cast<uint4*>(dst) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
  }
}

// The alignment of `pairs` routed pairs over `blocks` blocks of block_m rows (experts <= kMaxExperts).
inline void launch_align(const int* ids, int64_t pairs, int lo, int experts, int block_m, int64_t blocks,
                         int* sorted_pairs, int* block_expert, int* expert_end, cudaStream_t stream, bool pdl) {
  launch_kernel(align_kernel, dim3(1), dim3(kAlignThreads), stream, pdl, ids, pairs, lo, experts, block_m, blocks,
                sorted_pairs, block_expert, expert_end);
}

// out [tokens, hidden] of out_dtype (launch.h) from y [tokens * top_k, hidden] bf16; false for an
// output type it has no kernel for.
inline bool launch_topk_sum(const uint16_t* y, const int* ids, const float* tw, void* out, int out_dtype,
                            int64_t tokens, int hidden, int top_k, int lo, int experts, bool strict,
                            cudaStream_t stream, bool pdl) {
  const dim3 grid(static_cast<unsigned>(tokens),
                  static_cast<unsigned>((hidden + kSumThreads * kSumColumns - 1) / (kSumThreads * kSumColumns)));
  const dim3 block(kSumThreads);
  const int s = strict ? 1 : 0;
  switch (out_dtype) {
    case kBFloat16:
      launch_kernel(topk_sum_kernel<__nv_bfloat16>, grid, block, stream, pdl, y, ids, tw,
                    static_cast<__nv_bfloat16*>(out), hidden, top_k, lo, experts, s);
      return true;
    case kFloat16:
      launch_kernel(topk_sum_kernel<__half>, grid, block, stream, pdl, y, ids, tw, static_cast<__half*>(out),
                    hidden, top_k, lo, experts, s);
      return true;
    case kFloat32:
      launch_kernel(topk_sum_kernel<float>, grid, block, stream, pdl, y, ids, tw, static_cast<float*>(out), hidden,
                    top_k, lo, experts, s);
      return true;
    default:
      return false;
  }
}

}  // namespace moe_route
}  // namespace torch_fp4
