// The work of a Hopper GEMM launch (mm_wgmma.cu): which output tiles and K steps each CTA takes
// (whole tiles, stream-K pieces, grouped launches' used tiles), and the stream-K workspace layout.
#pragma once

#include <cstdint>

#include "mm_small_m.cuh"

namespace torch_fp4 {
namespace wgmma_mm {

using small_m::Params;

// A launch's work: `ctas` CTAs take tiles [0, dp) whole (CTA b: tiles b, b + ctas, ...; K steps
// [kt0, kt1) of its split); the K steps of tiles [dp, total) are shared out evenly over groups of
// `group` CTAs (stream-K; none when dp == total): the CTAs of group v = b / group run the same
// steps [sk_begin(v), sk_begin(v + 1)) of (total - dp) / group group tiles, CTA b taking tile
// dp + group * i + b % group of group tile i. So side-by-side weight tiles (same activation rows)
// run the same K steps at the same time on neighbouring CTAs, as whole tiles do, and their
// activation reads reach the L2 together.
struct Schedule {
  int total, dp, ksteps, ctas, group;
  // floor(L v / (ctas / group)) for the L = (total - dp) / group * ksteps stream-K steps (< 2^31),
  // in 32-bit integers (a 64-bit division is a subroutine call that costs the 96-register kernels
  // spills): L = q n + r gives q v + floor(r v / n).
  __host__ __device__ int sk_begin(int v) const {
    const int n = ctas / group, steps = (total - dp) / group * ksteps, q = steps / n, r = steps % n;
    return q * v + r * v / n;
  }
};

// The schedule of a launch of `ctas` CTAs over `total` tiles of `ksteps` K steps: stream-K when
// asked for and the tiles leave a partial wave, keeping the whole waves but the last as whole
// tiles, and only when every CTA gets at least one step (and the steps count in 32 bits); its
// groups as large as kSkGroup where the CTAs and the stream-K tiles divide by them (H200, 28672 x
// 8192 M = 256, 132 CTAs on 224 tiles, groups of 1 / 2 / 4: L2 sectors read 35.0 / 31.8 / 28.8
// million, 268.2k / 266.8k / 266.0k cycles at ncu's locked clock).
constexpr int kSkGroup = 4;
inline Schedule make_schedule(int total, int ksteps, int ctas, bool stream_k) {
  Schedule sc{total, total, ksteps, ctas, 1};
  if (stream_k && total % ctas != 0) {
    const int dp = total / ctas >= 1 ? (total / ctas - 1) * ctas : 0;
    const long long steps = static_cast<long long>(total - dp) * ksteps;
    if (steps >= ctas && steps < (1LL << 31)) {
      sc.dp = dp;
      for (int g = kSkGroup; g > 1; g /= 2)
        if (ctas % g == 0 && (total - dp) % g == 0) {
          sc.group = g;
          break;
        }
    }
  }
  return sc;
}

// A stream-K launch's workspace: the partial sums [ctas][2 warpgroups][block_m / 2 accumulators]
// [128 threads] fp32, then the flags [ctas][2 warpgroups] int32.
__host__ __device__ constexpr int64_t stream_k_flags_offset(int block_m, int ctas) {
  return static_cast<int64_t>(ctas) * 2 * (block_m / 2) * 128 * 4;
}
__host__ __device__ constexpr int64_t stream_k_bytes(int block_m, int ctas) {
  return stream_k_flags_offset(block_m, ctas) + static_cast<int64_t>(ctas) * 2 * 4;
}

// One piece of a CTA's work: K steps [kb, ke) of output tile `tile`, whose rows multiply expert
// `expert`'s weights (grouped launches; 0 otherwise).
struct Work {
  int tile, kb, ke, expert;
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// A CTA's work in order: its whole tiles (K steps [kt0, kt1) of its split), then its stream-K
// steps, one piece per tile they cover. Three registers of state: the schedule stays a kernel
// parameter (the two-CTA kernels have 96 registers per MMA thread).
struct WorkList {
  int t, it, end;
  __device__ WorkList(const Schedule& sc, int cta)
      : t(cta), it(sc.sk_begin(cta / sc.group)), end(sc.sk_begin(cta / sc.group + 1)) {}
  __device__ bool next(const Schedule& sc, int kt0, int kt1, Work& w) {
    if (t < sc.dp) {
      w = Work{t, kt0, kt1, 0};
      t += sc.ctas;
      return true;
    }
    if (it >= end) return false;
    const int local = it / sc.ksteps, kb = it - local * sc.ksteps;
    const int ke = min(sc.ksteps, kb + (end - it));
    w = Work{sc.dp + local * sc.group + static_cast<int>(blockIdx.x) % sc.group, kb, ke, 0};
    it += ke - kb;
    return true;
  }
  // next() for a launch whose tiles may be grouped (Params::block_expert): w.expert is the expert
  // of the tile's block of rows, and the list ends at the first tile of a block past the used
  // rows (the used blocks come first and a CTA's tiles ascend, so every later tile is unused too).
  // Stream-K is never grouped: the used tiles are not known when the launch is scheduled.
  __device__ bool next(const Schedule& sc, const Params& p, int n_tiles, int kt0, int kt1, Work& w) {
    if (!next(sc, kt0, kt1, w)) return false;
    if (p.block_expert == nullptr) return true;
    w.expert = __ldg(p.block_expert + w.tile / n_tiles);
    return w.expert >= 0;
  }
};
#endif

}  // namespace wgmma_mm
}  // namespace torch_fp4
