// The Hopper GEMM's (mm_wgmma.cu) MMA threads at one stage of the ring: where a thread reads
// inside a stage, its operands of a 64-K sub-tile (weight words; the scale-table multipliers from
// the scale words, or as the converting warps wrote them), the decode of a k16 step's codes into
// wgmma's register A operand, and one stage's k16 steps with their wgmmas, operand reads for the
// next sub-tile and the stage's release. Every template takes the kernel's Config as Cfg.
#pragma once

#include <cstdint>

#include "mm_small_m.cuh"
#include "wgmma_ops.cuh"
#include "wgmma_ptx.cuh"

namespace torch_fp4 {
namespace wgmma_mm {

using small_m::U128;

constexpr int kBK = 64;  // K elements per sub-tile (one 128-byte-swizzled activation box)

// Bytes of one sub-tile's activations (block_m rows, 16-bit) and FP4 weights (64 wg rows).
__host__ __device__ constexpr int act_sub_bytes(int bm) { return bm * kBK * 2; }
__host__ __device__ constexpr int w_sub_bytes(int wg) { return 64 * wg * kBK / 2; }

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// Byte c of word w (codes 2c, 2c + 1) -> a bf16x2 (fp16x2) word holding the two codes times
// 2^-126 (2^-14): the permute (selector c | c << 4 | (c + 4) << 8 | (c + 4) << 12) puts byte c of w
// in byte 0 and byte c of w >> 4 in byte 2, so the low nibbles of the two halves are the two
// codes; then the placement of mm_small_m.cuh.
template <bool kFp16>
__device__ __forceinline__ uint32_t decode_pair(uint32_t w, uint32_t sel) {
  const uint32_t t = __byte_perm(w, w >> 4, sel);
  if constexpr (kFp16) {
    return ((t & 0x00070007u) << 9) | ((t << 12) & 0x80008000u);
  } else {
    return ((t & 0x000F000Fu) * 0x1040u) & 0x81C081C0u;
  }
}

// The 16-bit multipliers of a sub-tile where the converting warps wrote them (kConvert; 1 KiB
// after the stage's weights, sub-tile u's u KiB further): per half h (32 K: k16 steps 2h, 2h + 1)
// 512 bytes, in them per row pair (r, r + 8) (r % 16 < 8) 8 bytes at 8 pair(r),
// pair(r) = 8 (r / 16) + r % 16: the multipliers of r at steps 2h (low half) and 2h + 1, then those
// of r + 8. Each is the scale-table entry of its block's scale, zero for K blocks past K.
__host__ __device__ constexpr int multiplier_pair(int r) { return 8 * (r >> 4) + (r & 7); }
__host__ __device__ constexpr int multiplier_offset(int r) { return 8 * multiplier_pair(r); }

// The byte offset of row r's scale word in its 128-row group's 128x4 scale words (row r + 8: 128
// further; the next 128-row group's block 512 bytes on).
__host__ __device__ constexpr int scale_word_offset(int r) { return ((r & 31) * 4 + ((r >> 5) & 3)) * 4; }

// Where an MMA thread reads inside a stage (shared-memory byte offsets from the stage's base; the
// second sub-tile's weights kW bytes further), fixed for the whole kernel. Its A fragment rows are
// r = 64 mwg + 16 warp + g and r + 8. Row layout: the FP4 tile row r is 32 bytes (K 0..63 of the
// sub-tile) with its two 16-byte chunks swapped when bit 2 of r is set (TMA's 32-byte swizzle; row
// r + 8 has the same swizzle, 256 bytes further); `sel` picks the thread's byte c = lane % 4 of
// every word. "sm90" layout: the thread's 16 bytes are at 16 * (its MMA thread index) (word j: step
// j). Either way eight rows of a warp's load are conflict-free and the four threads of a quad read
// the same scale words or multipliers (a broadcast). `scale`: the scale word of row r in its
// 128-row group's 128x4 block is word (r % 32) * 4 + (r / 32) % 4 (row r + 8: 32 words further)
// (NVFP4: the second sub-tile's block 512 bytes further); where the stage's multipliers were
// converted (kConvert), the 8 bytes of rows r and r + 8 at multiplier_offset(r), eight quads' 64
// contiguous bytes.
template <class Cfg>
struct FragmentSlot {
  uint32_t lo, hi, scale, sel;
  __device__ __forceinline__ FragmentSlot(int ct, int r, int c) {
    constexpr uint32_t kW = Cfg::kSubs * act_sub_bytes(Cfg::kBM);  // the stage's weights
    if constexpr (Cfg::kPacked) {
      lo = small_m::opaque(kW + 16u * ct);
      hi = small_m::opaque(lo + 8u);
    } else {
      lo = small_m::opaque(kW + r * 32 + (((r >> 2) & 1) << 4));
      hi = small_m::opaque(lo ^ 16u);
    }
    const int at = Cfg::kConvert ? multiplier_offset(r) : (r >> 7) * 512 + scale_word_offset(r);
    scale = small_m::opaque(kW + Cfg::kSubs * Cfg::kW + at);
    sel = small_m::opaque(static_cast<uint32_t>(c | (c << 4) | ((c + 4) << 8) | ((c + 4) << 12)));
  }
};

// One thread's operands of a 64-K sub-tile: the packed words of its rows r (w[0..7]: K 0..63) and
// r + 8 (v[0..7]) (the "sm90" layout: w[j] holds step j's eight codes of both rows, v is unused),
// their scale words, and the 16-bit multipliers of each k16 step's codes in those rows (mr[j],
// mv[j]): the scale table entry, code * scale * 2^-7 for NVFP4 (a K block of 16 per step) or
// code * scale for MXFP4 (a K block of 32 per two steps); zero past K (K is a multiple of 32)
// (kConvert: mr[h], mv[h] hold steps 2h and 2h + 1 in their two halves, as converted). Loaded
// in two halves of 32 K (steps 0-1: h = 0, with the scale words; steps 2-3: h = 1), each once the
// previous sub-tile's use of those registers is over, so that the next sub-tile's shared-memory
// reads overlap this one's last steps.
struct StageOperands {
  uint32_t w[8], v[8], mr[4], mv[4], sr, sv;
};

// Whether half h of sub-tile u of K step kt holds K elements (K from kt * kSK + 64 u + 32 h; K is a
// multiple of 32): the halves past K get zero multipliers. A stage's first half always does.
template <class Cfg>
__device__ __forceinline__ bool half_in_k(int kt, int u, int h, int k) {
  return (u == 0 && h == 0) || kt * Cfg::kSK + kBK * u + 32 * h < k;
}

// Half h of sub-tile u of the stage at `st` (K step kt of the piece: K from kt * kSK + 64 u + 32 h).
// MXFP4's scale word covers 128 K: a stage of two sub-tiles reads it with the first. kConvert: the
// half's multipliers as the converting warps wrote them, one 8-byte read.
template <class Cfg, int u, int h>
__device__ __forceinline__ void load_part(StageOperands& o, uint32_t st, uint32_t lut, int kt, int k,
                                          const FragmentSlot<Cfg>& f) {
  const uint32_t chunk = (h == 0 ? f.lo : f.hi) + u * Cfg::kW;
  if constexpr (Cfg::kPacked) {
    lds64(st + chunk, o.w[2 * h], o.w[2 * h + 1]);
  } else {
    const U128 a = lds128(st + chunk), c = lds128(st + chunk + 256);
    o.w[4 * h] = a.x; o.w[4 * h + 1] = a.y; o.w[4 * h + 2] = a.z; o.w[4 * h + 3] = a.w;
    o.v[4 * h] = c.x; o.v[4 * h + 1] = c.y; o.v[4 * h + 2] = c.z; o.v[4 * h + 3] = c.w;
  }
  if constexpr (Cfg::kConvert) {
    lds64(st + f.scale + 1024 * u + 512 * h, o.mr[h], o.mv[h]);
    return;
  }
  if (h == 0 && (u == 0 || !Cfg::kMx)) {
    o.sr = lds32(st + f.scale + 512 * u);
    o.sv = lds32(st + f.scale + 512 * u + 128);
  }
  const bool ok = half_in_k<Cfg>(kt, u, h, k);
#pragma unroll
  for (int j = 2 * h; j < 2 * h + 2; ++j) {
    // Scale byte of step j (one sub-tile per stage here): NVFP4 byte j (16-wide K blocks); MXFP4
    // byte 2 (64-K index % 2) + j / 2.
    const int byte = !Cfg::kMx ? j : 2 * (kt & 1) + h;
    if (Cfg::kMx && (j & 1)) {
      o.mr[j] = o.mr[j - 1];
      o.mv[j] = o.mv[j - 1];
    } else {
      o.mr[j] = ok ? lds32(lut + 4 * ((o.sr >> (8 * byte)) & 0xFFu)) : 0u;
      o.mv[j] = ok ? lds32(lut + 4 * ((o.sv >> (8 * byte)) & 0xFFu)) : 0u;
    }
  }
}

// The 16-bit value in half `hi` of x, in both halves: the multiply's operand (ptxas folds it into
// the HMUL2's .H0_H0 / .H1_H1 operand selector, no instruction of its own).
__device__ __forceinline__ uint32_t half_pair(uint32_t x, int hi) {
  uint32_t d;
  if (hi) {
    asm("{.reg .b16 l, h;\nmov.b32 {l, h}, %1;\nmov.b32 %0, {h, h};}" : "=r"(d) : "r"(x));
  } else {
    asm("{.reg .b16 l, h;\nmov.b32 {l, h}, %1;\nmov.b32 %0, {l, l};}" : "=r"(d) : "r"(x));
  }
  return d;
}

// Step j's A fragment: a[0] = row r, K 2c, 2c + 1 (byte c of word 2j); a[1] = row r + 8, same K;
// a[2], a[3] = K 2c + 8, 2c + 9 (byte c of word 2j + 1). Exact 16-bit values.
template <class Cfg>
__device__ __forceinline__ void decode_step(uint32_t (&a)[4], const StageOperands& o, int j, uint32_t sel) {
  const uint32_t r = Cfg::kConvert ? half_pair(o.mr[j >> 1], j & 1) : o.mr[j];
  const uint32_t v = Cfg::kConvert ? half_pair(o.mv[j >> 1], j & 1) : o.mv[j];
  const uint32_t m[4] = {r, v, r, v};
  uint32_t x[4];
  if constexpr (Cfg::kPacked) {
    if constexpr (Cfg::kFp16) {
      small_m::place_sm90_f16(o.w[j], x);
    } else {
      small_m::place_sm90_bf16(o.w[j], x);
    }
  } else {
    const uint32_t in[4] = {o.w[2 * j], o.v[2 * j], o.w[2 * j + 1], o.v[2 * j + 1]};
#pragma unroll
    for (int e = 0; e < 4; ++e) x[e] = decode_pair<Cfg::kFp16>(in[e], sel);
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) a[e] = small_m::apply_scale<Cfg>(x[e], m[e]);
}

// One stage's 4 kSubs k16 steps of an MMA thread (stage at `st`, K step kt), on `ops` (its first
// sub-tile's, read during the previous stage): per step decode into its A registers (at most
// Cfg::kInFlight steps are in flight there, so frag[j % kFragSets]'s last reader, kFragSets steps
// back, has completed; kFragSets divides the stage's steps), the wgmma m64nNk16 (K 16 j.. of the
// stage; the second sub-tile's activations a box further) as one commit group, and a wait down to
// kInFlight groups in flight. Once a half's operands are spent (after steps 1 and 3 of a sub-tile)
// the next sub-tile's are read: this stage's second, or the next stage's first (at `nst`, K step
// nkt). After step kInFlight - 1 only this stage's steps are in flight, so the previous stage goes
// back to the producer (its empty barrier `prev_empty`, when `release`).
// A predicated release, not a branch: ptxas would serialize wgmmas around a branch.
template <class Cfg>
__device__ __forceinline__ void stage_steps(float (&acc)[Cfg::kAcc], uint32_t (&frag)[Cfg::kFragSets][4], StageOperands& ops,
                                            const FragmentSlot<Cfg>& slot, uint64_t desc, uint32_t st, int kt,
                                            uint32_t nst, uint32_t lut, int nkt, int k, uint32_t prev_empty,
                                            bool release) {
#pragma unroll
  for (int j = 0; j < 4 * Cfg::kSubs; ++j) {
    const int u = j / 4, q = j % 4;
    uint32_t (&a)[4] = frag[j % Cfg::kFragSets];
    decode_step<Cfg>(a, ops, q, slot.sel);
    wgmma_fence();
    WgmmaRS<Cfg::kBM, Cfg::kFp16>::mma(acc, a, desc + u * (act_sub_bytes(Cfg::kBM) >> 4) + 2 * q);
    wgmma_commit();
    const bool last_sub = u + 1 == Cfg::kSubs;
    if (q == 1) {
      if (last_sub) load_part<Cfg, 0, 0>(ops, nst, lut, nkt, k, slot);
      else load_part<Cfg, 1, 0>(ops, st, lut, kt, k, slot);
    }
    if (q == 3) {
      if (last_sub) load_part<Cfg, 0, 1>(ops, nst, lut, nkt, k, slot);
      else load_part<Cfg, 1, 1>(ops, st, lut, kt, k, slot);
    }
    wgmma_wait<Cfg::kInFlight>();
    if (j == Cfg::kInFlight - 1) {
      __syncwarp();
      release_stage(prev_empty, release);
    }
  }
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

}  // namespace wgmma_mm
}  // namespace torch_fp4
