// The Hopper GEMM's (mm_wgmma.cu) tile ends, per MMA warpgroup after its main loop: the
// persistent epilogue through a small staging area (staged fp32 stores, or transposed stmatrix and
// TMA tensor stores for 16-bit outputs, which split-2 launches use too), split 2's half tiles
// through distributed shared memory, the stream-K partial sums through a global workspace, and
// the two K groups' sums through shared memory; and the finishing of a sum (the 2^-7 fold undone,
// alpha). Every function takes the kernel's Config as Cfg.
#pragma once

#include <cstdint>

#include <cuda.h>

#include "mm_small_m.cuh"
#include "wgmma_ptx.cuh"

namespace torch_fp4 {
namespace wgmma_mm {

using small_m::F4;
using small_m::Params;
using small_m::U128;

constexpr int kStagePitch = 64 + 4;  // fp32 words per row of a warpgroup's epilogue staging area
constexpr int kChunkM = 32;          // activation rows per persistent epilogue chunk (block_m >= 32)
constexpr uint32_t kOutBuffer = kChunkM * 64 * 2;  // bytes of one 16-bit TMA-store epilogue buffer
// With two K groups (Config::kKG), the exchange area of their sums: per 64-row group, a round of
// 16 accumulators x 128 threads fp32.
constexpr int kXchgAcc = 16;

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// Four finished sums before their one rounding: undo the 2^-7 of the folded NVFP4 operands
// (exact), then alpha.
template <class Cfg>
__device__ __forceinline__ F4 finish(F4 v, float alpha, bool has_alpha) {
  if (Cfg::kFold) {
    v = F4{small_m::mul_rn(v.x, 128.0f), small_m::mul_rn(v.y, 128.0f), small_m::mul_rn(v.z, 128.0f),
           small_m::mul_rn(v.w, 128.0f)};
  }
  if (has_alpha) {
    v = F4{small_m::mul_rn(v.x, alpha), small_m::mul_rn(v.y, alpha), small_m::mul_rn(v.z, alpha),
           small_m::mul_rn(v.w, alpha)};
  }
  return v;
}

// The persistent epilogue, per MMA warpgroup (its 64 weight rows), in chunks of kChunkM activation
// rows through the warpgroup's own fp32 staging area [kChunkM][64 + 4] after the pipeline (the
// stages stay the producer's): write the chunk's accumulators (conflict-free: rows 2c apart land
// 8c banks apart), sync the warpgroup, then a compact loop stores 4 outputs per thread and access
// (a warp covers two full 128-byte rows), sync again before the next chunk. The chunk loop is
// unrolled (accumulators are registers), the store loop is not: the code stays small.
template <class Cfg>
__device__ __forceinline__ void store_staged(const Params& p, const float (&acc)[Cfg::kAcc], uint32_t stage, int m0,
                                             int n0, int mwg, int wct, int rw, int c, float alpha, bool has_alpha) {
  constexpr int kChunk = kChunkM, kP = kStagePitch, kPerRow = 64 / 4;
  const int rows = min(Cfg::kBM, p.m - m0);
  const int n_base = n0 + 64 * mwg;
#pragma unroll
  for (int ch = 0; ch < Cfg::kBM / kChunk; ++ch) {
    if (ch * kChunk < rows) {  // uniform over the warpgroup
#pragma unroll
      for (int jj = 0; jj < kChunk / 8; ++jj)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          asm volatile("st.shared.f32 [%0], %1;" ::"r"(stage + 4u * ((8 * jj + 2 * c + (e & 1)) * kP + rw + 8 * (e >> 1))),
                       "f"(acc[4 * (ch * kChunk / 8 + jj) + e])
                       : "memory");
      asm volatile("bar.sync %0, 128;" ::"r"(2 + mwg) : "memory");
      const int here = min(kChunk, rows - ch * kChunk);
#pragma unroll 1
      for (int q = wct; q < here * kPerRow; q += 128) {
        const int m = q / kPerRow, r4 = q % kPerRow;
        if (n_base + 4 * r4 >= p.n) continue;
        const U128 w = lds128(stage + 4u * (m * kP + 4 * r4));
        const F4 v{__uint_as_float(w.x), __uint_as_float(w.y), __uint_as_float(w.z), __uint_as_float(w.w)};
        small_m::store_out(p, m0 + ch * kChunk + m, n_base + 4 * r4,
                           small_m::add_bias4(p, finish<Cfg>(v, alpha, has_alpha), n_base + 4 * r4));
      }
      asm volatile("bar.sync %0, 128;" ::"r"(2 + mwg) : "memory");
    }
  }
}

// Two outputs of one weight row (activation rows m, m + 1), plus that row's bias `b` when `has_bias`,
// rounded to the 16-bit output type and packed low-first: one register of a transposed stmatrix
// fragment.
template <class Cfg>
__device__ __forceinline__ uint32_t pack_out(float x, float y, float alpha, bool has_alpha, bool fp16, bool has_bias,
                                             float b) {
  F4 v = finish<Cfg>(F4{x, y, 0.0f, 0.0f}, alpha, has_alpha);
  if (has_bias) v = F4{small_m::add_rn(v.x, b), small_m::add_rn(v.y, b), 0.0f, 0.0f};
  const uint32_t lo = fp16 ? small_m::round_out<small_m::kOutF16>(v.x) : small_m::round_out<small_m::kOutBf16>(v.x);
  const uint32_t hi = fp16 ? small_m::round_out<small_m::kOutF16>(v.y) : small_m::round_out<small_m::kOutBf16>(v.y);
  return lo | (hi << 16);
}

// The persistent epilogue for 16-bit outputs with 16-byte output rows (N % 8 == 0), per MMA
// warpgroup in chunks of kChunkM activation rows: the warpgroup's 64 weight rows x 32 activation
// rows, rounded in registers, go by two transposed stmatrix.x4 per warp into one of its two 4 KiB
// buffers ([32 activation rows][64 outputs], the 128-byte swizzle of TMA: conflict-free), and one
// thread stores the buffer by a TMA tensor store that runs on while the next chunk (or the next
// tile's main loop) proceeds. One warpgroup barrier per chunk: before it, the storing thread waits
// until every earlier store has read its buffer, so the buffer the next chunk writes is free.
// `chunk` counts the warpgroup's chunks across tiles (the buffer parity).
// kChunks: the chunks it may store from m0 on, `chunks` of them (a split-2 rank's share of the
// tile: pair_exchange).
template <class Cfg, int kChunks = Cfg::kBM / kChunkM>
__device__ __forceinline__ void store_tma(const Params& p, const CUtensorMap* out_map, const float (&acc)[Cfg::kAcc],
                                          uint32_t buffers, int& chunk, int m0, int n0, int mwg, int wct, float alpha,
                                          bool has_alpha, int chunks = kChunks) {
  const int rows = min(chunks * kChunkM, p.m - m0);
  const int n_base = n0 + 64 * mwg;
  const bool fp16 = p.out_dtype == small_m::kOutF16;
  const int lane = wct & 31, w = wct >> 5;
  const int j = lane & 7, mat = lane >> 3;  // this lane addresses row j of matrix `mat`
  // The bias of the thread's two weight rows (16 w + lane / 4, + 8), zero past N (never stored).
  const bool has_bias = p.bias != nullptr;
  float bias[2] = {0.0f, 0.0f};
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int n = n_base + 16 * w + (lane >> 2) + 8 * h;
    if (has_bias && n < p.n) bias[h] = small_m::load_bias(p.bias, n, p.bias_dtype);
  }
#pragma unroll
  for (int ch = 0; ch < kChunks; ++ch) {
    if (ch * kChunkM < rows) {  // uniform over the warpgroup
      const uint32_t buf = buffers + kOutBuffer * (chunk & 1);
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        // Matrix i of this stmatrix: activation rows 8 (2u + i / 2).. of the chunk, weight rows
        // 16 w + 8 (i % 2)..: accumulators 4 (ch * 4 + 2u + i / 2) + 2 (i % 2), + 1.
        uint32_t r[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int a = 4 * (ch * (kChunkM / 8) + 2 * u + (i >> 1)) + 2 * (i & 1);
          r[i] = pack_out<Cfg>(acc[a], acc[a + 1], alpha, has_alpha, fp16, has_bias, bias[i & 1]);
        }
        const int m = 8 * (2 * u + (mat >> 1)) + j, blk = 2 * w + (mat & 1);
        const uint32_t addr = buf + 128u * m + (static_cast<uint32_t>(blk ^ j) << 4);
        asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(r[0]),
                     "r"(r[1]), "r"(r[2]), "r"(r[3])
                     : "memory");
      }
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      if (wct == 0) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
      asm volatile("bar.sync %0, 128;" ::"r"(2 + mwg) : "memory");
      if (wct == 0) {
        if (n_base < p.n)
          asm volatile(
            "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];" ::"l"(out_map),
            "r"(n_base), "r"(m0 + ch * kChunkM), "r"(buf)
            : "memory");
        asm volatile("cp.async.bulk.commit_group;" ::: "memory");
      }
      ++chunk;
    }
  }
}

// A split-2 tile (Config::kPair: one tile per CTA, its two ranks a cluster): rank 0 finishes the
// tile's first Cfg::kPairChunks chunks of activation rows, accumulators acc[0 .. H0) (H0 =
// Cfg::kPairAcc), rank 1 the rest, acc[H0 .. kAcc) (the same count but at block_m 160 and 224), and
// each hands the other's share to the other rank: each thread writes it to its own shared memory at
// `xchg` (per warpgroup [H0 / 4][128 threads] 16-byte words: a warp's words are contiguous), then
// after the cluster barrier reads its twin's (the same warpgroup and thread of the other rank)
// through distributed shared memory in rounds of 8 words (4 where a share is no multiple of 8
// words) and adds them to its own: the sums of its share land in acc[0 ..), with the bits of the
// rank-order sum (two terms: IEEE addition commutes). The caller's second cluster barrier keeps the
// words alive until the other rank has read them.
template <class Cfg>
__device__ __forceinline__ void pair_exchange(float (&acc)[Cfg::kAcc], uint32_t xchg, int rank, int mwg, int wct) {
  constexpr int H0 = Cfg::kPairAcc, W0 = H0 / 4, W1 = (Cfg::kAcc - H0) / 4;
  constexpr int kRound = W0 % 8 == 0 && W1 % 8 == 0 ? 8 : 4;
  static_assert(W0 % kRound == 0 && W1 % kRound == 0 && W1 <= W0, "whole rounds of words");
  const uint32_t base = xchg + static_cast<uint32_t>(mwg * W0 * 128 + wct) * 16u;
  const bool one = rank != 0;
  const int hand = one ? W0 : W1, keep = one ? W1 : W0;  // words this rank hands over / keeps
  // Rank 1's accumulator i of its share: acc[H0 + i] (clamped: past kAcc only where unused).
  const auto hi = [](int i) { return H0 + i < Cfg::kAcc ? H0 + i : Cfg::kAcc - 1; };
#pragma unroll
  for (int v = 0; v < W0; ++v) {
    if (v < hand) {
      float x[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) x[e] = one ? acc[4 * v + e] : acc[hi(4 * v + e)];
      asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(base + 2048u * v), "f"(x[0]), "f"(x[1]),
                   "f"(x[2]), "f"(x[3])
                   : "memory");
    }
  }
  cluster_sync_all();
#pragma unroll
  for (int v0 = 0; v0 < W0; v0 += kRound) {
    if (v0 < keep) {
      F4 t[kRound];
#pragma unroll
      for (int v = 0; v < kRound; ++v) t[v] = ld_cluster128f(base + 2048u * (v0 + v), rank ^ 1);
#pragma unroll
      for (int v = 0; v < kRound; ++v) {
        const int i = 4 * (v0 + v);
        const F4 mine = one ? F4{acc[hi(i)], acc[hi(i + 1)], acc[hi(i + 2)], acc[hi(i + 3)]}
                            : F4{acc[i], acc[i + 1], acc[i + 2], acc[i + 3]};
        const F4 sum = small_m::add4(mine, t[v]);
        acc[i] = sum.x;
        acc[i + 1] = sum.y;
        acc[i + 2] = sum.z;
        acc[i + 3] = sum.w;
      }
    }
  }
}

// Stream-K partial sums: CTA b's warpgroup w keeps its one partial at slot (b, w) of `partials`
// ([ctas][2][kAcc][128] fp32: a warp writes 128 contiguous bytes per accumulator) and raises
// flag (b, w) once every thread's writes are visible GPU-wide.
template <class Cfg>
__device__ __forceinline__ void sk_contribute(float* partials, int* flags, const float (&acc)[Cfg::kAcc], int cta,
                                              int mwg, int wct) {
  float* slot = partials + static_cast<int64_t>(cta * Cfg::kWG + mwg) * Cfg::kAcc * 128 + wct;
#pragma unroll
  for (int i = 0; i < Cfg::kAcc; ++i) __stcg(slot + 128 * i, acc[i]);
  __threadfence();
  asm volatile("bar.sync %0, 128;" ::"r"(2 + mwg) : "memory");
  if (wct == 0)
    asm volatile("st.release.gpu.global.s32 [%0], 1;" ::"l"(flags + cta * Cfg::kWG + mwg) : "memory");
}

// The owner of a stream-K tile (K steps from 0 up to where CTA cta's range ends): adds the partials
// of CTAs cta + step, cta + 2 step, .. last (step: the schedule's group), whose ranges cover the
// rest of the tile's steps, in CTA order, as each flag rises.
template <class Cfg>
__device__ __forceinline__ void sk_gather(const float* partials, const int* flags, float (&acc)[Cfg::kAcc], int cta,
                                          int last, int step, int mwg, int wct) {
#pragma unroll 1
  for (int g = cta + step; g <= last; g += step) {
    if (wct == 0) {
      int ready = 0;
      do {
        asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(ready) : "l"(flags + g * Cfg::kWG + mwg) : "memory");
      } while (ready == 0);
    }
    asm volatile("bar.sync %0, 128;" ::"r"(2 + mwg) : "memory");
    const float* slot = partials + static_cast<int64_t>(g * Cfg::kWG + mwg) * Cfg::kAcc * 128 + wct;
#pragma unroll
    for (int i = 0; i < Cfg::kAcc; ++i) acc[i] = small_m::add_rn(acc[i], __ldcg(slot + 128 * i));
  }
}
// Two K groups: K group 1's accumulators join K group 0's (acc0 + acc1, rounded once each) through
// the exchange area, in rounds of kXchgAcc accumulators; each thread reads what its twin (same
// 64-row group, same thread of the warpgroup) wrote, so the words are thread-consecutive.
template <class Cfg>
__device__ __forceinline__ void pair_sum(float (&acc)[Cfg::kAcc], uint32_t xchg, int rg, int kg, int wct) {
  const uint32_t base = xchg + static_cast<uint32_t>(rg * kXchgAcc * 128 + wct) * 4u;
#pragma unroll
  for (int i = 0; i < Cfg::kAcc; i += kXchgAcc) {
    if (kg == 1) {
#pragma unroll
      for (int e = 0; e < kXchgAcc; ++e)
        asm volatile("st.shared.f32 [%0], %1;" ::"r"(base + 512u * e), "f"(acc[i + e]) : "memory");
    }
    asm volatile("bar.sync %0, 256;" ::"r"(4 + rg) : "memory");
    if (kg == 0) {
#pragma unroll
      for (int e = 0; e < kXchgAcc; ++e) {
        float v;
        asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(base + 512u * e) : "memory");
        acc[i + e] = small_m::add_rn(acc[i + e], v);
      }
    }
    asm volatile("bar.sync %0, 256;" ::"r"(4 + rg) : "memory");
  }
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

}  // namespace wgmma_mm
}  // namespace torch_fp4
