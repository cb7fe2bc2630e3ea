// Small-M FP4 GEMM (decode: M = 1..64 activation rows) of the cuda backend: the kernel body, its
// launch interface and the pure index / decode functions it is made of.
//
// out[M, N] = RN_out(alpha * sum_k A[m, k] * W[n, k]) with W FP4 [N, K/2] (NVFP4 or MXFP4, 128x4
// block scales) and A 16-bit [M, K] (bf16, or fp16 with NVFP4; W4A4 callers dequantize A first).
//
// Design (swap-AB, mma.sync.m16n8k16): the weight rows are the MMA's M side (16 rows per MMA tile),
// the activation rows its N side (8 per n-block, kNB n-blocks). The K order inside a pipeline stage
// is permuted, identically for both operands (sums over K do not depend on the order: exact on
// grid-exact inputs, within the spec's fp32 bound otherwise):
// - the four lanes of a quad (same MMA rows) split a weight row's stage chunk of kBK codes into four
//   contiguous pieces of kCpt = kBK / 4 codes: a lane reads its piece as 16-byte vectors and the
//   codes never leave the registers that loaded them;
// - a 32-bit word of 8 codes (nibble i = element i) becomes four bf16x2 (fp16x2) registers holding
//   the element pairs (0, 4), (1, 5), (2, 6), (3, 7): (0, 4) and (1, 5) are the two k-slot pairs of
//   one MMA, (2, 6) and (3, 7) of the next;
// - the activation tile is stored in shared memory with each 8-element unit permuted the same way
//   (x0 x4 x1 x5 x2 x6 x3 x7), so one 16-byte load gives the B fragments of those two MMAs.
// Decode (exact): integer bit placement gives the E2M1 value times 2^-126 as bf16 (2^-14 as fp16,
// subnormal 0.5 included); one multiply by a table entry gives code * scale * 2^-7 for NVFP4 (the
// entry is scale * 2^119, or scale * 2^7 for fp16; every such product is exact and normal, and the
// fp32 result is multiplied by 2^7 in the epilogue), while MXFP4, whose scales span 2^-127..2^127,
// multiplies by 2^126 and then by the scale (both exact). The tensor core accumulates in fp32.
// Products whose magnitude is below 2^-119 fall into fp32's subnormal range inside the MMA with
// the 2^-7 fold (below 2^-126 without it): activations below about 2^-110.
//
// Weights in the "sm90" layout (docs/NUMERICS.md 4b; Config::kPacked, M <= 32): a 16-row MMA tile's
// 64 K are 512 contiguous bytes whose lane l holds, at 16 l, the four A fragments (k16 steps) of
// mma.sync in natural K order; a stage copies its tiles' bytes unchanged, a lane reads 16 bytes
// per 64 K and decodes each word with place_sm90_bf16 (1 to 4 integer instructions per register,
// as the Hopper GEMM does). K keeps its natural order, so the activation tile is not permuted:
// one ldmatrix.x4 (rows padded to a pitch of 16 mod 128 bytes: conflict-free) gives the B
// fragments of two steps. Each step is one 16-element block, so a lane looks up a scale per row
// per step (two per MMA) instead of one per row per two MMAs.
// Pipeline: a ring of `stages` shared-memory stages filled with cp.async (weights 16-byte vectors
// that cover whole 128-byte lines per warp instruction, activation units, 128x4 scale words); each
// thread permutes the activation units it copied itself right after its own cp.async wait, then
// one barrier per stage publishes the stage. Block scales go through a 256-entry table (scale byte
// -> bf16x2 / fp16x2 value) built at kernel start.
// Split-K: the CTAs of one weight tile form a thread-block cluster along K; each writes its fp32
// partial tile to its shared memory and, after a cluster barrier, each reduces a share of the tile
// by reading the partials of ranks 0, 1, ... in that order through distributed shared memory
// (deterministic, no atomics, no workspace), applies alpha and rounds once to the output type.
//
// Grouped (Config::kGrouped, fused_moe's decode GEMMs in moe_small_m.cu; Params' grouped fields):
// the same tile per block of routed rows of one expert (grid z), with three per-launch modes:
// gather (activation rows from x through the pairs), swiglu (gate and up rows of the same output
// columns in one CTA, SwiGLU in the epilogue, optionally NVFP4-exact) and scatter (output rows
// in pair order), and gpt-oss's features (per-expert biases added to RN(alpha * acc) in fp32,
// the clamped SwiGLU, MXFP4 experts without global scales). The main loop is the dense one; only
// the copy plan and the epilogue differ.
// Every shared-memory load of the main loop goes through ctx.lds (a plain load on the GPU) or
// ctx.ldmatrix_x4 so that
// the emulator can check the bank-conflict freedom of the layouts on the addresses it executes.
// Portability: this header compiles with nvcc (device code, through DeviceCtx in small_m_device.cuh) and
// with a plain C++ compiler (tests/test_cuda_mm_emulation.py runs the same kernel body on the CPU,
// one fiber per GPU thread, with an emulated warp MMA, cp.async groups and barriers).
#pragma once

#include <cstdint>
#include <type_traits>

#include "mm_operands.h"
#include "small_m_ops.cuh"

namespace torch_fp4 {
namespace small_m {

// Largest M, largest cluster (split-K) size, bytes of the scale table.
constexpr int kMaxM = 64;
constexpr int kMaxSplit = 8;
constexpr int kLutBytes = 256 * 4;

// Compile-time shape of one kernel instantiation.
template <int kNB_, int kWarps_, int kWR_, int kBK_, bool kFp16_, bool kMx_, bool kPacked_,
          bool kGrouped_ = false>
struct Config {
  static constexpr int kNB = kNB_;          // activation n-blocks of 8 rows (M <= 8 * kNB)
  static constexpr int kWarps = kWarps_;    // warps per CTA (4 or 8)
  static constexpr int kWR = kWR_;          // 16-row MMA tiles per warp (1 or 2)
  static constexpr int kBK = kBK_;          // K elements per pipeline stage (128 or 256)
  static constexpr bool kFp16 = kFp16_;     // fp16 activations and fp16 MMA, else bf16
  static constexpr bool kMx = kMx_;         // MXFP4 (32-element blocks, UE8M0), else NVFP4
  static constexpr bool kPacked = kPacked_; // weights in the "sm90" layout, else row-major
  static constexpr bool kGrouped = kGrouped_; // blockIdx.z is a block of one expert's routed rows
  static constexpr int kThreads = 32 * kWarps;
  // CTAs per SM the register allocation must allow: 16 warps per SM (at most 128 registers per
  // thread) where accumulators and operands fit; 12 warps (170 registers) or 8 warps (255) for
  // the tiles with 8 or 16 accumulator fragments per warp.
  static constexpr int kMinBlocks = (kNB * kWR <= 4 || (kWarps == 8 && kNB * kWR <= 8))
                                        ? 512 / kThreads
                                        : (kNB * kWR <= 8 ? 384 / kThreads : 256 / kThreads);
  static constexpr int kBN = 16 * kWR * kWarps;        // weight rows per CTA
  static constexpr int kBlock = kMx ? 32 : 16;
  static constexpr int kCpt = kBK / 4;                 // codes per lane per weight row per stage
  static constexpr int kLaneUnits = kCpt / 32;         // 16-byte vectors per lane per weight row
  static constexpr int kRowBytes = kBK / 2;            // packed bytes per weight row per stage
  static constexpr int kRowUnits = kRowBytes / 16;     // 16-byte vectors per weight row per stage
  static constexpr int kActRows = 8 * kNB;
  static constexpr int kActUnits = kBK / 8;            // 8-element units per activation row per stage
  // Activation rows are stored with one 16-byte pad after every 8 units, so the eight lanes of a
  // quarter-warp (two rows, four lane pieces) hit eight different 16-byte bank groups; "sm90"
  // weights: one pad per row, so the eight rows of an ldmatrix matrix do.
  static constexpr int kActPitch = kPacked ? kActUnits + 1 : kActUnits + kActUnits / 8;  // 16-byte units
  static constexpr int kKTiles = kBK / 64;             // 64-K tiles of the "sm90" layout per stage
  static constexpr int kKw = kBK / (4 * kBlock);       // scale words (4 blocks) per row per stage
  static constexpr int kLaneBlocks = kCpt / kBlock;    // scale blocks in a lane's piece
  // Words per 32-row slice of the stage's scale tile: padded so that the lanes of a warp read
  // distinct banks (tests/test_cuda_mm_emulation.py checks every configuration).
  static constexpr int kScalePitch = kKw == 4 ? 20 : (kKw == 2 ? 12 : 5);
  // NVFP4 folds 2^126 (2^14 for fp16) into the scale table: a weight operand is then
  // code * scale * 2^-7, exact in bf16 and fp16 for every code and e4m3 scale, and the fp32
  // result is multiplied by 2^7 (exact). MXFP4's scale range needs the separate multiply.
  static constexpr bool kFold = !kMx;
  static_assert(kBK == 128 || kBK == 256, "block_k must be 128 or 256");
  static_assert(kWarps == 4 || kWarps == 8, "4 or 8 warps");
  static_assert(kNB >= 1 && kNB <= 8 && kWR >= 1 && kWR <= 2, "unsupported tile");
  // A CTA's rows lie in one 128-row group of the 128x4 scale layout.
  static_assert(kBN == 64 || kBN == 128, "64 or 128 weight rows per CTA");
  static_assert(!kPacked || kNB <= 4, "the \"sm90\" reader is compiled for M <= 32");
};

// The tile shapes compiled for each n-block count (mirrored by tile_compiled in
// torch_fp4/kernels/cuda/mm_tactics.py; tests/test_cuda_mm_emulation.py checks they agree):
// (warps, MMA tiles per warp, block_k). 8 warps x 1 tile and 4 x 2 tiles make 128-row CTAs,
// 4 x 1 makes 64-row CTAs (more CTAs for small N); block_k 128 halves a stage's shared memory for
// the wide activation tiles. Combinations that would spill registers are left out.
constexpr bool tile_compiled(int nb, int warps, int wr, int bk) {
  if (warps == 8 && wr == 1) return bk == 128 || (bk == 256 && nb <= 4);
  if (warps == 4 && wr == 1) return bk == 128 ? nb >= 4 : nb <= 4;
  if (warps == 4 && wr == 2) return bk == 256 ? nb <= 2 : true;
  return false;
}

// The tiles whose kernels read "sm90" weights (mirrored by packed_compiled in mm_tactics.py): every
// compiled tile up to M = 16; up to M = 32 only the 64-row CTAs (4 warps x 1 tile), the tiles of the
// small weights where this kernel beats the Hopper GEMM at M = 17-32 (fused_moe's grouped decode
// path reads "sm90" experts at block_m <= 16).
constexpr bool packed_compiled(int nb, int warps, int wr) { return nb <= 2 || (nb <= 4 && warps == 4 && wr == 1); }

// Runtime parameters of one launch (filled by the launcher).
struct Params {
  const uint16_t* act;     // [M, K] bf16 / fp16 bit patterns, rows contiguous, 16-byte aligned
  const uint8_t* w;        // [N, K/2] packed FP4, rows contiguous
  const uint8_t* w_scale;  // 128x4 scale bytes [Np, Kp]
  const float* alpha;      // one fp32 value, or null
  const float* w_gs;       // or (alpha null) the weights' global scale (NVFP4): epilogue_alpha forms
  const float* a_gs;       // alpha from it and a_gs (or null)
  void* out;               // [M, N]
  int m, n, k;
  int kp;                  // K blocks padded to a multiple of 4 (scale matrix columns)
  int steps_per_split;     // K stages per split (the last split may have fewer)
  int out_dtype;           // kOutBf16 / kOutF16 / kOutF32
  int w_aligned16;         // weight rows 16-byte aligned (K % 32 == 0), else 8-byte copies
  const int* block_expert; // grouped launches (GroupedParams): expert of each block of rows
  int64_t w_expert, s_expert;  // bytes between experts' weights and scales (grouped)
  // bias (bias_dtype: kOutBf16 / kOutF16 / kOutF32 codes) added in fp32 to RN(alpha * acc) before
  // any rounding (spec sections 5 and 6), or null: dense launches [n]; grouped launches (gpt-oss)
  // [experts, bias_cols], pointing at the block expert's row once a tile runs (swiglu: gate
  // column c takes bias[c], up column c bias[n + c])
  const void* bias;
  int bias_dtype;
};

// Grouped launches (Cfg::kGrouped, moe_small_m.cu), a type of their own so that the dense
// kernels' parameters (and code) do not depend on the grouped modes: block b = blockIdx.z holds
// the grouped rows [b * kActRows, (b + 1) * kActRows) of expert block_expert[b] (mm_operands.h;
// < 0: unused, the cluster leaves at once), valid below expert_end[e]; weights and scales are
// expert e's, and its alpha is formed here from the global scales, RN(1 / RN(a_gs * w_gs[e]))
// (RN(1 / w_gs[e]) without a_gs; formats.nvfp4_alpha, epilogue_alpha), so that no launch
// computes the alphas (Params::alpha is unused; w_gs and a_gs point at expert 0's).
struct GroupedParams : Params {
  const int* row_index;    // [blocks * kActRows] the pair t * top_k + j of each grouped row
  const int* expert_end;   // [experts] end of each expert's rows
  int top_k;
  int gather;              // activation row of grouped row r: act row row_index[r] / top_k, else r
  int swiglu;              // w holds 2n rows [gate; up]; out = RN(silu(RN(gate)) * RN(up)), n columns
  int scatter;             // out row of grouped row r: row_index[r] (pair order), else r
  const float* qdq_gs;     // swiglu: NVFP4 intermediates, global scale qdq_gs[e * qdq_gs_stride]
  int qdq_gs_stride;       // (Ctx::nvfp4_qdq), else null
  int qdq_mx;              // swiglu: MXFP4 intermediates (Ctx::mxfp4_qdq; I % 32 == 0), else 0
  // w_gs: [experts] the weights' global scales (NVFP4), null for MXFP4 (alpha 1); a_gs: the
  // activations' global scale a_gs[e * a_gs_stride] (W4A4), or null
  int a_gs_stride;
  // gpt-oss's features (spec section 6): Params::bias per expert (bias_cols values each);
  // clamped (swiglu): gpt-oss's clamped SwiGLU with glu_alpha, glu_limit
  int64_t bias_cols;
  int clamped;
  float glu_alpha, glu_limit;
};

// The parameters of a kernel instantiation.
template <class Cfg>
using ParamsOf = typename std::conditional<Cfg::kGrouped, GroupedParams, Params>::type;

// The Params of a launch from its operands, with `steps_per_split` K stages per split;
// w_aligned16 is left to the caller.
inline Params operand_params(const MmOperands& a, int steps_per_split) {
  Params p{};
  p.act = a.act;
  p.w = a.w;
  p.w_scale = a.w_scale;
  p.alpha = a.alpha;
  p.w_gs = a.w_gs;
  p.a_gs = a.a_gs;
  p.out = a.out;
  p.m = static_cast<int>(a.m);
  p.n = static_cast<int>(a.n);
  p.k = static_cast<int>(a.k);
  p.kp = static_cast<int>(a.kp);
  p.steps_per_split = steps_per_split;
  p.out_dtype = a.out_dtype;
  p.block_expert = a.block_expert;
  p.w_expert = a.w_expert;
  p.s_expert = a.s_expert;
  p.bias = a.bias;
  p.bias_dtype = a.bias_dtype;
  return p;
}

// The epilogue's multiplier for `expert` (0 in a dense launch): formed from the global scales
// when w_gs is set, RN(1 / RN(*a_gs * w_gs[expert])) or RN(1 / w_gs[expert]) without a_gs
// (formats.nvfp4_alpha, bit for bit), else alpha[expert] when alpha is set, else none (1).
struct EpilogueAlpha {
  float value;
  bool on;
};
TORCH_FP4_HD EpilogueAlpha epilogue_alpha(const Params& p, int expert) {
  if (p.w_gs != nullptr) {
    const float w = load_alpha(p.w_gs + expert);
    return {div_rn(1.0f, p.a_gs != nullptr ? mul_rn(load_alpha(p.a_gs), w) : w), true};
  }
  if (p.alpha != nullptr) return {load_alpha(p.alpha + expert), true};
  return {1.0f, false};
}

// ---------------------------------------------------------------------------------------------
// Shared-memory layout (bytes): a 1 KiB scale table, then `stages` pipeline stages of
// [weights kBN x kRowBytes][activations kActRows x kActPitch x 16][scale words].
// ---------------------------------------------------------------------------------------------
template <class Cfg>
TORCH_FP4_HD constexpr int stage_weight_bytes() { return Cfg::kBN * Cfg::kRowBytes; }

template <class Cfg>
TORCH_FP4_HD constexpr int stage_act_bytes() { return Cfg::kActRows * Cfg::kActPitch * 16; }

template <class Cfg>
TORCH_FP4_HD constexpr int stage_scale_bytes() { return (32 * Cfg::kScalePitch * 4 + 15) / 16 * 16; }

template <class Cfg>
TORCH_FP4_HD constexpr int stage_bytes() { return stage_weight_bytes<Cfg>() + stage_act_bytes<Cfg>() + stage_scale_bytes<Cfg>(); }

// The epilogue's fp32 partial tile [8 * kNB][kBN + 4] reuses the pipeline's memory.
template <class Cfg>
TORCH_FP4_HD constexpr int partial_pitch() { return Cfg::kBN + 4; }

template <class Cfg>
TORCH_FP4_HD constexpr int smem_bytes(int stages) {
  const int pipe = stages * stage_bytes<Cfg>();
  const int part = Cfg::kActRows * partial_pitch<Cfg>() * 4;
  return kLutBytes + (pipe > part ? pipe : part);
}

// Weight tile: row r's 16-byte vector u lives at unit u ^ (r & 7) of its row (128-byte rows), so
// the two rows a quarter-warp reads land in different banks (64-byte rows need no swizzle).
template <class Cfg>
TORCH_FP4_HD int weight_unit_offset(int r, int u) {
  const int swz = Cfg::kRowUnits == 8 ? (r & 7) : 0;
  return r * Cfg::kRowBytes + ((u ^ swz) << 4);
}

// Activation tile: unit c (elements 8c..8c+7 of the stage) of row m.
template <class Cfg>
TORCH_FP4_HD int act_unit_offset(int m, int c) {
  return (m * Cfg::kActPitch + c + (Cfg::kPacked ? 0 : c >> 3)) << 4;
}

// Scale tile: the 128x4 words of the CTA's 128-row group (row r5 = n % 32, q = (n % 128) / 32,
// word kw_l of the stage) at word r5 * kScalePitch + q * kKw + kw_l.
template <class Cfg>
TORCH_FP4_HD int scale_word_index(int r5, int q, int kw_l) {
  return r5 * Cfg::kScalePitch + q * Cfg::kKw + kw_l;
}

// ---------------------------------------------------------------------------------------------
// The kernel body. Ctx supplies thread/block indices, barriers, cp.async, the warp MMA and the
// cluster operations (DeviceCtx on the GPU, the emulator's context on the CPU).
// ---------------------------------------------------------------------------------------------
// SwiGLU-fused grouped launches: the weight row of the CTA's local row r (output columns n0 ..
// n0 + kBN / 2 - 1): gate rows first, then the up rows of the same columns (p.n = I apart; a
// column past I names a row that the copies zero-fill and whose output is never stored).
template <class Cfg>
TORCH_FP4_HD int glu_row(const Params& p, int n0, int r) {
  constexpr int kHalf = Cfg::kBN / 2;
  return r < kHalf ? n0 + r : p.n + n0 + r - kHalf;
}

// "sm90" weights: the byte offset of weight row `row` (a multiple of 16) in its 128-row group's
// first 64-K tile (128 x 64 tiles of 4096 bytes, K tiles innermost; 16-row pieces of 512 bytes).
TORCH_FP4_HD int sm90_rows_offset(int row, int k) {
  return (row >> 7) * (k >> 6) * 4096 + ((row & 127) >> 4) * 512;
}

// Per-thread copy assignment of a pipeline stage, fixed for the whole kernel.
// - weights: vector (row r0 + j * kWRowStep, piece u) for j < kWPerThread; consecutive lanes take
//   consecutive 16-byte pieces of a row, so a warp instruction reads whole 128-byte lines ("sm90"
//   layout: piece tid + j * kThreads of the stage's contiguous tile bytes, in 64-K tile
//   (wtile >> 4 j) & 15 of the stage, stored unchanged);
// - activations: unit (row m0 + j * kARowStep, c) for j < kAPerThread (rows >= M zero-filled);
// - scale words: word `within` (= r5 * 4 + q) of the 128x4 block kw_l = sidx0 + j * kSBlocks of
//   the stage (a block is 512 contiguous bytes: the 128 rows' words of 4 K blocks).
// Source offsets are 32-bit and relative to the stage's K origin (the launcher checks the sizes),
// rows outside N / M point at a valid row (their copies are zero-filled).
template <class Cfg>
struct CopyPlan {
  static constexpr int kWRowStep = Cfg::kThreads / Cfg::kRowUnits;
  static constexpr int kWPerThread = Cfg::kBN / kWRowStep;
  static constexpr int kARowStep = Cfg::kThreads / Cfg::kActUnits;
  static constexpr int kAPerThread = (Cfg::kActRows + kARowStep - 1) / kARowStep;
  static constexpr int kSBlocks = Cfg::kThreads / 128;   // scale blocks covered by one pass
  static constexpr int kSPerThread = (Cfg::kKw + kSBlocks - 1) / kSBlocks;
  static_assert(kWRowStep % 8 == 0, "rows r0 + j * kWRowStep share r0's swizzle");
  static_assert(kWPerThread <= 8, "wtile holds 4 bits per weight piece");

  int woff[kWPerThread];   // bytes from the stage's first packed byte of row 0 (sm90: of the tiles)
  uint32_t wrow_ok;        // bit j: row n0 + r0 + j * kWRowStep < N
  uint32_t wtile;          // "sm90": bits 4j..4j+3: the 64-K tile of piece j inside the stage
  int wdst;                // stage offset of (r0, u)
  int wbyte0;              // 16 * u
  int aoff[kAPerThread];   // elements from (row 0, stage K origin)
  uint32_t arow_ok;        // bit j: row m0 + j * kARowStep < M
  int adst;                // stage offset of (m0, c)
  bool a_active;           // m0 < kActRows: this thread copies activation units
  int a_k;                 // 8 * c: the unit's first element inside the stage
  int soff;                // bytes from the stage's first scale block (word `within`, block sidx0)
  int sdst;                // stage offset (bytes) of that word
  int sidx0;

  // n0: the CTA's first weight row (swiglu: its first output column, gate rows n0 + r and up rows
  // p.n + n0 + r - kBN / 2); row0: its first grouped row (grouped launches).
  TORCH_FP4_HD CopyPlan(const ParamsOf<Cfg>& p, int tid, int n0, int row0) {
    bool glu = false;
    if constexpr (Cfg::kGrouped) glu = p.swiglu != 0;
    wrow_ok = 0;
    wtile = 0;
    if constexpr (Cfg::kPacked) {  // N % 128 == 0: every row is inside N
      // The CTA's rows: 16-row tiles (n0 % 128) / 16 .. of its 128-row group, 512 bytes each
      // (swiglu: its kBN / 2 gate rows n0.., then its up rows p.n + n0.., I % 64 == 0; each half's
      // kBN / 2 * 32 bytes per 64-K tile are contiguous).
      const int rows = sm90_rows_offset(n0, p.k), up_rows = glu ? sm90_rows_offset(p.n + n0, p.k) : 0;
      wbyte0 = 0;
      wdst = 16 * tid;
      for (int j = 0; j < kWPerThread; ++j) {
        const int piece = tid + j * Cfg::kThreads, per_tile = 2 * Cfg::kBN, q = piece % per_tile;
        wrow_ok |= 1u << j;
        wtile |= static_cast<uint32_t>(piece / per_tile) << (4 * j);
        const int at = glu && q >= Cfg::kBN ? up_rows + (q - Cfg::kBN) * 16 : rows + q * 16;
        woff[j] = opaque(at + (piece / per_tile) * 4096);
      }
    } else {
      const int u = tid % Cfg::kRowUnits, r0 = tid / Cfg::kRowUnits;
      const int kh = p.k >> 1;
      wbyte0 = 16 * u;
      wdst = weight_unit_offset<Cfg>(r0, u);
      for (int j = 0; j < kWPerThread; ++j) {
        const int r = r0 + j * kWRowStep;
        if (glu) {  // rows of columns past n (a last partial tile) are zero-filled
          const bool ok = n0 + (r % (Cfg::kBN / 2)) < p.n;
          wrow_ok |= (ok ? 1u : 0u) << j;
          woff[j] = opaque((ok ? glu_row<Cfg>(p, n0, r) : 0) * kh + wbyte0);
        } else {
          const int n = n0 + r;
          wrow_ok |= (n < p.n ? 1u : 0u) << j;
          woff[j] = opaque((n < p.n ? n : p.n - 1) * kh + wbyte0);
        }
      }
    }
    const int c = tid % Cfg::kActUnits, m0 = tid / Cfg::kActUnits;
    a_k = 8 * c;
    a_active = m0 < Cfg::kActRows;
    adst = stage_weight_bytes<Cfg>() + act_unit_offset<Cfg>(a_active ? m0 : 0, c);
    arow_ok = 0;
    for (int j = 0; j < kAPerThread; ++j) {
      const int m = m0 + j * kARowStep;
      const bool ok = a_active && m < p.m;
      arow_ok |= (ok ? 1u : 0u) << j;
      int src = ok ? m : 0;
      if constexpr (Cfg::kGrouped) {
        if (p.gather && ok) src = p.row_index[row0 + m] / p.top_k;
      }
      aoff[j] = opaque(src * p.k + a_k);
    }
    const int within = tid & 127;
    sidx0 = tid >> 7;
    if (glu) {  // word `within` of local row lr comes from its gate or up row's 128x4 word (rows
      // of columns past n stay inside the padded scale matrix: n + roundup(n, kBN / 2) <= Np)
      const int sr = glu_row<Cfg>(p, n0, ((within & 3) * 32 + (within >> 2)) % Cfg::kBN);
      soff = ((sr >> 7) * (p.kp >> 2) + sidx0) * 512 + ((sr & 31) * 4 + ((sr >> 5) & 3)) * 4;
    } else {
      soff = ((n0 >> 7) * (p.kp >> 2) + sidx0) * 512 + within * 4;
    }
    sdst = stage_weight_bytes<Cfg>() + stage_act_bytes<Cfg>() + 4 * scale_word_index<Cfg>(within >> 2, within & 3, sidx0);
    wrow_ok = opaque(wrow_ok);
    wtile = opaque(wtile);
    wdst = opaque(wdst);
    arow_ok = opaque(arow_ok);
    adst = opaque(adst);
    a_k = opaque(a_k);
    soff = opaque(soff);
    sdst = opaque(sdst);
    sidx0 = opaque(sidx0);
  }
};

// The row-major weight copies of a stage outside the fast path: bytes of each piece inside K (16
// except in a final partial stage), rows inside N.
template <class Cfg, class Ctx>
TORCH_FP4_DEV void issue_row_weights(const Params& p, Ctx& ctx, const CopyPlan<Cfg>& cp, char* st, int k0,
                                     const uint8_t* wbase) {
  using Plan = CopyPlan<Cfg>;
  int valid = (p.k >> 1) - ((k0 >> 1) + cp.wbyte0);
  valid = valid < 0 ? 0 : (valid > 16 ? 16 : valid);
#pragma unroll
  for (int j = 0; j < Plan::kWPerThread; ++j) {
    const int bytes = ((cp.wrow_ok >> j) & 1u) ? valid : 0;
    const uint8_t* src = bytes > 0 ? wbase + cp.woff[j] : p.w;
    char* dst = st + cp.wdst + j * (Plan::kWRowStep * Cfg::kRowBytes);
    if (p.w_aligned16) {
      ctx.cp_async16_stream(dst, src, bytes);
    } else {  // K % 32 == 16: rows are only 8-byte aligned
      const int lo = bytes < 8 ? bytes : 8;
      ctx.cp_async8(dst, src, lo);
      ctx.cp_async8(dst + 8, bytes > 8 ? src + 8 : src, bytes - lo);
    }
  }
}

// Enqueues the copies of K stage `step` into stage memory `st`. `fast`: the CTA's rows are all
// inside N, the stage inside K and the weight rows 16-byte aligned; then only activation rows
// beyond M need masking (their offsets point at row 0, their copies are zero-filled).
template <class Cfg, class Ctx>
TORCH_FP4_DEV void issue_stage(const Params& p, Ctx& ctx, const CopyPlan<Cfg>& cp, char* st, int step, bool fast) {
  using Plan = CopyPlan<Cfg>;
  const int k0 = step * Cfg::kBK;
  // "sm90": the 128-row groups' 64-K tiles are 4 KiB each, K-tile after K-tile.
  const uint8_t* wbase = p.w + (Cfg::kPacked ? k0 * 64 : k0 >> 1);
  const uint16_t* abase = p.act + k0;
  const uint8_t* sbase = p.w_scale + step * (Cfg::kKw * 512) + cp.soff;
  if (fast) {
#pragma unroll
    for (int j = 0; j < Plan::kWPerThread; ++j) {
      ctx.cp_async16_stream(st + cp.wdst + j * (Plan::kWRowStep * Cfg::kRowBytes), wbase + cp.woff[j], 16);
    }
    if (cp.a_active) {
#pragma unroll
      for (int j = 0; j < Plan::kAPerThread; ++j) {
        ctx.cp_async16(st + cp.adst + j * (Plan::kARowStep * Cfg::kActPitch * 16), abase + cp.aoff[j],
                       ((cp.arow_ok >> j) & 1u) ? 16 : 0);
      }
    }
#pragma unroll
    for (int j = 0; j < Plan::kSPerThread; ++j) {
      if (Plan::kSPerThread * Plan::kSBlocks > Cfg::kKw && cp.sidx0 + j * Plan::kSBlocks >= Cfg::kKw) break;
      ctx.cp_async4(st + cp.sdst + 4 * j * Plan::kSBlocks, sbase + j * (Plan::kSBlocks * 512), 4);
    }
    return;
  }
  if constexpr (Cfg::kPacked) {  // a final partial stage: whole 64-K tiles past K are zero-filled
#pragma unroll
    for (int j = 0; j < Plan::kWPerThread; ++j) {
      const bool ok = (k0 >> 6) + static_cast<int>((cp.wtile >> (4 * j)) & 15u) < (p.k >> 6);
      ctx.cp_async16_stream(st + cp.wdst + j * (Plan::kWRowStep * Cfg::kRowBytes), ok ? wbase + cp.woff[j] : p.w,
                            ok ? 16 : 0);
    }
  } else {
    issue_row_weights<Cfg>(p, ctx, cp, st, k0, wbase);
  }
  // Activations: units beyond K or rows beyond M are zero-filled.
  if (cp.a_active) {
    const bool in_k = k0 + cp.a_k < p.k;
#pragma unroll
    for (int j = 0; j < Plan::kAPerThread; ++j) {
      const bool ok = in_k && ((cp.arow_ok >> j) & 1u);
      ctx.cp_async16(st + cp.adst + j * (Plan::kARowStep * Cfg::kActPitch * 16), in_k ? abase + cp.aoff[j] : p.act,
                     ok ? 16 : 0);
    }
  }
  // Scale words: the CTA's row group is always inside the padded scale matrix; K words beyond it
  // (a final partial stage) read as zero.
#pragma unroll
  for (int j = 0; j < Plan::kSPerThread; ++j) {
    const int kw_l = cp.sidx0 + j * Plan::kSBlocks;
    if (Plan::kSPerThread * Plan::kSBlocks > Cfg::kKw && kw_l >= Cfg::kKw) break;
    const bool ok = step * Cfg::kKw + kw_l < (p.kp >> 2);
    ctx.cp_async4(st + cp.sdst + 4 * j * Plan::kSBlocks, ok ? sbase + j * (Plan::kSBlocks * 512) : p.w_scale, ok ? 4 : 0);
  }
}

// The activation units this thread copied for a stage, permuted in place into decode order.
template <class Cfg, class Ctx>
TORCH_FP4_DEV void permute_own_act_units(Ctx& ctx, const CopyPlan<Cfg>& cp, char* st) {
  (void)ctx;
  using Plan = CopyPlan<Cfg>;
  if constexpr (!Cfg::kPacked) {  // "sm90" weights: natural K order, read by ldmatrix
    if (!cp.a_active) return;
#pragma unroll
    for (int j = 0; j < Plan::kAPerThread; ++j) {
      U128* q = reinterpret_cast<U128*>(st + cp.adst + j * (Plan::kARowStep * Cfg::kActPitch * 16));
      *q = pair_for_decode(*q);
    }
  }
}

// One stage of MMAs for this warp: acc[tile][n-block][4].
template <class Cfg, class Ctx>
TORCH_FP4_DEV void compute_stage(Ctx& ctx, const char* st, const uint32_t* lut, int n0,
                                 float (&acc)[Cfg::kWR][Cfg::kNB][4]) {
  const int lane = ctx.tid() & 31, warp = ctx.tid() >> 5;
  const int g = lane >> 2, t = lane & 3;
  const char* wt = st;
  // The lane's activation units: row g of n-block 0, unit t * kCpt / 8; unit u of the piece and
  // n-block nb are at fixed offsets from it (a piece never crosses a pad: kCpt / 8 <= 8 units
  // starting at a multiple of kCpt / 8).
  const char* at = st + stage_weight_bytes<Cfg>() + act_unit_offset<Cfg>(g, t * (Cfg::kCpt / 8));
  const uint32_t* sc = reinterpret_cast<const uint32_t*>(st + stage_weight_bytes<Cfg>() + stage_act_bytes<Cfg>());
  // The lane's first scale block and its byte in the scale word.
  const int first_block = t * Cfg::kLaneBlocks;
  const int kw_l = first_block >> 2, byte0 = first_block & 3;

  uint32_t sw[Cfg::kWR][2];
#pragma unroll
  for (int mt = 0; mt < Cfg::kWR; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = (warp * Cfg::kWR + mt) * 16 + g + 8 * h;
      const int nl = (n0 & 127) + r;  // row inside the CTA's 128-row scale group
      sw[mt][h] = ctx.lds(sc + scale_word_index<Cfg>(nl & 31, nl >> 5, kw_l));
    }
  }
#pragma unroll
  for (int c = 0; c < Cfg::kLaneUnits; ++c) {
    U128 raw[Cfg::kWR][2];
#pragma unroll
    for (int mt = 0; mt < Cfg::kWR; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = (warp * Cfg::kWR + mt) * 16 + g + 8 * h;
        raw[mt][h] = ctx.lds(reinterpret_cast<const U128*>(wt + weight_unit_offset<Cfg>(r, t * Cfg::kLaneUnits + c)));
      }
    }
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int u = c * 4 + q;                 // code word of the lane's piece
      const int blk = (8 * u) / Cfg::kBlock;   // its scale block inside the piece
      uint32_t a[Cfg::kWR][2][4];
#pragma unroll
      for (int mt = 0; mt < Cfg::kWR; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint32_t word = word_of(raw[mt][h], q);
          const uint32_t s2 = ctx.lds(lut + ((sw[mt][h] >> (8 * (byte0 + blk))) & 0xFFu));
          uint32_t d[4];
          if constexpr (Cfg::kFp16) {
            place_f16(word, d);
          } else {
            place_bf16(word, d);
          }
#pragma unroll
          for (int e = 0; e < 4; ++e) a[mt][h][e] = apply_scale<Cfg>(d[e], s2);
        }
      }
#pragma unroll
      for (int nb = 0; nb < Cfg::kNB; ++nb) {
        const U128 b = ctx.lds(reinterpret_cast<const U128*>(at + (nb * 8 * Cfg::kActPitch + u) * 16));
#pragma unroll
        for (int mt = 0; mt < Cfg::kWR; ++mt) {
          ctx.template mma<Cfg::kFp16>(acc[mt][nb], a[mt][0][0], a[mt][1][0], a[mt][0][1], a[mt][1][1], b.x, b.y);
          ctx.template mma<Cfg::kFp16>(acc[mt][nb], a[mt][0][2], a[mt][1][2], a[mt][0][3], a[mt][1][3], b.z, b.w);
        }
      }
    }
  }
}

// One stage of MMAs for this warp with "sm90" weights: per 64-K tile, one 16-byte read per MMA
// tile (its four steps' A words) and the two rows' scale words; per step, two scale-table lookups
// and the decode; per two steps and n-block, one ldmatrix.x4 of the activations (matrix q: K
// 8 q .. 8 q + 7 of the pair, rows 8 nb .. 8 nb + 7, lane l addressing row l % 8 of matrix l / 8).
template <class Cfg, class Ctx>
TORCH_FP4_DEV void compute_stage_sm90(Ctx& ctx, const char* st, const uint32_t* lut, int n0,
                                      float (&acc)[Cfg::kWR][Cfg::kNB][4]) {
  const int lane = ctx.tid() & 31, warp = ctx.tid() >> 5;
  const int g = lane >> 2;
  const char* arow = st + stage_weight_bytes<Cfg>() + act_unit_offset<Cfg>(lane & 7, lane >> 3);
  const uint32_t* sc = reinterpret_cast<const uint32_t*>(st + stage_weight_bytes<Cfg>() + stage_act_bytes<Cfg>());
#pragma unroll
  for (int s = 0; s < Cfg::kKTiles; ++s) {
    U128 raw[Cfg::kWR];
    uint32_t sw[Cfg::kWR][2];
#pragma unroll
    for (int mt = 0; mt < Cfg::kWR; ++mt) {
      const int tile = warp * Cfg::kWR + mt;
      raw[mt] = ctx.lds(reinterpret_cast<const U128*>(st + s * (Cfg::kBN * 32) + tile * 512 + lane * 16));
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int nl = (n0 & 127) + tile * 16 + g + 8 * h;  // row inside the CTA's 128-row scale group
        sw[mt][h] = ctx.lds(sc + scale_word_index<Cfg>(nl & 31, nl >> 5, Cfg::kMx ? s >> 1 : s));
      }
    }
#pragma unroll
    for (int jp = 0; jp < 2; ++jp) {
      uint32_t a[2][Cfg::kWR][4];
#pragma unroll
      for (int jj = 0; jj < 2; ++jj) {
        const int j = 2 * jp + jj;
        // Step j's scale block: NVFP4 byte j of the tile's word; MXFP4 (32 K) byte 2 (s % 2) + j / 2.
        const int byte = Cfg::kMx ? 2 * (s & 1) + jp : j;
#pragma unroll
        for (int mt = 0; mt < Cfg::kWR; ++mt) {
          const uint32_t m0 = ctx.lds(lut + ((sw[mt][0] >> (8 * byte)) & 0xFFu));
          const uint32_t m1 = ctx.lds(lut + ((sw[mt][1] >> (8 * byte)) & 0xFFu));
          uint32_t x[4];
          if constexpr (Cfg::kFp16) {
            place_sm90_f16(word_of(raw[mt], j), x);
          } else {
            place_sm90_bf16(word_of(raw[mt], j), x);
          }
#pragma unroll
          for (int e = 0; e < 4; ++e) a[jj][mt][e] = apply_scale<Cfg>(x[e], (e & 1) ? m1 : m0);  // 1, 3: row r + 8
        }
      }
#pragma unroll
      for (int nb = 0; nb < Cfg::kNB; ++nb) {
        const U128 b = ctx.ldmatrix_x4(arow + (nb * 8 * Cfg::kActPitch + 8 * s + 4 * jp) * 16);
#pragma unroll
        for (int mt = 0; mt < Cfg::kWR; ++mt) {
          ctx.template mma<Cfg::kFp16>(acc[mt][nb], a[0][mt][0], a[0][mt][1], a[0][mt][2], a[0][mt][3], b.x, b.y);
          ctx.template mma<Cfg::kFp16>(acc[mt][nb], a[1][mt][0], a[1][mt][1], a[1][mt][2], a[1][mt][3], b.z, b.w);
        }
      }
    }
  }
}

TORCH_FP4_DEV void store_out(const Params& p, int m, int n, F4 v) {
  const int64_t base = static_cast<int64_t>(m) * p.n + n;
  const float vals[4] = {v.x, v.y, v.z, v.w};
  const bool full = n + 3 < p.n && (p.n & 3) == 0;
  if (p.out_dtype == kOutF32) {
    float* o = static_cast<float*>(p.out) + base;
    if (full) {
      *reinterpret_cast<F4*>(o) = v;
    } else {
      for (int e = 0; e < 4; ++e)
        if (n + e < p.n) o[e] = vals[e];
    }
    return;
  }
  uint16_t* o = static_cast<uint16_t*>(p.out) + base;
  uint32_t h[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) h[e] = p.out_dtype == kOutBf16 ? round_out<kOutBf16>(vals[e]) : round_out<kOutF16>(vals[e]);
  if (full) {
    uint32_t* o2 = reinterpret_cast<uint32_t*>(o);
    o2[0] = h[0] | (h[1] << 16);
    o2[1] = h[2] | (h[3] << 16);
  } else {
    for (int e = 0; e < 4; ++e)
      if (n + e < p.n) o[e] = static_cast<uint16_t>(h[e]);
  }
}

TORCH_FP4_HD F4 add4(F4 a, F4 b) { return F4{add_rn(a.x, b.x), add_rn(a.y, b.y), add_rn(a.z, b.z), add_rn(a.w, b.w)}; }

// The fp32 value of bias element c (dtype: kOutBf16 / kOutF16 / kOutF32; exact in fp32).
TORCH_FP4_DEV float load_bias(const void* bias, int64_t c, int dtype) {
  if (dtype == kOutF32) return static_cast<const float*>(bias)[c];
  const uint16_t h = static_cast<const uint16_t*>(bias)[c];
  return dtype == kOutF16 ? host_f16_to_f32(h) : host_bf16_to_f32(h);
}

// Four fp32 bias values of columns c..c+3, zero from column `end` on (never read).
TORCH_FP4_DEV F4 load_bias4(const void* bias, int64_t c, int dtype, int64_t end) {
  return F4{load_bias(bias, c, dtype), c + 1 < end ? load_bias(bias, c + 1, dtype) : 0.0f,
            c + 2 < end ? load_bias(bias, c + 2, dtype) : 0.0f, c + 3 < end ? load_bias(bias, c + 3, dtype) : 0.0f};
}

// RN(alpha * acc) of columns c..c+3 plus their bias (spec section 5), when the launch has one.
TORCH_FP4_DEV F4 add_bias4(const Params& p, F4 s, int64_t c) {
  return p.bias == nullptr ? s : add4(s, load_bias4(p.bias, c, p.bias_dtype, p.n));
}

// The CTA's work: weight rows (swiglu: output columns) from n0, rows of p (grouped: the block's,
// from grouped row row0; p's pointers are the block expert's).
template <class Cfg, class Ctx>
TORCH_FP4_DEV void small_m_tile(const ParamsOf<Cfg>& p, Ctx& ctx, int stages, int row0) {
  const int tid = ctx.tid();
  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  // The grouped modes (all off in dense launches): SwiGLU over gate and up rows, rows of the
  // whole block in grouped-row order (not scattered), NVFP4 intermediates.
  bool glu = false, block_rows = false;
  float qdq_gs = 0.0f;
  if constexpr (Cfg::kGrouped) {
    glu = p.swiglu != 0;
    block_rows = p.scatter == 0;
    if (p.qdq_gs != nullptr) qdq_gs = load_alpha(p.qdq_gs);
  }
  constexpr int kHalf = Cfg::kBN / 2;
  const int n0 = ctx.tile() * (glu ? kHalf : Cfg::kBN);
  char* smem = ctx.smem();
  uint32_t* lut = reinterpret_cast<uint32_t*>(smem);
  for (int i = tid; i < 256; i += Cfg::kThreads) lut[i] = scale_table_entry<Cfg>(static_cast<uint32_t>(i));
  char* pipe = smem + kLutBytes;
  constexpr int kStage = stage_bytes<Cfg>();
  const CopyPlan<Cfg> plan(p, tid, n0, row0);
  const int srow0 = glu ? 0 : n0;   // the scale tile's row origin (swiglu: stored by local row)

  const int total_steps = (p.k + Cfg::kBK - 1) / Cfg::kBK;
  const int rank = ctx.rank(), splits = ctx.splits();
  const int first = rank * p.steps_per_split;
  int nsteps = total_steps - first;
  nsteps = nsteps < 0 ? 0 : (nsteps > p.steps_per_split ? p.steps_per_split : nsteps);
  const bool fast_tile = n0 + (glu ? kHalf : Cfg::kBN) <= p.n && p.w_aligned16;
  auto fast_stage = [&](int step) { return fast_tile && (step + 1) * Cfg::kBK <= p.k; };

  float acc[Cfg::kWR][Cfg::kNB][4];
#pragma unroll
  for (int mt = 0; mt < Cfg::kWR; ++mt)
#pragma unroll
    for (int nb = 0; nb < Cfg::kNB; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][nb][e] = 0.0f;

  // Prologue: stages 0 .. stages-2 in flight (one commit group per stage, empty ones included, so
  // that "stage i landed" is always "at most stages-2 newer groups pending").
  for (int s = 0; s < stages - 1; ++s) {
    if (s < nsteps) issue_stage<Cfg>(p, ctx, plan, pipe + s * kStage, first + s, fast_stage(first + s));
    ctx.cp_commit();
  }
  int slot = 0, load_slot = stages - 1;
  for (int i = 0; i < nsteps; ++i) {
    ctx.cp_wait(stages - 2);                              // this thread's copies of stage i landed
    permute_own_act_units<Cfg>(ctx, plan, pipe + slot * kStage);
    ctx.sync();                                           // stage i visible; stage i-1 consumed
    if (i + stages - 1 < nsteps) {
      const int step = first + i + stages - 1;
      issue_stage<Cfg>(p, ctx, plan, pipe + load_slot * kStage, step, fast_stage(step));
    }
    ctx.cp_commit();
    if constexpr (Cfg::kPacked) {
      compute_stage_sm90<Cfg>(ctx, pipe + slot * kStage, lut, srow0, acc);
    } else {
      compute_stage<Cfg>(ctx, pipe + slot * kStage, lut, srow0, acc);
    }
    slot = slot + 1 == stages ? 0 : slot + 1;
    load_slot = load_slot + 1 == stages ? 0 : load_slot + 1;
  }
  ctx.cp_wait_all();
  // Grouped launches (fused_moe's chain of kernels) let the next PDL launch start now. A dense
  // GEMM does not: a GEMM launched behind it with PDL would take SM slots while these CTAs finish,
  // and a grid sized to one wave then runs a second (back-to-back M = 1 GEMMs, N x K = 8192 x
  // 28672, H200: 69.4 us with the early signal, 52.2 without it or without PDL); its dependents
  // start as its CTAs exit.
  if constexpr (Cfg::kGrouped) ctx.pdl_launch_dependents();
  ctx.sync();  // every warp done with the pipeline memory

  // Epilogue: partial tile part[m][row] (fp32), then a fixed-order reduction over the K splits.
  float* part = reinterpret_cast<float*>(pipe);
  constexpr int kPitch = partial_pitch<Cfg>();
#pragma unroll
  for (int mt = 0; mt < Cfg::kWR; ++mt) {
    const int r = (warp * Cfg::kWR + mt) * 16 + g;
#pragma unroll
    for (int nb = 0; nb < Cfg::kNB; ++nb) {
#pragma unroll
      for (int e = 0; e < 4; ++e) part[(nb * 8 + 2 * t + (e & 1)) * kPitch + r + 8 * (e >> 1)] = acc[mt][nb][e];
    }
  }
  if (splits > 1) {
    ctx.cluster_sync();
  } else {
    ctx.sync();
  }
  // the epilogue's alpha (grouped: the block's expert's, from its global scales; MXFP4: none)
  const EpilogueAlpha ea = epilogue_alpha(p, 0);
  const bool has_alpha = ea.on;
  const float alpha = ea.value;
  // The sum over the splits of 4 columns at `local`, 2^7 fold undone, times alpha (fp32, exact
  // order: ranks 0, 1, ...).
  auto finish = [&](const float* local) {
    F4 s = *reinterpret_cast<const F4*>(splits > 1 ? ctx.remote(local, 0) : local);
    for (int r = 1; r < splits; ++r) {
      const F4 v = *reinterpret_cast<const F4*>(ctx.remote(local, r));
      s = F4{add_rn(s.x, v.x), add_rn(s.y, v.y), add_rn(s.z, v.z), add_rn(s.w, v.w)};
    }
    if (Cfg::kFold) {  // undo the 2^-7 of the folded NVFP4 operands (exact)
      s = F4{mul_rn(s.x, 128.0f), mul_rn(s.y, 128.0f), mul_rn(s.z, 128.0f), mul_rn(s.w, 128.0f)};
    }
    if (has_alpha) s = F4{mul_rn(s.x, alpha), mul_rn(s.y, alpha), mul_rn(s.z, alpha), mul_rn(s.w, alpha)};
    return s;
  };
  const int per_row = (glu ? kHalf : Cfg::kBN) / 4;
  // Grouped outputs in grouped-row order get every row of the block (rows past p.m are zero: their
  // activations were zero-filled), so no later kernel reads unwritten memory.
  const int chunks = (block_rows ? Cfg::kActRows : p.m) * per_row;
  for (int c = rank * Cfg::kThreads + tid; c < chunks; c += splits * Cfg::kThreads) {
    const int m = c / per_row, r4 = c % per_row;
    if (n0 + 4 * r4 >= p.n) continue;
    const float* local = part + m * kPitch + 4 * r4;
    const int col = n0 + 4 * r4;
    F4 s = add_bias4(p, finish(local), col);
    int orow = m;
    if constexpr (Cfg::kGrouped) {
      if (glu) {
        F4 u = finish(local + kHalf);
        if (p.bias != nullptr) u = add4(u, load_bias4(p.bias, p.n + col, p.bias_dtype, 2 * int64_t{p.n}));
        if (p.clamped) {
          const float a = p.glu_alpha, l = p.glu_limit;
          s = F4{clamped_swiglu_of(s.x, u.x, a, l), clamped_swiglu_of(s.y, u.y, a, l),
                 clamped_swiglu_of(s.z, u.z, a, l), clamped_swiglu_of(s.w, u.w, a, l)};
        } else {
          s = F4{swiglu_of(s.x, u.x), swiglu_of(s.y, u.y), swiglu_of(s.z, u.z), swiglu_of(s.w, u.w)};
        }
        // a 16-column block is 4 chunks of consecutive lanes (chunks per row: a multiple of 4), and
        // I % 16 == 0 makes the `continue` above skip whole blocks
        if (p.qdq_gs != nullptr) s = ctx.nvfp4_qdq(s, qdq_gs);
        if (p.qdq_mx) s = ctx.mxfp4_qdq(s);   // eight lanes' chunks per 32-column block (I % 32 == 0)
      }
      orow = p.scatter ? p.row_index[row0 + m] : row0 + m;
    }
    store_out(p, orow, n0 + 4 * r4, s);
  }
  if (splits > 1) ctx.cluster_sync();  // keep this CTA's partials alive until every rank read them
}

// The kernel body: a dense tile, or (Cfg::kGrouped) the tile of block ctx.block() with its
// expert's operands.
template <class Cfg, class Ctx>
TORCH_FP4_DEV void small_m_mm(const ParamsOf<Cfg>& p, Ctx& ctx, int stages) {
  ctx.pdl_wait();  // before any global-memory access
  if constexpr (Cfg::kGrouped) {
    const int b = ctx.block();
    const int e = p.block_expert[b];
    if (e < 0) return;  // an unused block: the whole cluster (same b) leaves before any barrier
    const int row0 = b * Cfg::kActRows;
    const int used = p.expert_end[e] - row0;
    GroupedParams q = p;
    q.m = used < Cfg::kActRows ? used : Cfg::kActRows;
    q.w = p.w + e * p.w_expert;
    q.w_scale = p.w_scale + e * p.s_expert;
    if (p.w_gs != nullptr) q.w_gs = p.w_gs + e;
    if (p.bias != nullptr)
      q.bias = static_cast<const char*>(p.bias) + e * p.bias_cols * (p.bias_dtype == kOutF32 ? 4 : 2);
    if (p.a_gs != nullptr) q.a_gs = p.a_gs + e * p.a_gs_stride;
    if (p.qdq_gs != nullptr) q.qdq_gs = p.qdq_gs + e * p.qdq_gs_stride;
    if (!p.gather) q.act = p.act + static_cast<int64_t>(row0) * p.k;
    small_m_tile<Cfg>(q, ctx, stages, row0);
  } else {
    small_m_tile<Cfg>(p, ctx, stages, 0);
  }
}

}  // namespace small_m

// ---------------------------------------------------------------------------------------------
// Launch interface (plain C++; the C entry point of mm_small_m.cu fills it, capi.h)
// ---------------------------------------------------------------------------------------------
// The operands (mm_operands.h) and the tactic: warps per CTA (4 or 8), MMA tiles per warp (1 or
// 2), block_k (128 or 256), stages (2..6), split_k (1..8, a thread-block cluster along K).
struct SmallMMmArgs : MmOperands {
  int warps, tiles_per_warp, block_k, stages, split_k;
};

// The launch arguments of operands `ops` (make_mm_operands) with a tactic.
inline SmallMMmArgs small_m_args(const MmOperands& ops, int warps, int tiles_per_warp, int block_k, int stages,
                                 int split_k) {
  SmallMMmArgs a{};
  static_cast<MmOperands&>(a) = ops;
  a.warps = warps;
  a.tiles_per_warp = tiles_per_warp;
  a.block_k = block_k;
  a.stages = stages;
  a.split_k = split_k;
  return a;
}

namespace small_m {

// f(Cfg{}) for the compiled tile (tile_compiled) that the tactic of `a` names, else false: the
// one list of tile shapes the launchers of mm_small_m.cu and moe_small_m.cu dispatch over.
template <int kNB, bool kFp16, bool kMx, bool kPacked, bool kGrouped, class F>
bool with_tile(const SmallMMmArgs& a, F&& f) {
#define TORCH_FP4_SMALL_M_TILE(W, WR, BK)                                                     \
  if constexpr (tile_compiled(kNB, W, WR, BK) && (!kPacked || packed_compiled(kNB, W, WR))) { \
    if (a.warps == W && a.tiles_per_warp == WR && a.block_k == BK)                            \
      return f(Config<kNB, W, WR, BK, kFp16, kMx, kPacked, kGrouped>{});                      \
  }
  TORCH_FP4_SMALL_M_TILE(8, 1, 256)
  TORCH_FP4_SMALL_M_TILE(4, 1, 256)
  TORCH_FP4_SMALL_M_TILE(4, 2, 256)
  TORCH_FP4_SMALL_M_TILE(8, 1, 128)
  TORCH_FP4_SMALL_M_TILE(4, 1, 128)
  TORCH_FP4_SMALL_M_TILE(4, 2, 128)
#undef TORCH_FP4_SMALL_M_TILE
  return false;
}

}  // namespace small_m
}  // namespace torch_fp4

#if !defined(TORCH_FP4_MM_EMULATION)
#include <cuda_runtime_api.h>

namespace torch_fp4 {
// Enqueues the kernel on `stream` (programmatic dependent launch when `pdl`); false when the
// arguments name a configuration that is not compiled (the caller validated the tactic).
bool launch_small_m_mm(const SmallMMmArgs& args, cudaStream_t stream, bool pdl);
}  // namespace torch_fp4
#endif
