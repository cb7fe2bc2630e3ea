// The routing of fused_moe's decode path, inside its two grouped GEMM kernels (moe_small_m.cu),
// so that one call is two launches:
// - group_block: every CTA of FC1 groups the routed pairs by local expert from the ids alone and
//   keeps the rows of its own block, in the layout of torch_fp4/kernels/triton/moe_align.py: pair
//   p = t * top_k + j belongs to local expert e = ids[p] - lo when 0 <= e < experts (other pairs
//   are dropped); expert e owns the rows [start[e], start[e] + padded[e]) with padded[e] its pair
//   count rounded up to block_m, its pairs first in increasing pair order, then padding rows
//   holding pair 0; block_expert[b] is the expert of rows [b * block_m, (b + 1) * block_m), -1 past
//   the used rows (whose rows also hold pair 0). FC1's first CTA of each block writes that block
//   (and a share of expert_end) for FC2, zeroes a share of FC2's arrival counters and writes the
//   rows of the tokens of its share that have no local pair.
// - pair_sum is the finalize of spec section 6 for 8 columns of one token:
//   out[t] = RN_out(sum_j w[t, j] * y[t k + j]) in fp32, j in order from +0 (a multiply and an
//   add, each rounded), a pair of no local expert adding w * 0; with `strict` (no expert
//   parallelism) a token with such a pair is NaN in every column. FC2 runs it in the CTA that
//   stores the last of a token's local rows of a column tile (an acq_rel arrival counter per
//   token and tile), so the order of arrival never changes the sum.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "launch.h"

namespace torch_fp4 {
namespace moe_route {

constexpr int kMaxExperts = 2048;   // the grouping's counts live in the GEMM's pipeline memory
constexpr int kSumColumns = 8;      // columns per pair_sum (16-byte rows of y)
constexpr int kMaxBlockRows = 64;   // block_m

// What the decode path's kernels share about the routing (one launch parameter).
struct Routing {
  const int* ids;           // topk_ids [tokens, top_k]
  const float* tw;          // topk_weights [tokens, top_k]
  int tokens, top_k, lo, experts, block_m, strict;
  int64_t blocks;           // grid z: blocks of block_m rows any routing can use
  int* sorted_pairs;        // [blocks * block_m] the pair of each grouped row (FC1 writes, FC2 reads)
  int* block_expert;        // [blocks]
  int* expert_end;          // [experts]
  int* arrivals;            // [tokens, arrival_tiles] FC2's arrival counters (FC1 zeroes them)
  int arrival_tiles;        // FC2's column tiles
  const uint16_t* y;        // [tokens * top_k, hidden] bf16, FC2's rows in pair order
  void* out;                // [tokens, hidden] of out_dtype (launch.h DType)
  int out_dtype, hidden;
};

// The static shared memory of the grouping and the finalize in one CTA (the tactic space adds
// kSharedBound to its shared-memory check).
struct BlockShared {
  int rows[kMaxBlockRows];     // the block's pairs (FC1), or the tokens whose sums it writes (FC2)
  int warp_sums[32];
  int expert, start, count, used_rows, summed;
};
constexpr int kSharedBound = 1024;
static_assert(sizeof(BlockShared) <= kSharedBound, "the tactic space's bound (moe_small_m_tactics.py)");

// A CTA's block of grouped rows: its expert (-1: unused), first grouped row, rows holding pairs
// of the expert (<= block_m) and the pair of each row.
struct Block {
  int expert, row0, used;
  const int* rows;
};

__device__ __forceinline__ int local_expert(const Routing& r, int64_t p) {
  const int64_t e = static_cast<int64_t>(__ldg(r.ids + p)) - r.lo;
  return e >= 0 && e < r.experts ? static_cast<int>(e) : -1;
}

// Local pairs among token t's top_k, and whether any of its pairs has no local expert.
__device__ __forceinline__ int local_pairs(const Routing& r, int64_t t, bool* stray) {
  int n = 0;
  for (int j = 0; j < r.top_k; ++j) n += local_expert(r, t * r.top_k + j) >= 0 ? 1 : 0;
  if (stray != nullptr) *stray = n < r.top_k;
  return n;
}

// Exclusive prefix sum of v over the CTA's threads (a multiple of 32); *total gets the sum of
// all. Every thread of the CTA must call it.
template <int kThreads>
__device__ __forceinline__ int block_exclusive_scan(int v, BlockShared& sh, int* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int inclusive = v;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const int u = __shfl_up_sync(0xffffffffu, inclusive, d);
    if (lane >= d) inclusive += u;
  }
  if (lane == 31) sh.warp_sums[warp] = inclusive;
  __syncthreads();
  int before = 0, all = 0;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) {
    const int s = sh.warp_sums[w];
    before += w < warp ? s : 0;
    all += s;
  }
  __syncthreads();   // warp_sums free for the next scan
  *total = all;
  return before + inclusive - v;
}

// Block b of the grouping, computed by every CTA of FC1 from the ids (see the top of the file).
// counts: shared scratch of r.experts ints, left holding expert_end of every expert.
template <int kThreads>
__device__ Block group_block(const Routing& r, int64_t b, int* counts, BlockShared& sh) {
  const int tid = static_cast<int>(threadIdx.x);
  const int64_t pairs = static_cast<int64_t>(r.tokens) * r.top_k;
  for (int e = tid; e < r.experts; e += kThreads) counts[e] = 0;
  for (int i = tid; i < r.block_m; i += kThreads) sh.rows[i] = 0;
  if (tid == 0) sh.expert = -1;
  __syncthreads();
  for (int64_t p = tid; p < pairs; p += kThreads) {
    const int e = local_expert(r, p);
    if (e >= 0) atomicAdd(&counts[e], 1);
  }
  __syncthreads();

  // Thread tid owns experts [e0, e1): the exclusive scan of the padded counts gives each expert's
  // first row; counts[e] becomes its end (expert_end).
  const int per = (r.experts + kThreads - 1) / kThreads;
  const int e0 = min(tid * per, r.experts), e1 = min(e0 + per, r.experts);
  int own = 0;
  for (int e = e0; e < e1; ++e) own += (counts[e] + r.block_m - 1) / r.block_m * r.block_m;
  int used_rows = 0;
  int start = block_exclusive_scan<kThreads>(own, sh, &used_rows);
  const int64_t row0 = b * r.block_m;
  for (int e = e0; e < e1; ++e) {
    const int count = counts[e], padded = (count + r.block_m - 1) / r.block_m * r.block_m;
    if (row0 >= start && row0 < start + padded) {
      sh.expert = e;
      sh.start = start;
      sh.count = count;
    }
    counts[e] = start + count;
    start += padded;
  }
  __syncthreads();
  const int expert = sh.expert;
  if (expert < 0) return Block{-1, static_cast<int>(row0), 0, sh.rows};

  // The expert's pairs of ranks [first, first + block_m) in pair order: thread tid counts its
  // expert's pairs in its slice of the pairs, a scan gives the rank of its first one.
  const int first = static_cast<int>(row0) - sh.start, count = sh.count;
  const int64_t chunk = (pairs + kThreads - 1) / kThreads;
  const int64_t p0 = min(static_cast<int64_t>(tid) * chunk, pairs), p1 = min(p0 + chunk, pairs);
  int mine = 0;
  for (int64_t p = p0; p < p1; ++p) mine += local_expert(r, p) == expert ? 1 : 0;
  int total = 0;
  int rank = block_exclusive_scan<kThreads>(mine, sh, &total);
  if (rank < first + r.block_m && rank + mine > first) {
    for (int64_t p = p0; p < p1; ++p) {
      if (local_expert(r, p) != expert) continue;
      if (rank >= first && rank < first + r.block_m) sh.rows[rank - first] = static_cast<int>(p);
      ++rank;
    }
  }
  __syncthreads();
  return Block{expert, static_cast<int>(row0), min(r.block_m, count - first), sh.rows};
}

// Block b of the grouping as FC1 wrote it.
__device__ __forceinline__ Block written_block(const Routing& r, int64_t b) {
  const int expert = r.block_expert[b];
  const int row0 = static_cast<int>(b * r.block_m);
  if (expert < 0) return Block{-1, row0, 0, nullptr};
  return Block{expert, row0, min(r.block_m, r.expert_end[expert] - row0), r.sorted_pairs + row0};
}

__device__ __forceinline__ uint16_t out_bits(float v, __nv_bfloat16*) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }
__device__ __forceinline__ uint16_t out_bits(float v, __half*) { return __half_as_ushort(__float2half_rn(v)); }

template <class Out>
__device__ __forceinline__ void store_sum(Out* dst, const float (&acc)[kSumColumns]) {
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

// out[t, col .. col + kSumColumns) (hidden % kSumColumns == 0: the NVFP4 block size divides it).
// y is read past L1 (other CTAs wrote it in this launch).
__device__ __forceinline__ void pair_sum(const Routing& r, int64_t t, int col) {
  float acc[kSumColumns];
#pragma unroll
  for (int i = 0; i < kSumColumns; ++i) acc[i] = 0.0f;
  bool stray = false;
  for (int j = 0; j < r.top_k; ++j) {
    const int64_t pair = t * r.top_k + j;
    const bool local = local_expert(r, pair) >= 0;
    const float w = __ldg(r.tw + pair);
    uint4 raw = make_uint4(0, 0, 0, 0);   // bf16 +0 (a pair of no local expert adds w * 0)
    if (local) raw = __ldcg(reinterpret_cast<const uint4*>(r.y + pair * r.hidden + col));
    stray |= !local;
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < kSumColumns; ++i) {
      const uint32_t bits = (words[i / 2] >> (16 * (i % 2))) & 0xffffu;
      acc[i] = __fadd_rn(acc[i], __fmul_rn(w, __uint_as_float(bits << 16)));
    }
  }
  if (r.strict && stray) {
#pragma unroll
    for (int i = 0; i < kSumColumns; ++i) acc[i] = __int_as_float(0x7fc00000);
  }
  const int64_t at = t * r.hidden + col;
  switch (r.out_dtype) {
    case kBFloat16: store_sum(static_cast<__nv_bfloat16*>(r.out) + at, acc); break;
    case kFloat16: store_sum(static_cast<__half*>(r.out) + at, acc); break;
    default: store_sum(static_cast<float*>(r.out) + at, acc); break;
  }
}

// FC1's first CTA of block b (after group_block; counts holds expert_end): block b's entries of
// the grouping, expert_end of experts b, b + blocks, ..., FC2's arrival counters of its share
// zeroed, and the rows of the tokens b, b + blocks, ... that have no local pair (all w * 0, or
// NaN with strict).
template <int kThreads>
__device__ void publish_block(const Routing& r, int64_t b, const Block& blk, const int* counts) {
  const int tid = static_cast<int>(threadIdx.x);
  if (tid == 0) r.block_expert[b] = blk.expert;
  for (int i = tid; i < r.block_m; i += kThreads) r.sorted_pairs[blk.row0 + i] = blk.rows[i];
  for (int64_t e = b + static_cast<int64_t>(tid) * r.blocks; e < r.experts; e += kThreads * r.blocks) {
    r.expert_end[e] = counts[e];
  }
  const int64_t counters = static_cast<int64_t>(r.tokens) * r.arrival_tiles;
  for (int64_t i = b + static_cast<int64_t>(tid) * r.blocks; i < counters; i += kThreads * r.blocks) r.arrivals[i] = 0;
  for (int64_t t = b; t < r.tokens; t += r.blocks) {
    if (local_pairs(r, t, nullptr) > 0) continue;
    for (int col = tid * kSumColumns; col < r.hidden; col += kThreads * kSumColumns) pair_sum(r, t, col);
  }
}

__device__ __forceinline__ int arrive(int* counter) {
  int old;
  asm volatile("atom.acq_rel.gpu.add.s32 %0, [%1], 1;" : "=r"(old) : "l"(counter) : "memory");
  return old;
}

// FC2, after every CTA of the cluster stored its share of block `blk`'s rows of y for the column
// tile [n0, n0 + tile_cols) and a barrier: the cluster's rank 0 counts each stored row in on its
// token's counter of this tile, and sums the tokens whose local rows are now all stored.
template <int kThreads>
__device__ void finalize_tile(const Routing& r, const Block& blk, int tile, int tile_cols, BlockShared& sh) {
  const int tid = static_cast<int>(threadIdx.x);
  if (tid == 0) sh.summed = 0;
  __syncthreads();
  if (tid < blk.used) {
    const int64_t t = blk.rows[tid] / r.top_k;
    const int old = arrive(r.arrivals + t * r.arrival_tiles + tile);
    if (old == local_pairs(r, t, nullptr) - 1) sh.rows[atomicAdd(&sh.summed, 1)] = static_cast<int>(t);
  }
  __syncthreads();
  const int n0 = tile * tile_cols, chunks = tile_cols / kSumColumns;
  for (int i = tid; i < sh.summed * chunks; i += kThreads) {
    const int col = n0 + (i % chunks) * kSumColumns;
    if (col < r.hidden) pair_sum(r, sh.rows[i / chunks], col);
  }
}

}  // namespace moe_route
}  // namespace torch_fp4
