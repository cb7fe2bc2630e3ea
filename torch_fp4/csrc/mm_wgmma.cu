// Hopper FP4-weight GEMM (sm_90a) of the cuda backend, for M above the small-M kernel's range.
//
// Swap-AB warpgroup MMA with the FP4 weights decoded into wgmma's register A operand: the weight
// rows are the wgmma's M side (64 per MMA warpgroup, two warpgroups: 128 per CTA), the
// activation rows its N side (block_m = 32, 64, 96, 128, 160, 192, 224 or 256 per CTA), K in stages of two 64-K
// sub-tiles or one (stage_subs below), one ring of `stages` stages, one full / empty mbarrier pair
// per stage:
// - a producer warpgroup (three loader threads, one per operand) loads, per sub-tile, the
//   activation tile [block_m, 64] bf16/fp16 by TMA in wgmma's 128-byte swizzle (the last tile of
//   an M that is no multiple of block_m through a second map whose box holds only its rows: a box
//   reaching past M loads slowly; the rows past M keep stale values that reach only output rows
//   past M, never stored) and the FP4 weight
//   tile [rows, 32 bytes] by TMA (32-byte swizzle: conflict-free reads) or, for weights in the
//   "sm90" layout (docs/NUMERICS.md 4b), the stage's contiguous 4 KiB per sub-tile by one bulk
//   copy, and per stage its 128x4 scale words by a bulk copy, all completing on the stage's "full" mbarrier, once the
//   stage is "empty";
// - in the kernels with stages of two 64-K sub-tiles (kConvert), the producer warpgroup's warps 2
//   and 3 turn each stage's scale words, once they landed (on a barrier of their own, copied ahead
//   of the stage's tiles), into the 16-bit multipliers in their place (convert_stages: once per
//   CTA, not per thread of each quad that reads them; NVFP4 by the hardware's e4m3 conversion,
//   without the scale table) and mark the stage "ready", which the MMA warps wait for beside "full";
// - each MMA thread reads the two weight rows of its A fragment (rows g and g + 8 of its warp's
//   16) and their scale words (kConvert: their multipliers), then per k16 step decodes its eight
//   codes straight into the four bf16x2 / fp16x2 A registers of that step: exact (row-major weights: a byte permute places the
//   two codes of a byte, the bit placement of mm_small_m.cuh gives E2M1 * 2^-126 (2^-14 for fp16);
//   "sm90" weights: one 8-byte read per two steps, one to four integer instructions per register
//   (place_sm90_bf16, mm_small_m.cuh) give the same placement; then one
//   multiply by the scale table entry gives code * scale * 2^-7 for NVFP4; MXFP4 multiplies by
//   2^126 and by the scale); K blocks past K get a zero scale, so padding scale bytes never reach
//   the sums. The step's `wgmma.mma_async` m64nNk16 (A from registers, B = the activation tile in
//   shared memory, fp32 accumulators) is one commit group; the A registers of Config::kFragSets
//   steps rotate, and waiting until at most kFragSets - 1 groups are in flight before each decode
//   keeps a step's registers untouched while its wgmma may read them, so ptxas keeps the wgmmas
//   asynchronous and the decode of step j + 1 overlaps the wgmmas of steps j - 2 .. j (seven in
//   flight, j - 6 .. j, at block_m <= 64 with one K group and one CTA per SM). A stage goes back to
//   the producer once all its wgmmas completed (kInFlight - 1 steps into the next stage). The barrier wait,
//   the release, the ring position and the lookahead's bookkeeping are paid once per stage, so
//   per 128 K where the stage holds two sub-tiles.
// Tiles: 128 weight rows x block_m activation rows, numbered weight-tile fastest. block_m <= 64
// also compiles for two CTAs per SM (Config::kCtas: 80 registers per thread at launch, 96 per MMA
// thread after setmaxnreg, half the shared memory each). A persistent launch runs as many CTAs as
// fit at once (one or two per SM), each taking tiles blockIdx.x, + gridDim.x, ...: the stage ring runs
// on across tiles, so the producer loads the next tile while the MMA warpgroups store this one,
// and the last stage's lookahead reads the next tile's first operands. Its epilogue leaves the
// stages alone: each MMA warpgroup passes its rows through its own small staging area, 32
// activation rows at a time: for 16-bit outputs with 16-byte rows (N % 8 == 0) rounded in
// registers, written by transposed stmatrix and stored by TMA tensor stores that run on behind
// the next chunk and the next tile (store_tma); otherwise as fp32 that every thread stores 4
// outputs at a time (store_staged). A one-tile-per-CTA launch (split-K, or `persistent` off) puts
// the whole fp32 tile ([block_m][rows + 4], conflict-free) over the drained pipeline and stores 4
// outputs per thread at a time, in rounds of Config::kEpiBatch chunks whose reads are all issued
// before the first is used. Every path undoes the 2^-7 fold, applies alpha and rounds once.
// Split-K: the CTAs of one output tile form a cluster along K; each reduces
// a share of the rows by reading ranks 0, 1, ... in order through distributed shared memory
// (deterministic, no atomics). Split 2 at block_m 128 / 192 / 256 (one K group, one CTA per SM)
// with 16-bit outputs of 16-byte rows has a kernel of its own (Config::kPair): each rank keeps the
// accumulators of half the tile's activation rows, hands the other half's to the other rank through
// distributed shared memory (pair_exchange), adds the other rank's to its own and stores its half
// from registers as persistent launches do (transposed stmatrix, TMA tensor stores): half the
// shared-memory traffic of the fp32 tile, and no store loop.
// Stream-K (persistent launches, when the tiles do not fill whole waves of the launch's CTAs):
// the tiles of all whole waves but the last are taken as above; the K steps of the remaining
// tiles (one to two waves' worth) are shared out evenly, so each CTA runs one range of them that
// crosses at most two tile boundaries. The ranges go to groups of up to four CTAs
// (mm_wgmma_schedule.cuh): the CTAs of a group run the same K steps of side-by-side weight tiles
// (the same activation rows), so their activation reads reach the L2 together, as whole tiles'
// do (about a fifth fewer L2 sectors at 28672 x 8192, M = 256). The CTA holding a tile's first K
// step owns the tile: the later CTAs that ran the rest of its steps (one group apart each; their
// first piece of work in that range) each write their fp32 partial sums to global memory and
// raise a flag, and the owner adds them to its own in CTA order (deterministic) before its
// epilogue. Owners wait only for later CTAs, whose partial is the first thing their range
// computes, so every wait ends while the launch is resident (a persistent launch never has more
// CTAs than fit at once).
// Grouped launches (fused_moe's GEMMs; Params::block_expert): the activation rows are blocks of
// block_m rows, block b multiplying expert block_expert[b]'s weights (the TMA map spans every
// expert's rows, expert after expert; "sm90" tiles and scale blocks are offset per expert) and
// alpha[e]; blocks past the used rows (-1, all after the used ones) end a persistent CTA's tile
// list, or a one-tile CTA (every split of its cluster alike) before any work.
// Two K groups (Config::kKG = 2; "sm90" weights, block_m <= 64, one CTA per SM): four MMA warpgroups, two per 64
// weight rows; K group 0 takes the CTA's even stages and K group 1 its odd ones (each reading its
// next stage's operands during this one's steps), into accumulators of their own; at a tile's end
// K group 1 hands its sums to K group 0 through a small exchange area (acc0 + acc1, rounded once
// each), which alone runs the epilogue, while K group 1 goes on to the next tile. Twice the MMA
// warps per SM on the same tiles and stage ring, for the M where one CTA's 8 MMA warps leave the
// SM waiting on their serial chains of reads, decodes and wgmma issues.
// Numerics are those of mm_small_m (exact products, fp32 accumulation in the tensor core).
#include <algorithm>
#include <cstdint>

#include <cuda.h>
#include <cuda_runtime.h>

#include "capi.h"
#include "launch.h"
#include "mm_small_m.cuh"
#include "mm_wgmma.h"
#include "pdl.cuh"
#include "mm_wgmma_schedule.cuh"
#include "mm_wgmma_epilogue.cuh"
#include "mm_wgmma_stage.cuh"
#include "wgmma_ops.cuh"
#include "wgmma_ptx.cuh"

namespace torch_fp4 {
namespace wgmma_mm {

using small_m::F4;
using small_m::operand_params;
using small_m::Params;
using small_m::U128;

constexpr int kMaxSplit = 8;
constexpr int kPairMinBM = 128;   // the split-2 kernel (Config::kPair) from this block_m up
constexpr int kMaxStages = 12;
// With kConvert the stages' mbarriers lie in rows of kMaxStages (kBarRow bytes apart): "full",
// "empty", "ready" (the multipliers are written), "scales" (the scale words landed).
enum BarrierRow : int { kFullRow = 0, kEmptyRow = 1, kReadyRow = 2, kScalesRow = 3 };
constexpr uint32_t kBarRow = 8 * kMaxStages;
constexpr int kMaxDevices = 64;

// 64-K sub-tiles per stage. Two (128 K: one full/empty barrier pair, one ring step and one
// lookahead wait per 128 K, about 12% fewer instructions per HGMMA, and the scales converted once
// per CTA, kConvert) up to block_m 128, for both weight layouts (BENCHMARKS.md); one at block_m 256
// (three 128-K stages do not fit beside the persistent epilogue's staging) and 160 to 224 (half as
// many 128-K stages measured slower there), and at block_m 64 with two CTAs per SM (three 128-K
// stages in half the shared memory keep too few bytes in flight).
__host__ __device__ constexpr int stage_subs(int bm, int ctas) {
  return bm <= 128 && !(bm == 64 && ctas == 2) ? 2 : 1;
}

// Shared-memory geometry of a tile: block_m activation rows, 64 * wg weight rows (wg MMA
// warpgroups). Stage: [activations of each sub-tile (128-byte swizzle, 1 KiB aligned)][FP4
// weights of each sub-tile][1 KiB per sub-tile: the stage's 128x4 scale words (NVFP4: 512 bytes per
// 64 K and 128 rows, MXFP4: 512 per 128 K), with two sub-tiles then in their place the
// multipliers (convert_stages)]. Smem: [1 KiB alignment slack][1 KiB scale table]
// [1 KiB barriers][stages | epilogue tile [block_m][rows + 4] fp32], or for persistent launches
// [stages][per MMA warpgroup: epilogue staging [32][64 + 4] fp32, or two 4 KiB buffers of
// [32][64] 16-bit outputs for the TMA stores (1 KiB aligned: the stages are whole KiB)].
__host__ __device__ constexpr int stage_bytes(int bm, int wg, int subs) {
  return subs * (act_sub_bytes(bm) + w_sub_bytes(wg) + 1024);
}
__host__ __device__ constexpr int xchg_bytes(int wg, int kg) { return kg == 1 ? 0 : wg * kXchgAcc * 128 * 4; }
__host__ __device__ constexpr int smem_bytes(int bm, int wg, int subs, int stages, bool persistent, int kg) {
  const int pipe = stages * stage_bytes(bm, wg, subs), tile = bm * (64 * wg + 4) * 4;
  if (persistent) return 3 * 1024 + xchg_bytes(wg, kg) + pipe + wg * kChunkM * kStagePitch * 4;
  return 3 * 1024 + xchg_bytes(wg, kg) + (pipe > tile ? pipe : tile);
}

template <int kBM_, bool kFp16_, bool kMx_, bool kPacked_, int kCtas_ = 1, int kKG_ = 1, bool kPair_ = false>
struct Config {
  static constexpr int kBM = kBM_;
  // One-tile split-2 launches with 16-bit outputs and 16-byte output rows (pair_launch), a kernel
  // of their own: each rank finishes half of the tile's activation rows from its accumulators
  // (pair_exchange, then store_tma), the exchange words (kPairXchg bytes) then the TMA-store
  // buffers over the drained stages. Its own instantiation: the same epilogue inside the other
  // kernels moved ptxas's main loop of their persistent launches (BENCHMARKS.md, "FP4 GEMM on
  // Hopper: split-2 tiles stored from registers; ...").
  static constexpr bool kPair = kPair_;
  static constexpr int kCtas = kCtas_;             // CTAs per SM (launch bounds, register split)
  // K groups: MMA warpgroups per 64 weight rows. With 2, K group 0 takes the CTA's even stages and
  // K group 1 its odd ones, into accumulators of their own that meet in shared memory at the
  // tile's end: twice the MMA warps per SM on the same tile and stage ring.
  static constexpr int kKG = kKG_;
  // Registers per thread after setmaxnreg: one CTA per SM gives its MMA threads 232 (the launch
  // leaves 168 each); two CTAs leave 80 each, so the MMA threads get (80 * 384 - 40 * 128) / 256;
  // two K groups (640 threads) leave 96 each: (96 * 640 - 40 * 128) / 512 = 110, rounded to 8.
  static constexpr int kMmaRegs = kCtas_ == 2 ? 96 : kKG_ == 2 ? 104 : 232;
  static constexpr int kWG = 2;                    // 64-row groups of weight rows
  static constexpr int kRows = 64 * kWG;           // weight rows per CTA
  static constexpr int kEpi = 128 * kWG;           // MMA threads of K group 0 (they store the tile)
  static constexpr int kMma = kEpi * kKG_;         // MMA threads
  static constexpr int kThreads = 128 + kMma;      // producer warpgroup + MMA warpgroups
  static constexpr int kXchg = xchg_bytes(kWG, kKG_);
  static_assert(kKG_ == 1 || (kKG_ == 2 && kCtas_ == 1 && kBM_ <= 64 && kPacked_),
                "two K groups: one CTA per SM, block_m <= 64, \"sm90\" weights (104 registers per MMA "
                "thread; row-major weights' stage operands would spill)");
  static constexpr int kPitch = kRows + 4;         // fp32 words per row of the epilogue tile
  static constexpr int kW = w_sub_bytes(kWG);
  static constexpr int kSubs = stage_subs(kBM_, kCtas_);  // 64-K sub-tiles per stage
  static constexpr int kSK = kBK * kSubs;                 // K elements per stage
  static constexpr int kStage = stage_bytes(kBM_, kWG, kSubs);
  static constexpr bool kFp16 = kFp16_;
  static constexpr bool kMx = kMx_;
  static constexpr bool kPacked = kPacked_;  // weights in the "sm90" fragment layout, else rows
  static constexpr bool kFold = !kMx;
  static constexpr int kAcc = kBM / 2;  // fp32 accumulators per consumer thread
  // Split 2 (kPair): rank 0 stores the tile's first kPairChunks 32-row chunks (half, rounded up:
  // block_m 160 and 224 split 3 + 2 and 4 + 3), rank 1 the rest; kPairAcc of the accumulators are
  // rank 0's, and kPairXchg bytes hold the larger share a rank hands over.
  static constexpr int kPairChunks = (kBM / kChunkM + 1) / 2;
  static constexpr int kPairAcc = kPairChunks * kChunkM / 2;
  static constexpr int kPairXchg = kWG * kPairAcc * 128 * 4;
  // Chunks per thread and round of the one-tile epilogue's store loop: 4 where the MMA threads
  // have 232 registers, 2 in the 96 / 104-register kernels (4 spills there).
  static constexpr int kEpiBatch = kMmaRegs >= 232 ? 4 : 2;
  // Stages of two sub-tiles: the producer's warps 2 and 3 convert the scale words into multipliers
  // (convert_stages). At one sub-tile per stage (block_m >= 160, two CTAs per SM at block_m 64)
  // each MMA thread forms its own from the scale table:
  // 1024 x 8192 x 8192 (block_m 256) took 2.5% more cycles with the conversion (BENCHMARKS.md).
  static constexpr bool kConvert = kSubs == 2;
  // wgmma commit groups (k16 steps) an MMA warpgroup keeps in flight, and the sets of A registers
  // that rotate under them: seven where stages hold two sub-tiles at block_m <= 64 with one K group
  // and one CTA per SM (232 registers), else three. Seven release each stage four steps later, so
  // they lost where a launch has few stages (block_m 96 / 128 persistent).
  static constexpr int kInFlight = (kSubs == 2 && kMmaRegs >= 232 && kBM_ <= 64) ? 7 : 3;
  static constexpr int kFragSets = kInFlight + 1;
  static_assert((4 * kSubs) % kFragSets == 0 && kInFlight < 4 * kSubs,
                "a stage's k16 steps cycle through whole sets of A registers and release the stage before it ends");
  // Loaders, each lane 0 of its warp: activations, weights (and with kConvert the scale words),
  // and without kConvert the scale words.
  static constexpr int kLoaders = kConvert ? 2 : 3;
  static_assert(kBM_ % kChunkM == 0, "the persistent epilogue stores whole 32-row chunks");
  static_assert(!kPair_ || (kKG_ == 1 && kCtas_ == 1 && kBM_ >= kPairMinBM),
                "the split-2 epilogue: one K group, one CTA per SM, block_m >= 128");
  static_assert(kWG * 2 * kOutBuffer <= kWG * kChunkM * kStagePitch * 4,
                "the TMA-store epilogue's two 16-bit buffers per warpgroup fit its fp32 staging area");
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// The NVFP4 multipliers of scale bytes 2h and 2h + 1 of `word` (low half: byte 2h), without the
// scale table: the hardware's exact e4m3 -> f16 conversion (every e4m3 value is a normal f16 or
// zero, NaN stays NaN), then times 2^7 in f16 (fp16 activations), or through f32 times 2^119 to
// bf16 (4 significant bits: exact): the scale table's entries (scale_table_entry), NaN payloads aside.
template <bool kFp16>
__device__ __forceinline__ uint32_t nvfp4_multipliers(uint32_t word, int h) {
  const uint16_t pair = static_cast<uint16_t>(h ? word >> 16 : word);
  uint32_t x, d;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(x) : "h"(pair));
  if constexpr (kFp16) {
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(x), "r"(0x58005800u));  // 2^7 twice
  } else {
    float lo, hi;
    asm("{.reg .b16 l, u;\nmov.b32 {l, u}, %2;\ncvt.f32.f16 %0, l;\ncvt.f32.f16 %1, u;}" : "=f"(lo), "=f"(hi) : "r"(x));
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi * 0x1p119f), "f"(lo * 0x1p119f));
  }
  return d;
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// The K steps and tiles a producer thread walks (the CTA's work list): computed in each producer
// role, not shared with the MMA warps' copies in the kernel's prologue (values live across the
// split into the 40-register producer would be spilled).
template <class Cfg>
struct ProducerSpan {
  int cta, k, n_tiles, kt0, kt1;
  __device__ __forceinline__ explicit ProducerSpan(const Params& p) {
    int rank;
    asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(cta));
    asm volatile("mov.u32 %0, %%ctaid.z;" : "=r"(rank));
    k = small_m::opaque(static_cast<int>(p.k));
    n_tiles = (small_m::opaque(static_cast<int>(p.n)) + Cfg::kRows - 1) / Cfg::kRows;
    const int tiles = (k + Cfg::kSK - 1) / Cfg::kSK;
    kt0 = rank * p.steps_per_split;
    kt1 = min(tiles, kt0 + p.steps_per_split);
  }
};

// kConvert: the producer warpgroup's warps 2 and 3 (cw 0, 1), per stage, once its scale words
// landed ("scales", copied ahead of its tiles): the 16-bit multipliers of each sub-tile in place of
// the stage's scale words (multiplier_offset, mm_wgmma_stage.cuh), then one arrival per lane on the
// stage's "ready" mbarrier, which the MMA warps wait for beside "full". Each multiplier is formed
// once per CTA, not by every thread of the quads that read it. Lane l of warp cw takes the row pair
// 32 cw + l (rows 16 (l / 8) + l % 8 + 64 cw and 8 further): it reads their scale words of the
// whole stage (NVFP4: byte j of a sub-tile's word is k16 step j's block; MXFP4: one word per 128 K,
// byte 2 (64-K index % 2) + h per half), waits for both warps (the words and the multipliers share
// the slot), and only then overwrites them: NVFP4 by nvfp4_multipliers, MXFP4 from the scale table.
// K blocks past K get a zero multiplier.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
template <class Cfg>
__device__ __forceinline__ void convert_stages(const Params& p, const Schedule& sc, int stages, uint32_t scales,
                                               uint32_t ready, uint32_t pipe, uint32_t lut, int cw) {
  const ProducerSpan<Cfg> span(p);
  const int lane = static_cast<int>(threadIdx.x) & 31, k = span.k;
  constexpr int kWords = Cfg::kMx ? 1 : Cfg::kSubs;  // scale words per row and stage
  // Rows r and r + 8 of the lane's pair (32 cw + lane): their scale words' offsets. The pair's
  // multipliers go to multiplier_offset(r) = 8 (lane + 32 cw).
  uint32_t woff[2];
#pragma unroll
  for (int q = 0; q < 2; ++q) woff[q] = scale_word_offset(16 * (lane >> 3) + (lane & 7) + 8 * q + 64 * cw);
  int s = 0, phase = 0;
  WorkList list(sc, span.cta);
  for (Work w; list.next(sc, p, span.n_tiles, span.kt0, span.kt1, w);) {
#pragma unroll 1
    for (int kt = w.kb; kt < w.ke; ++kt, s = s + 1 == stages ? 0 : s + 1, phase ^= s == 0) {
      mbar_wait(scales + 8 * s, phase);
      const uint32_t slot = pipe + s * Cfg::kStage + Cfg::kSubs * (act_sub_bytes(Cfg::kBM) + Cfg::kW);
      uint32_t word[kWords][2];
#pragma unroll
      for (int u = 0; u < kWords; ++u)
#pragma unroll
        for (int q = 0; q < 2; ++q) word[u][q] = lds32(slot + 512 * u + woff[q]);
      // Every lane's words of both warps read before any write: the two warps' words and
      // multipliers share the slot.
      asm volatile("bar.sync 15, 64;" ::: "memory");  // named barrier 15: the converting warps alone
#pragma unroll
      for (int u = 0; u < Cfg::kSubs; ++u)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const bool ok = half_in_k<Cfg>(kt, u, h, k);
          uint32_t m2[2];
#pragma unroll
          for (int t = 0; t < 2; ++t) {
            const uint32_t wd = word[Cfg::kMx ? 0 : u][t];
            if constexpr (!Cfg::kMx) {
              m2[t] = ok ? nvfp4_multipliers<Cfg::kFp16>(wd, h) : 0u;
            } else {
              const int byte = 2 * u + h;  // both steps' block (the 128-K word's byte 2 (64-K index % 2) + h)
              m2[t] = ok ? lds32(lut + 4 * ((wd >> (8 * byte)) & 0xFFu)) : 0u;  // the entry, twice
            }
          }
          sts64(slot + 1024 * u + 512 * h + 8 * (lane + 32 * cw), m2[0], m2[1]);
        }
      // The stage's next bytes come by the async proxy (the loaders' copies): order these writes first.
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      mbar_arrive(ready + 8 * s);
    }
  }
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// The producer warpgroup's loaders, each one thread (lane 0 of its warp) running the CTA's work
// list on its own: 0 loads the activation tile by TMA (one box per 64-K sub-tile), 1 the FP4
// weight tile (TMA per sub-tile, or for "sm90" weights the stage's contiguous 4 KiB per sub-tile
// by one bulk copy), 2 the stage's 128x4 scale words by one bulk copy (NVFP4: 512 bytes per
// sub-tile, whose blocks are contiguous; MXFP4: the 512-byte block of 128 K; with kConvert loader 1
// copies them first, on the stage's "scales" barrier, kScalesRow). Per stage each waits
// until the stage is empty, then arrives on its "full" barrier announcing its bytes and issues its copies
// (the barrier completes once all Cfg::kLoaders arrived and every byte landed): two or three threads
// in parallel instead of one serial chain of waits, address arithmetic and copies per stage. Where the stage's
// second sub-tile lies past K (K % 128 == 64), the TMA boxes read zeros and the bulk copies, which
// have no bounds, skip it; its steps multiply those zeros by zero scales.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
template <class Cfg, int kLoader>
__device__ __forceinline__ void load_stages(const CUtensorMap& act_map, const CUtensorMap& tail_map,
                                            const CUtensorMap& w_map, const Params& p, const Schedule& sc,
                                            int stages, uint32_t full, uint32_t empty, uint32_t pipe) {
  if constexpr (kLoader == 0) {
    asm volatile("prefetch.tensormap [%0];" ::"l"(&act_map) : "memory");
    if (p.m % Cfg::kBM != 0) asm volatile("prefetch.tensormap [%0];" ::"l"(&tail_map) : "memory");
  }
  if constexpr (kLoader == 1 && !Cfg::kPacked) asm volatile("prefetch.tensormap [%0];" ::"l"(&w_map) : "memory");
  const ProducerSpan<Cfg> span(p);
  const int k = span.k, n_tiles = span.n_tiles;
  // Stage slot s and the parity of its use, kept incrementally across tiles (no division).
  int s = 0, phase = 0;
  WorkList list(sc, span.cta);
  for (Work w; list.next(sc, p, n_tiles, span.kt0, span.kt1, w);) {
    const int t = w.tile;
    const int n0 = (t % n_tiles) * Cfg::kRows, m0 = (t / n_tiles) * Cfg::kBM;
    // The last activation tile of an M that is no multiple of block_m: the tail map's box holds
    // only its M - m0 rows (BENCHMARKS.md, "FP4 GEMM on Hopper: split-2 tiles stored from registers;
    // at M between the tile sizes, ...").
    const bool tail = m0 + Cfg::kBM > p.m;
    const CUtensorMap* a_map = tail ? &tail_map : &act_map;
    const uint32_t a_bytes = (tail ? p.m - m0 : Cfg::kBM) * kBK * 2;
    // "sm90" weights: per 128-row group, its K / 64 sub-tiles of 4 KiB in K order.
    const uint8_t* w_src =
        p.w + w.expert * p.w_expert + (static_cast<int64_t>(n0 / 128) * (k / kBK) + w.kb * Cfg::kSubs) * Cfg::kW;
    const uint8_t* s_src = p.w_scale + w.expert * p.s_expert + static_cast<int64_t>(n0 / 128) * (p.kp / 4) * 512;
#pragma unroll 1
    for (int kt = w.kb; kt < w.ke; ++kt, s = s + 1 == stages ? 0 : s + 1, phase ^= s == 0) {
      mbar_wait(empty + 8 * s, phase ^ 1);
      const uint32_t st = pipe + s * Cfg::kStage, wt = st + Cfg::kSubs * act_sub_bytes(Cfg::kBM), bar = full + 8 * s;
      const int k0 = kt * Cfg::kSK;
      const bool two = Cfg::kSubs == 2 && k0 + kBK < k;  // the second sub-tile holds K elements
      if constexpr (kLoader == 0) {
        mbar_expect_tx(bar, Cfg::kSubs * a_bytes);
        tma_2d(st, a_map, bar, k0, m0);
        if (Cfg::kSubs == 2) tma_2d(st + act_sub_bytes(Cfg::kBM), a_map, bar, k0 + kBK, m0);
      } else if constexpr (kLoader == 1) {
        if constexpr (Cfg::kConvert) {
          const int block = Cfg::kMx ? k0 / 128 : k0 / kBK;
          const uint32_t s_bytes = !Cfg::kMx && two ? 1024 : 512, s_bar = bar + kScalesRow * kBarRow;
          mbar_expect_tx(s_bar, s_bytes);
          bulk_copy(wt + Cfg::kSubs * Cfg::kW, s_src + static_cast<int64_t>(block) * 512, s_bytes, s_bar);
        }
        if constexpr (Cfg::kPacked) {
          const uint32_t bytes = (two ? 2 : 1) * Cfg::kW;
          mbar_expect_tx(bar, bytes);
          bulk_copy(wt, w_src, bytes, bar);
          w_src += Cfg::kSubs * Cfg::kW;
        } else {  // the map's rows are every expert's, expert after expert
          mbar_expect_tx(bar, Cfg::kSubs * Cfg::kW);
          tma_2d(wt, &w_map, bar, k0 / 2, w.expert * p.n + n0);
          if (Cfg::kSubs == 2) tma_2d(wt + Cfg::kW, &w_map, bar, k0 / 2 + kBK / 2, w.expert * p.n + n0);
        }
      } else {
        // 128x4 blocks of 4 K blocks: NVFP4 one per 64 K, MXFP4 one per 128 K.
        const int block = Cfg::kMx ? k0 / 128 : k0 / kBK;
        const uint32_t bytes = !Cfg::kMx && two ? 1024 : 512;
        mbar_expect_tx(bar, bytes);
        bulk_copy(wt + Cfg::kSubs * Cfg::kW, s_src + static_cast<int64_t>(block) * 512, bytes, bar);
      }
    }
  }
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// An MMA thread's wait for a stage: its activations, weights and scale words landed ("full", at
// `full`), and with kConvert its multipliers are written ("ready", row kReadyRow).
template <class Cfg>
__device__ __forceinline__ void stage_wait(uint32_t full, uint32_t parity) {
  mbar_wait(full, parity);
  if constexpr (Cfg::kConvert) mbar_wait(full + kReadyRow * kBarRow, parity);
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kCtas)
    wgmma_mm_kernel(const __grid_constant__ CUtensorMap act_map, const __grid_constant__ CUtensorMap tail_map,
                    const __grid_constant__ CUtensorMap w_map,
                    const __grid_constant__ CUtensorMap out_map, const Params p, const Schedule sc, void* workspace,
                    int stages, int persistent, int out_tma) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ char smem_raw[];
  char* smem = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  uint32_t* lut = reinterpret_cast<uint32_t*>(smem);
  // The stages' barriers: "full" (the stage's bytes landed), "empty" (its MMA warps are done with
  // it); with kConvert in rows (BarrierRow), with "ready" and "scales".
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + 1024);
  uint64_t* empty = full + (Cfg::kConvert ? kEmptyRow * kMaxStages : stages);
  uint64_t* ready = full + kReadyRow * kMaxStages;
  uint64_t* scales = full + kScalesRow * kMaxStages;
  const uint32_t xchg = smem_u32(smem + 2048);  // two K groups' exchange area (kXchg bytes)
  char* pipe = smem + 2048 + Cfg::kXchg;
  const int tid = static_cast<int>(threadIdx.x);
  const int n_tiles = (p.n + Cfg::kRows - 1) / Cfg::kRows;  // output tiles: sc.total, weight tile fastest
  const int cta = static_cast<int>(blockIdx.x);
  const int rank = static_cast<int>(blockIdx.z), splits = static_cast<int>(gridDim.z);
  const int tiles = (p.k + Cfg::kSK - 1) / Cfg::kSK;  // K steps (stages) per tile
  const int kt0 = rank * p.steps_per_split;
  const int kt1 = min(tiles, kt0 + p.steps_per_split);
  constexpr int kStage = Cfg::kStage;

  for (int i = tid; i < 256; i += Cfg::kThreads) lut[i] = small_m::scale_table_entry<Cfg>(static_cast<uint32_t>(i));
  if (tid == 0) {
    for (int s = 0; s < stages; ++s) {
      mbar_init(full + s, Cfg::kLoaders);  // each loader arrives with its bytes
      mbar_init(empty + s, Cfg::kEpi / 32);  // one arrival per MMA warp of the stage's K group
      if (Cfg::kConvert) {
        mbar_init(ready + s, 64);  // one arrival per lane of the two converting warps
        mbar_init(scales + s, 1);  // loader 1 arrives with the scale words
      }
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  pdl_wait();
  // A grouped launch's CTA whose one tile lies past the used rows (every split of that tile
  // alike, so a cluster leaves whole) has nothing to do.
  if (!persistent && p.block_expert != nullptr && __ldg(p.block_expert + cta / n_tiles) < 0) return;

  if (tid < 128) {  // producer warpgroup: lane 0 of warps 0, 1 (and 2 without kConvert): loaders
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    const int loader = tid >> 5;
    if ((tid & 31) == 0) {
      const uint32_t f = smem_u32(full), e = smem_u32(empty), d = smem_u32(pipe);
      if (loader == 0) load_stages<Cfg, 0>(act_map, tail_map, w_map, p, sc, stages, f, e, d);
      if (loader == 1) load_stages<Cfg, 1>(act_map, tail_map, w_map, p, sc, stages, f, e, d);
      if (!Cfg::kConvert && loader == 2) load_stages<Cfg, 2>(act_map, tail_map, w_map, p, sc, stages, f, e, d);
    }
    if (Cfg::kConvert && loader >= 2) {  // warps 2 and 3, every lane
      convert_stages<Cfg>(p, sc, stages, smem_u32(scales), smem_u32(ready), smem_u32(pipe), smem_u32(lut), loader - 2);
    }
    __syncwarp();  // lane 0 rejoins its warp: the cluster barriers are warp-aligned
    if (splits > 1) {
      cluster_sync_all();
      cluster_sync_all();
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(Cfg::kMmaRegs));
  // MMA threads: warpgroup w holds weight rows 64 mwg.. (mwg = w % 2) in K group kg = w / 2; ctl is
  // the thread's index among its K group's (the twin's in K group 0).
  const int ct = tid - 128, ctl = Cfg::kKG == 1 ? ct : ct % Cfg::kEpi;
  // kg broadcast from lane 0: ptxas then knows it is warp-uniform, and keeps the stage addresses
  // and wgmma descriptors that depend on it in uniform registers.
  const int mwg = ctl >> 7, kg = Cfg::kKG == 1 ? 0 : __shfl_sync(0xFFFFFFFFu, ct / Cfg::kEpi, 0);
  const int lane = ct & 31, g = lane >> 2, c = lane & 3;
  const int r0 = (ctl >> 5) * 16 + g;  // accumulator rows r0 and r0 + 8
  const FragmentSlot<Cfg> slot(ctl, 64 * mwg + 16 * ((ct >> 5) & 3) + g, c);
  const uint32_t lut_addr = smem_u32(lut);
  float acc[Cfg::kAcc];
  const uint32_t pipe_addr = smem_u32(pipe);
  uint32_t frag[Cfg::kFragSets][4];  // the A registers of the k16 steps in flight and the next
  StageOperands ops;
  const uint32_t full_addr = small_m::opaque(smem_u32(full));
  const uint32_t empty_addr = Cfg::kConvert ? full_addr + kEmptyRow * kBarRow : small_m::opaque(smem_u32(empty));
  WorkList list(sc, cta);
  Work w{0, 0, 0, 0};
  bool have = list.next(sc, p, n_tiles, kt0, kt1, w);
  if (Cfg::kKG == 1 && have && w.kb < w.ke) {
    stage_wait<Cfg>(full_addr, 0);
    load_part<Cfg, 0, 0>(ops, pipe_addr, lut_addr, w.kb, p.k, slot);
    load_part<Cfg, 0, 1>(ops, pipe_addr, lut_addr, w.kb, p.k, slot);
  }
  int s = 0, phase = 0;  // the ring position runs on across tiles, as in the producer
  int par = 0;           // two K groups: the parity of the CTA's stages so far
  int chunk = 0;         // the warpgroup's TMA-store epilogue chunks so far (buffer parity)
  while (have) {
    const Work cur = w;
    const bool more = list.next(sc, p, n_tiles, kt0, kt1, w);  // w: the next piece, whose first stage this one's last step reads
    have = more;
    const int t = cur.tile;
    const int n0 = (t % n_tiles) * Cfg::kRows, m0 = (t / n_tiles) * Cfg::kBM;
    const small_m::EpilogueAlpha ea = small_m::epilogue_alpha(p, cur.expert);
    const float alpha = ea.value;
    const bool has_alpha = ea.on;
#pragma unroll
    for (int i = 0; i < Cfg::kAcc; ++i) acc[i] = 0.0f;
    fence_regs(acc);
    int prev = -1;
    if constexpr (Cfg::kKG == 2) {
      // K group kg takes the piece's stages whose parity among all the CTA's stages is kg. The
      // operands of its next stage in the piece are read during this one's steps, as with one K
      // group (the piece's first stage: before its steps; past the last: this stage again, whose
      // wait falls through).
      int ss = s, sp = phase, kt = cur.kb;
      if (par != kg) {
        ++kt;
        ss = ss + 1 == stages ? 0 : ss + 1;
        sp ^= ss == 0;
      }
      if (kt < cur.ke) {
        stage_wait<Cfg>(full_addr + 8 * ss, sp);
        load_part<Cfg, 0, 0>(ops, pipe_addr + ss * kStage, lut_addr, kt, p.k, slot);
        load_part<Cfg, 0, 1>(ops, pipe_addr + ss * kStage, lut_addr, kt, p.k, slot);
      }
      for (; kt < cur.ke; kt += 2) {
        const uint32_t st = pipe_addr + ss * kStage;
        const uint64_t desc = desc_sw128(st);
        int ns = ss, np = sp;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          ns = ns + 1 == stages ? 0 : ns + 1;
          np ^= ns == 0;
        }
        const bool last = kt + 2 >= cur.ke;
        const int nkt = last ? kt : kt + 2;
        const uint32_t nst = pipe_addr + (last ? ss : ns) * kStage;
        stage_wait<Cfg>(full_addr + 8 * (last ? ss : ns), last ? sp : np);
        stage_steps<Cfg>(acc, frag, ops, slot, desc, st, kt, nst, lut_addr, nkt, p.k, empty_addr + 8 * prev,
                         prev >= 0 && lane == 0);
        prev = ss;
        ss = ns;
        sp = np;
      }
      const int n = cur.ke - cur.kb, q = s + n;  // both groups: the ring position after the piece
      par ^= n & 1;
      s = q % stages;
      phase ^= (q / stages) & 1;
    } else
    for (int kt = cur.kb; kt < cur.ke; prev = s, ++kt, s = s + 1 == stages ? 0 : s + 1, phase ^= s == 0) {
      const uint32_t st = pipe_addr + s * kStage;
      const uint64_t desc = desc_sw128(st);
      // The next stage (this tile's next, or the next tile's first), whose operands are read
      // during this one's steps: wait for it here (a wait between the wgmmas would make ptxas
      // serialize them). After the CTA's last stage: wait for the phase before, long complete,
      // so the wait falls through (the loads are harmless).
      const bool tile_end = kt + 1 >= cur.ke;
      const int nkt = tile_end ? (more ? w.kb : cur.kb) : kt + 1;
      const int ns = s + 1 == stages ? 0 : s + 1;
      const uint32_t nst = pipe_addr + ns * kStage;
      stage_wait<Cfg>(full_addr + 8 * ns, phase ^ (ns == 0) ^ (tile_end && !more));
      stage_steps<Cfg>(acc, frag, ops, slot, desc, st, kt, nst, lut_addr, nkt, p.k, empty_addr + 8 * prev,
                       prev >= 0 && lane == 0);
    }
    wgmma_wait<0>();
    fence_regs(acc);
    if constexpr (Cfg::kPair) {
      consumer_sync<Cfg>();  // every consumer is past the pipeline before the exchange overwrites it
      pair_exchange<Cfg>(acc, pipe_addr, rank, mwg, ct & 127);
      constexpr int kChunks0 = Cfg::kPairChunks, kChunks1 = Cfg::kBM / kChunkM - kChunks0;
      store_tma<Cfg, kChunks0>(p, &out_map, acc, pipe_addr + Cfg::kPairXchg + 2 * kOutBuffer * mwg, chunk,
                               m0 + rank * kChunks0 * kChunkM, n0, mwg, ct & 127, alpha, has_alpha,
                               rank != 0 ? kChunks1 : kChunks0);
      cluster_sync_all();  // keep this rank's exchange words alive until the other rank read them
      continue;
    }
    if (persistent) {
      // The tile's last stage goes back now: the producer refills it during the stores.
      __syncwarp();
      release_stage(empty_addr + 8 * prev, prev >= 0 && lane == 0);
    }
    if constexpr (Cfg::kKG == 2) {  // K group 0 holds the tile's sums from here; K group 1 goes on
      pair_sum<Cfg>(acc, xchg, mwg, kg, ct & 127);
      if (kg == 1) {
        if (!persistent && splits > 1) {  // the two cluster barriers of K group 0's epilogue
          cluster_sync_all();
          cluster_sync_all();
        }
        continue;
      }
    }

    if (persistent) {
      if (t >= sc.dp && (cur.kb != 0 || cur.ke != tiles)) {  // a stream-K piece of a tile
        static_assert(stream_k_flags_offset(Cfg::kBM, 1) == int64_t{Cfg::kWG} * Cfg::kAcc * 128 * 4,
                      "the workspace holds each warpgroup's accumulators of every MMA thread");
        float* partials = static_cast<float*>(workspace);
        int* flags = reinterpret_cast<int*>(static_cast<char*>(workspace) + stream_k_flags_offset(Cfg::kBM, sc.ctas));
        if (cur.kb != 0) {  // the rest of the tile is another CTA's: hand the sums over
          sk_contribute<Cfg>(partials, flags, acc, cta, mwg, ct & 127);
          continue;
        }
        // The last CTA with steps of this tile: the one of its group holding the group tile's
        // last stream-K step.
        const int x = ((t - sc.dp) / sc.group + 1) * tiles - 1, groups = sc.ctas / sc.group;
        int last = cta / sc.group;
        while (last + 1 < groups && sc.sk_begin(last + 1) <= x) ++last;
        sk_gather<Cfg>(partials, flags, acc, cta, last * sc.group + cta % sc.group, sc.group, mwg, ct & 127);
      }
      if (out_tma) {
        store_tma<Cfg>(p, &out_map, acc, pipe_addr + stages * kStage + 2 * kOutBuffer * mwg, chunk, m0, n0, mwg,
                       ct & 127, alpha, has_alpha);
      } else {
        const uint32_t stage = pipe_addr + stages * kStage + 4u * mwg * kChunkM * kStagePitch;
        store_staged<Cfg>(p, acc, stage, m0, n0, mwg, ct & 127, r0 - 64 * mwg, c, alpha, has_alpha);
      }
      continue;
    }

    // One tile per CTA: every consumer is past the pipeline before the tile overwrites it.
    consumer_sync<Cfg>();
    float* const part = reinterpret_cast<float*>(pipe);
    // The thread's base in the tile, formed here (opaque): hoisted above the main loop, the 64-bit
    // pointer stayed live through it and spilled in the 104-register kernels with kConvert.
    float* const mine = part + small_m::opaque(2 * c * Cfg::kPitch + r0);
#pragma unroll
    for (int j = 0; j < Cfg::kAcc / 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) mine[(8 * j + (e & 1)) * Cfg::kPitch + 8 * (e >> 1)] = acc[4 * j + e];
    if (splits > 1) {
      cluster_sync_all();
    } else {
      consumer_sync<Cfg>();
    }
    constexpr int kPerRow = Cfg::kRows / 4;
    const int rows = min(Cfg::kBM, p.m - m0);
    const int chunks = rows * kPerRow, stride = splits * Cfg::kEpi;
    // kEpiBatch chunks per thread and round: every read of a rank's words in the round is issued
    // before the first is used, so the round's (distributed) shared-memory reads overlap instead of
    // each chunk waiting on its own. Ranks are added in rank order, as every split-K sum is.
    for (int q0 = rank * Cfg::kEpi + ct; q0 < chunks; q0 += Cfg::kEpiBatch * stride) {
      uint32_t at[Cfg::kEpiBatch];
      F4 v[Cfg::kEpiBatch];
#pragma unroll
      for (int u = 0; u < Cfg::kEpiBatch; ++u) {
        const int q = min(q0 + u * stride, chunks - 1);  // past the tile: read in bounds, never stored
        at[u] = smem_u32(part + (q / kPerRow) * Cfg::kPitch + 4 * (q % kPerRow));
        v[u] = splits > 1 ? ld_cluster128f(at[u], 0) : lds128f(at[u]);
      }
      for (int r = 1; r < splits; ++r) {
        F4 x[Cfg::kEpiBatch];
#pragma unroll
        for (int u = 0; u < Cfg::kEpiBatch; ++u) x[u] = ld_cluster128f(at[u], r);
#pragma unroll
        for (int u = 0; u < Cfg::kEpiBatch; ++u) v[u] = small_m::add4(v[u], x[u]);
      }
#pragma unroll
      for (int u = 0; u < Cfg::kEpiBatch; ++u) {
        const int q = q0 + u * stride, m = q / kPerRow, r4 = q % kPerRow;
        if (q < chunks && n0 + 4 * r4 < p.n) {
          const F4 out = small_m::add_bias4(p, finish<Cfg>(v[u], alpha, has_alpha), n0 + 4 * r4);
          small_m::store_out(p, m0 + m, n0 + 4 * r4, out);
        }
      }
    }
    if (splits > 1) cluster_sync_all();  // keep this CTA's partials alive until every rank read them
  }
  // The last tensor stores read shared memory and write global memory after the loop: wait for them.
  if (out_tma && (ct & 127) == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
#else
  pdl_wait();  // every kernel waits for the previous grid (not compiled for this architecture)
#endif
}

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

inline EncodeTiled encode_fn() {
  static EncodeTiled fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult status{};
#if CUDART_VERSION >= 12050
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &status) !=
        cudaSuccess)
      f = nullptr;
#else
    if (cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &f, cudaEnableDefault, &status) != cudaSuccess) f = nullptr;
#endif
    return status == cudaDriverEntryPointSuccess ? reinterpret_cast<EncodeTiled>(f) : nullptr;
  }();
  return fn;
}

// A 2-D row-major tensor [rows, cols] of `type` with `row_bytes` between rows, read in boxes of
// [box_rows, box_cols]; out-of-bounds elements read as zero.
inline bool encode_2d(CUtensorMap* map, CUtensorMapDataType type, const void* base, int64_t rows, int64_t cols,
               int64_t row_bytes, int box_rows, int box_cols, CUtensorMapSwizzle swizzle) {
  EncodeTiled fn = encode_fn();
  if (fn == nullptr) return false;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(row_bytes)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem_strides[2] = {1, 1};
  return fn(map, type, 2, const_cast<void*>(base), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
            swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// SMs of the current device, read once per device.
inline int sm_count() {
  static int counts[kMaxDevices] = {};
  int device = 0;
  (void)cudaGetDevice(&device);
  if (device >= kMaxDevices) {
    int n = 1;
    (void)cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device);
    return std::max(n, 1);
  }
  if (counts[device] == 0) {
    int n = 1;
    (void)cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device);
    counts[device] = std::max(n, 1);
  }
  return counts[device];
}

// The work of a launch: one CTA per output tile and split, or for persistent launches as many
// CTAs as fit at once (every CTA slot with stream-K, which then shares out the last waves' steps).
// K steps (stages) of one output tile of a launch.
inline int k_steps(const WgmmaMmArgs& a) {
  const int sk = kBK * stage_subs(a.block_m, a.ctas_per_sm);
  return static_cast<int>((a.k + sk - 1) / sk);
}

inline Schedule schedule_of(const WgmmaMmArgs& a) {
  const int64_t total = ((a.n + 127) / 128) * ((a.m + a.block_m - 1) / a.block_m);
  const int tiles = static_cast<int>(std::min<int64_t>(total, INT32_MAX));
  const int ksteps = k_steps(a);
  const bool persistent = a.persistent && a.split_k == 1;
  if (!persistent) return Schedule{tiles, tiles, ksteps, tiles, 1};
  const int slots = a.ctas_per_sm * sm_count();
  if (!a.stream_k) return make_schedule(tiles, ksteps, std::min(tiles, slots), false);
  return make_schedule(tiles, ksteps, slots, true);
}


template <class Cfg>
bool launch_cfg(const WgmmaMmArgs& a, cudaStream_t stream, bool pdl) {
  CUtensorMap act_map, tail_map{}, w_map{};
  const CUtensorMapDataType act_type = a.act_fp16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  if (!encode_2d(&act_map, act_type, a.act, a.m, a.k, a.k * 2, Cfg::kBM, kBK, CU_TENSOR_MAP_SWIZZLE_128B))
    return false;
  // The last activation tile of an M that is no multiple of block_m loads through a box of its rows.
  const int tail_rows = static_cast<int>(a.m % Cfg::kBM);
  if (tail_rows != 0 &&
      !encode_2d(&tail_map, act_type, a.act, a.m, a.k, a.k * 2, tail_rows, kBK, CU_TENSOR_MAP_SWIZZLE_128B))
    return false;
  if (!Cfg::kPacked && !encode_2d(&w_map, CU_TENSOR_MAP_DATA_TYPE_UINT8, a.w, a.n * a.experts, a.k / 2, a.k / 2,
                                  Cfg::kRows, kBK / 2, CU_TENSOR_MAP_SWIZZLE_32B))
    return false;
  const int tiles = static_cast<int>((a.k + Cfg::kSK - 1) / Cfg::kSK);
  const int split = std::max(1, std::min(a.split_k, tiles));
  Params p = operand_params(a, (tiles + split - 1) / split);

  const bool persistent = a.persistent && split == 1;
  // 16-bit outputs with 16-byte rows leave a persistent launch, and a split-2 one (Config::kPair,
  // which returns false without them: the caller then takes the one-tile kernel), by TMA tensor stores.
  CUtensorMap out_map{};
  const bool out_tma = (persistent || Cfg::kPair) && a.out_dtype != small_m::kOutF32 && a.n % 8 == 0 &&
                       reinterpret_cast<uintptr_t>(a.out) % 16 == 0 &&
                       encode_2d(&out_map, a.out_dtype == small_m::kOutF16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                                           : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                                 a.out, a.m, a.n, a.n * 2, kChunkM, 64, CU_TENSOR_MAP_SWIZZLE_128B);
  if (Cfg::kPair && !out_tma) return false;
  const int smem = smem_bytes(Cfg::kBM, Cfg::kWG, Cfg::kSubs, a.stages, persistent, Cfg::kKG);
  auto kernel = wgmma_mm_kernel<Cfg>;
  static int configured[kMaxDevices] = {};
  reserve_smem(kernel, smem, configured);
  if (Cfg::kCtas > 1) {  // two CTAs' shared memory on one SM: ask for the largest carveout
    static bool carved = false;
    if (!carved) carved = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                               cudaSharedmemCarveoutMaxShared) == cudaSuccess;
  }
  const Schedule sc = schedule_of(a);
  if (sc.dp < sc.total) {  // stream-K: the flags start lowered
    if (a.workspace == nullptr) return false;
    const int64_t flags = stream_k_flags_offset(a.block_m, sc.ctas);
    if (cudaMemsetAsync(static_cast<char*>(a.workspace) + flags, 0, stream_k_bytes(a.block_m, sc.ctas) - flags,
                        stream) != cudaSuccess)
      return false;
  }
  const dim3 grid(static_cast<unsigned>(sc.ctas), 1, static_cast<unsigned>(split));
  // The splits of one output tile form a cluster along z (reduced through distributed smem).
  launch_cluster(kernel, grid, dim3(Cfg::kThreads, 1, 1), smem, dim3(1, 1, static_cast<unsigned>(split)), stream,
                 pdl, act_map, tail_map, w_map, out_map, p, sc, a.workspace, a.stages, static_cast<int>(persistent),
                 static_cast<int>(out_tma));
  return true;
}

// Whether a launch takes the split-2 kernel (Config::kPair): one tile per CTA, split 2 after the
// clamp to the K steps, one K group and one CTA per SM at block_m >= kPairMinBM, 16-bit
// outputs with 16-byte rows.
inline bool pair_launch(const WgmmaMmArgs& a) {
  return !a.persistent && std::min(a.split_k, k_steps(a)) == 2 && a.k_groups == 1 && a.ctas_per_sm == 1 &&
         a.block_m >= kPairMinBM && a.out_dtype != small_m::kOutF32 && a.n % 8 == 0 &&
         reinterpret_cast<uintptr_t>(a.out) % 16 == 0;
}

// block_m >= 96: from kPairMinBM the split-2 kernel where pair_launch, else the one-tile /
// persistent one.
template <int kBM, bool kFp16, bool kMx, bool kPacked>
bool launch_wide(const WgmmaMmArgs& a, cudaStream_t stream, bool pdl) {
  if constexpr (kBM >= kPairMinBM) {
    if (pair_launch(a) && launch_cfg<Config<kBM, kFp16, kMx, kPacked, 1, 1, true>>(a, stream, pdl)) return true;
  }
  return launch_cfg<Config<kBM, kFp16, kMx, kPacked>>(a, stream, pdl);
}

// block_m 32 or 64 (kernel group 0): one or two CTAs per SM, one or two K groups.
template <bool kFp16, bool kMx, bool kPacked>
bool launch_narrow(const WgmmaMmArgs& a, cudaStream_t stream, bool pdl) {
  if (a.k_groups == 2) {
    if constexpr (!kPacked) return false;
    else switch (a.block_m) {
      case 32: return launch_cfg<Config<32, kFp16, kMx, kPacked, 1, 2>>(a, stream, pdl);
      case 64: return launch_cfg<Config<64, kFp16, kMx, kPacked, 1, 2>>(a, stream, pdl);
      default: return false;
    }
  }
  switch (a.block_m) {
    case 32:
      return a.ctas_per_sm == 2 ? launch_cfg<Config<32, kFp16, kMx, kPacked, 2>>(a, stream, pdl)
                                : launch_cfg<Config<32, kFp16, kMx, kPacked>>(a, stream, pdl);
    case 64:
      return a.ctas_per_sm == 2 ? launch_cfg<Config<64, kFp16, kMx, kPacked, 2>>(a, stream, pdl)
                                : launch_cfg<Config<64, kFp16, kMx, kPacked>>(a, stream, pdl);
    default: return false;
  }
}

// The kernels of the unit's groups (group_compiled): 0 block_m <= 64, 1 block_m >= 96.
template <bool kFp16, bool kMx, bool kPacked>
bool launch_tile(const WgmmaMmArgs& a, cudaStream_t stream, bool pdl) {
  if (a.block_m <= 64) {
    if constexpr (group_compiled<0>()) return launch_narrow<kFp16, kMx, kPacked>(a, stream, pdl);
    return false;
  }
  if constexpr (group_compiled<1>()) {
    switch (a.block_m) {
      case 96: return launch_wide<96, kFp16, kMx, kPacked>(a, stream, pdl);
      case 128: return launch_wide<128, kFp16, kMx, kPacked>(a, stream, pdl);
      case 160: return launch_wide<160, kFp16, kMx, kPacked>(a, stream, pdl);
      case 192: return launch_wide<192, kFp16, kMx, kPacked>(a, stream, pdl);
      case 224: return launch_wide<224, kFp16, kMx, kPacked>(a, stream, pdl);
      case 256: return launch_wide<256, kFp16, kMx, kPacked>(a, stream, pdl);
      default: return false;
    }
  }
  return false;
}

// Variant kV's kernels (mm_operands.h), where this unit holds them.
template <int kV>
bool launch_variant(const WgmmaMmArgs& a, cudaStream_t stream, bool pdl) {
  if constexpr (mm_variant_compiled<kV>()) {
    constexpr MmVariant v = kMmVariants[kV];
    return launch_tile<v.fp16, v.mx, v.packed>(a, stream, pdl);
  } else {
    return false;
  }
}

}  // namespace wgmma_mm

int64_t wgmma_mm_workspace_bytes(const WgmmaMmArgs& args) {
  using namespace wgmma_mm;
  if (args.m <= 0 || args.n <= 0 || args.block_m <= 0) return 0;
  const Schedule sc = schedule_of(args);
  if (sc.dp == sc.total) return 0;
  return stream_k_bytes(args.block_m, sc.ctas);
}

bool launch_wgmma_mm(const WgmmaMmArgs& args, cudaStream_t stream, bool pdl) {
  using namespace wgmma_mm;
  if (args.stages < 3 || args.stages > kMaxStages || args.split_k < 1 || args.split_k > kMaxSplit) return false;
  if (args.persistent && args.split_k != 1) return false;  // split-K tiles are one per CTA
  if (args.stream_k && !args.persistent) return false;      // stream-K shares a persistent launch's steps
  if (args.ctas_per_sm != 1 && (args.ctas_per_sm != 2 || args.block_m > 64)) return false;
  // Two K groups: a group waits for its next stage (two ahead) before it releases its previous one,
  // which needs six stages for the producer to get ahead of both groups.
  if (args.k_groups != 1 &&
      (args.k_groups != 2 || !args.packed || args.ctas_per_sm != 1 || args.block_m > 64 || args.stages < 6))
    return false;
  if (args.k % 32 != 0) return false;
  if (args.block_expert != nullptr) {  // grouped: whole blocks of rows, experts' rows in 32-bit TMA coordinates
    if (args.stream_k || args.m % args.block_m != 0 || args.experts < 1 || args.n * args.experts >= (int64_t{1} << 31))
      return false;
    if (!args.packed && args.w_expert != args.n * (args.k / 2)) return false;  // one TMA map over every expert
  }
  if (args.packed && (args.k % 64 != 0 || args.n % 128 != 0)) return false;  // whole "sm90" tiles
  if (args.m <= 0 || args.n <= 0) return true;
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess ||
      major != 9 || minor != 0)
    return false;  // wgmma and setmaxnreg are sm_90a instructions
  return with_mm_variant(mm_variant(args), [&](auto v) {
    return wgmma_mm::launch_variant<decltype(v)::value>(args, stream, pdl);
  });
}

}  // namespace torch_fp4

// C entry points (capi.h): the Hopper GEMM on MmOperands (make_mm_operands) and a bias [n] (or null;
// bias_dtype: launch.h's DType) with the tactic block_m, stages, split_k, persistent, ctas_per_sm,
// stream_k, k_groups; a stream-K launch needs torch_fp4_mm_wgmma_workspace_bytes (same arguments)
// of global memory at `workspace`.
namespace {
torch_fp4::WgmmaMmArgs wgmma_args(const void* act, const void* w, const void* w_scale, const float* alpha,
                                  const float* w_gs, const float* a_gs, void* out, int64_t m, int64_t n,
                                  int64_t k, int64_t kp, int act_fp16, int mx, int out_dtype, int packed,
                                  int block_m, int stages, int split_k, int persistent, int ctas_per_sm,
                                  int stream_k, int k_groups, void* workspace) {
  torch_fp4::WgmmaMmArgs a{};
  static_cast<torch_fp4::MmOperands&>(a) =
      torch_fp4::make_mm_operands(act, w, w_scale, alpha, w_gs, a_gs, out, m, n, k, kp, act_fp16, mx, out_dtype,
                                  packed);
  a.block_m = block_m;
  a.stages = stages;
  a.split_k = split_k;
  a.persistent = persistent != 0;
  a.ctas_per_sm = ctas_per_sm;
  a.stream_k = stream_k != 0;
  a.k_groups = k_groups;
  a.workspace = workspace;
  return a;
}
}  // namespace

TORCH_FP4_CAPI int torch_fp4_mm_wgmma(int device, void* stream, int pdl, const void* act, const void* w,
                                      const void* w_scale, const float* alpha, const float* w_gs,
                                      const float* a_gs, void* out, int64_t m, int64_t n, int64_t k,
                                      int64_t kp, int act_fp16, int mx, int out_dtype, int packed,
                                      const void* bias, int bias_dtype, int block_m, int stages, int split_k,
                                      int persistent, int ctas_per_sm, int stream_k, int k_groups,
                                      void* workspace) {
  if (const int e = torch_fp4::capi_begin(device)) return e;
  torch_fp4::WgmmaMmArgs a = wgmma_args(act, w, w_scale, alpha, w_gs, a_gs, out, m, n, k, kp, act_fp16, mx,
                                        out_dtype, packed, block_m, stages, split_k, persistent, ctas_per_sm,
                                        stream_k, k_groups, workspace);
  a.bias = bias;
  a.bias_dtype = bias_dtype;
  return torch_fp4::capi_end(torch_fp4::launch_wgmma_mm(a, static_cast<cudaStream_t>(stream), pdl != 0));
}

// The grouped GEMM (mm_operands.h): m rows in blocks of block_m, block b multiplying expert
// block_expert[b]'s weights (w_expert and s_expert bytes between experts' weights and scales;
// alpha or w_gs: [experts] or null, a_gs one value or null); no stream-K.
TORCH_FP4_CAPI int torch_fp4_mm_wgmma_grouped(int device, void* stream, int pdl, const void* act, const void* w,
                                              const void* w_scale, const float* alpha, const float* w_gs,
                                              const float* a_gs, void* out, int64_t m, int64_t n, int64_t k,
                                              int64_t kp, int act_fp16, int mx, int out_dtype, int packed,
                                              int block_m, int stages, int split_k, int persistent,
                                              int ctas_per_sm, const int* block_expert, int64_t experts,
                                              int64_t w_expert, int64_t s_expert) {
  if (const int e = torch_fp4::capi_begin(device)) return e;
  if (block_expert == nullptr) return torch_fp4::kNotCompiled;
  torch_fp4::WgmmaMmArgs a = wgmma_args(act, w, w_scale, alpha, w_gs, a_gs, out, m, n, k, kp, act_fp16, mx,
                                        out_dtype, packed, block_m, stages, split_k, persistent, ctas_per_sm, 0, 1,
                                        nullptr);
  a.block_expert = block_expert;
  a.experts = experts;
  a.w_expert = w_expert;
  a.s_expert = s_expert;
  return torch_fp4::capi_end(torch_fp4::launch_wgmma_mm(a, static_cast<cudaStream_t>(stream), pdl != 0));
}

// Bytes of workspace the launch with these arguments needs (0: none), or minus a CUDA error.
TORCH_FP4_CAPI int64_t torch_fp4_mm_wgmma_workspace_bytes(int device, const void* act, const void* w,
                                                          const void* w_scale, const float* alpha,
                                                          const float* w_gs, const float* a_gs, void* out,
                                                          int64_t m, int64_t n, int64_t k, int64_t kp, int act_fp16,
                                                          int mx, int out_dtype, int packed, int block_m, int stages,
                                                          int split_k, int persistent, int ctas_per_sm,
                                                          int stream_k, int k_groups) {
  if (const int e = torch_fp4::capi_begin(device)) return -e;
  return torch_fp4::wgmma_mm_workspace_bytes(wgmma_args(act, w, w_scale, alpha, w_gs, a_gs, out, m, n, k, kp,
                                                        act_fp16, mx, out_dtype, packed, block_m, stages,
                                                        split_k, persistent, ctas_per_sm, stream_k, k_groups,
                                                        nullptr));
}
