"""Tactics of the cuda backend's Hopper FP4-weight GEMM (torch_fp4/csrc/mm_wgmma.cu). Cheap to
import: no toolchain, no extension build.

A CTA computes 128 weight rows (two MMA warpgroups of 64). A tactic picks block_m (activation rows
per CTA, the wgmma's N: 32, 64, 96, 128, 160, 192, 224 or 256), the number of shared-memory stages (of stage_k K
elements: 128 or 64 by block_m, CTAs per SM and weight layout; one barrier pair and ring step each),
ctas_per_sm (2 at block_m <= 64: two CTAs share an SM, each with half its shared memory and 96
registers per MMA thread, for more loads and decodes in flight), stream_k (persistent only: the
launch fills every CTA slot, and when the tiles leave a partial last wave, the K steps of the
last one to two waves' tiles are shared out evenly; a tile's owner adds the other CTAs' fp32
partial sums, in CTA order, from a workspace),
split_k: CTAs along K per output tile, launched as a thread-block cluster whose partial tiles are
added in rank order through distributed shared memory (deterministic; split 2 at block_m >= 128 with
16-bit outputs runs a kernel of its own whose ranks each store half the tile from registers, the
other half's sums handed to the other rank), and persistent (split_k 1
only): one CTA per SM looping over the output tiles, the stage ring running on across tiles so
the next tile loads while this one is stored through a small per-warpgroup staging area (no
whole-tile epilogue over the stages; 16-bit outputs with N % 8 == 0 leave it by TMA tensor stores
that overlap the next chunk and tile), and k_groups (2 for "sm90" weights at block_m <= 64, one
CTA per SM, at least 6 stages: two MMA warpgroups per 64 weight rows, K group 0 taking the CTA's
even stages and K group 1 its odd ones, into accumulators of their own that meet in shared memory
at the tile's end; 104 registers per MMA thread; twice the MMA warps on the same tile and stages). (Four MMA
warpgroups of 256 rows per CTA were slower at every M measured and are not compiled.)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ... import formats as F
from ...backends import Backend
from ...tactics import Tactic, register_family, valid_unique
from ...problems import MmProblem, Problem
from .._common import (empty_k_slice, largest_split, mm_key, problem_sm_count, problem_smem_per_block,
                       problem_smem_per_sm, smem_reason)
from .mm_tactics import SM90_SMEM_PER_BLOCK, SM90_SMEM_PER_SM, half_mx_reason

BLOCK_MS = (32, 64, 96, 128, 160, 192, 224, 256)
ROWS = 128                    # weight rows per CTA
BLOCK_K = 64                  # K elements per sub-tile (one 128-byte-swizzled activation box)
MAX_STAGES = 12
MAX_SPLIT = 8                 # a portable cluster size
TWO_CTA_MAX_BLOCK_M = 64      # 96 registers per MMA thread hold block_m <= 64 accumulators
TWO_CTA_AUTO_MAX_BLOCK_M = 32  # the heuristic's two CTAs per SM (_tactic_for) ...
TWO_CTA_AUTO_FILL = 0.8        # ... where the tiles fill this share of the two-CTA slots
K_GROUPS_MAX_BLOCK_M = 64     # 104 registers per MMA thread (two K groups) hold block_m <= 64 unspilled
K_GROUPS_PERSISTENT_MAX_BLOCK_M = 32  # the heuristic's two K groups on persistent launches (_tactic_for)
K_GROUPS_MIN_STAGES = 6       # a K group waits for its next stage (two ahead) before releasing its last
XCHG_BYTES = 2 * 16 * 128 * 4  # two K groups' exchange area: per 64-row group 16 fp32 x 128 threads


@register_family
@dataclass(frozen=True)
class WgmmaMmTactic(Tactic):
    block_m: int = 128       # activation rows per CTA (wgmma N)
    stages: int = 6          # shared-memory stages of stage_k(...) K elements
    split_k: int = 1         # CTAs along K (a cluster; 1..8)
    persistent: bool = False  # one CTA per SM over all tiles (split_k 1)
    ctas_per_sm: int = 1     # 2: two CTAs share an SM (block_m <= 64; half the shared memory each)
    stream_k: bool = False   # persistent only: every CTA slot runs; the last waves' K steps shared out
    k_groups: int = 1        # 2: two MMA warpgroups per 64 weight rows, on alternate stages

    backend = Backend.CUDA
    family = "cuda_mm_wgmma"


MIN_STAGES = 3               # one stage's wgmmas in flight, one being decoded, one being loaded


def stage_k(block_m: int, ctas_per_sm: int, packed: bool) -> int:
    """K elements per stage (mirror of stage_subs in mm_wgmma.cu), for either weight layout
    (`packed` alike): two 64-K sub-tiles under one barrier pair (about 12% fewer instructions per
    HGMMA, and the block scales converted once per CTA) up to block_m 128 (H200, same-process A/B
    against 64-K stages: "sm90" 8192 x 28672 M = 32 two K groups 61.6 -> 57.3 us; 28672 x 8192
    M = 32 two CTAs per SM 69.1 -> 64.1; row-major weights, ncu cycles at the locked clock with
    the conversion: 8192 x 28672 M = 32 / 64 / 96 -18% / -13% / -16%, 8192 x 8192 M = 64 -8%);
    else one: block_m 256 (three 128-K stages do not fit beside the persistent staging) and 160 to
    224 (half as many 128-K stages: block_m 160 -3% to +6%, 192 and 224, three stages, +16 to +29%;
    BENCHMARKS.md), block_m 64 with two CTAs per SM (three 128-K stages in half the shared memory:
    79.1 -> 82.0 us)."""
    two = block_m <= 128 and not (block_m == 64 and ctas_per_sm == 2)
    return 2 * BLOCK_K if two else BLOCK_K


def stage_bytes(block_m: int, ctas_per_sm: int, packed: bool) -> int:
    """Per 64-K sub-tile activations [block_m, 64] 16-bit and FP4 weights [rows, 32 bytes], then
    1 KiB per sub-tile: the stage's scale words, and in stages of two sub-tiles then in their place
    the sub-tiles' 16-bit multipliers (convert_stages in mm_wgmma.cu); 128 rows."""
    subs = stage_k(block_m, ctas_per_sm, packed) // BLOCK_K
    return subs * (block_m * BLOCK_K * 2 + ROWS * BLOCK_K // 2 + 1024)


STAGING_ROWS = 32            # activation rows per chunk of the persistent epilogue


def staging_bytes(block_m: int) -> int:
    """A persistent launch's epilogue staging: per MMA warpgroup [32][64 + 4] fp32 (any block_m;
    the TMA-store epilogue's two [32][64] 16-bit buffers per warpgroup fit in it)."""
    return 2 * STAGING_ROWS * (64 + 4) * 4


def smem_bytes(block_m: int, stages: int, persistent: bool = False, k_groups: int = 1, *,
               ctas_per_sm: int, packed: bool) -> int:
    """Dynamic shared memory of a launch (mirror of smem_bytes in mm_wgmma.cu): 1 KiB of alignment
    slack, the scale table, the barriers, two K groups' exchange area, then the stages and the
    epilogue staging (persistent) or the larger of the stages and the fp32 epilogue tile (one tile
    per CTA)."""
    pipe = stages * stage_bytes(block_m, ctas_per_sm, packed)
    head = 3 * 1024 + (XCHG_BYTES if k_groups == 2 else 0)
    if persistent:
        return head + pipe + staging_bytes(block_m)
    return head + max(pipe, block_m * (ROWS + 4) * 4)


def max_stages(block_m: int, limit: int = SM90_SMEM_PER_BLOCK, persistent: bool = False,
               k_groups: int = 1, *, ctas_per_sm: int, packed: bool) -> int:
    extra = (staging_bytes(block_m) if persistent else 0) + (XCHG_BYTES if k_groups == 2 else 0)
    return min(MAX_STAGES, (limit - 3 * 1024 - extra) // stage_bytes(block_m, ctas_per_sm, packed))


def problem_reason(p: MmProblem) -> Optional[str]:
    """Why the Hopper GEMM cannot run this mm_fp4 problem at all, or None."""
    m, n, k = p.m, p.n, p.k
    if p.is_cuda and p.capability != (9, 0):
        return "the Hopper mm_fp4 kernel (wgmma, sm_90a) needs compute capability 9.0"
    if k % 32:
        return f"the Hopper mm_fp4 kernel needs K % 32 == 0 (16-byte weight rows for TMA), got K={k}"
    reason = F.sm90_layout_reason(n, k) if p.weight_layout is F.WeightLayout.SM90 else None
    if reason is None:
        reason = half_mx_reason(p)
    if reason is not None:
        return reason
    if max(m, n, k) >= 2**31:
        return f"sizes beyond 2^31 (M={m}, N={n}, K={k})"
    if not p.w4a4 and p.a_align < 16:
        return "the activations a must be 16-byte aligned (TMA)"
    if p.b_align < 16 or p.b_scale_align < 16:
        return "b and b_scale must be 16-byte aligned (TMA and bulk copies)"
    return None


def _steps(k: int, block_m: int, ctas_per_sm: int, packed: bool) -> int:
    """K steps (stages) of a tile."""
    return -(-k // stage_k(block_m, ctas_per_sm, packed))


def smem_limit(p: Problem, ctas_per_sm: int = 1) -> int:
    """Shared memory one CTA may take: the per-block opt-in limit, or with two CTAs per SM half of
    the SM's shared memory less the 1 KiB the hardware reserves per CTA."""
    per_block = problem_smem_per_block(p, SM90_SMEM_PER_BLOCK)
    if ctas_per_sm == 1:
        return per_block
    return min(per_block, (problem_smem_per_sm(p, SM90_SMEM_PER_SM) - ctas_per_sm * 1024) // ctas_per_sm)


def tile_reason(block_m: int, stages: int, ctas_per_sm: int, block_ms: tuple = BLOCK_MS,
                k_groups: int = 1) -> Optional[str]:
    """Why a launch of this tile (block_m in `block_ms`, stages, CTAs per SM, K groups) is not
    compiled, or None (shared memory is checked apart)."""
    if block_m not in block_ms:
        return f"block_m={block_m} must be one of {block_ms}"
    if not MIN_STAGES <= stages <= MAX_STAGES:
        return f"stages={stages} must be between {MIN_STAGES} and {MAX_STAGES}"
    if ctas_per_sm not in (1, 2) or (ctas_per_sm == 2 and block_m > TWO_CTA_MAX_BLOCK_M):
        return (f"ctas_per_sm={ctas_per_sm} must be 1, or 2 with block_m <= {TWO_CTA_MAX_BLOCK_M} "
                f"(got block_m={block_m})")
    if k_groups not in (1, 2) or (k_groups == 2 and (ctas_per_sm != 1 or block_m > K_GROUPS_MAX_BLOCK_M)):
        return (f"k_groups={k_groups} must be 1, or 2 with ctas_per_sm=1 and block_m <= "
                f"{K_GROUPS_MAX_BLOCK_M} (got ctas_per_sm={ctas_per_sm}, block_m={block_m})")
    if k_groups == 2 and stages < K_GROUPS_MIN_STAGES:
        return f"k_groups=2 needs stages >= {K_GROUPS_MIN_STAGES}, got stages={stages}"
    return None


def why_not(t: Tactic, p: MmProblem) -> Optional[str]:
    if not isinstance(t, WgmmaMmTactic):
        return f"{t.family} is not a cuda Hopper-GEMM tactic"
    reason = problem_reason(p) or tile_reason(t.block_m, t.stages, t.ctas_per_sm, k_groups=t.k_groups)
    if reason is not None:
        return reason
    if not 1 <= t.split_k <= MAX_SPLIT:
        return f"split_k={t.split_k} must be between 1 and {MAX_SPLIT} (a thread-block cluster along K)"
    if t.persistent and t.split_k != 1:
        return f"persistent=True needs split_k=1 (split-K CTAs take one tile each), got split_k={t.split_k}"
    if t.stream_k and not t.persistent:
        return "stream_k=True needs persistent=True (it shares out a persistent launch's K steps)"
    if t.k_groups == 2 and p.weight_layout is not F.WeightLayout.SM90:
        return ("k_groups=2 reads 'sm90' weights only (row-major weights' stage operands spill from the 104 "
                "registers of its MMA threads)")

    steps = _steps(p.k, t.block_m, t.ctas_per_sm, p.packed)
    if empty_k_slice(t.split_k, steps):
        return f"split_k={t.split_k} leaves an empty K slice for K={p.k}"
    smem = smem_bytes(t.block_m, t.stages, t.persistent, t.k_groups, ctas_per_sm=t.ctas_per_sm, packed=p.packed)
    return smem_reason(smem, smem_limit(p, t.ctas_per_sm))


def _split_for(ctas: int, k: int, sms: int, block_m: int, ctas_per_sm: int, packed: bool) -> int:
    """The largest split keeping one wave (ctas * split <= SMs) and two stages per split."""
    steps = _steps(k, block_m, ctas_per_sm, packed)
    split = max(1, min(MAX_SPLIT, sms // max(ctas, 1), steps // 2))
    return largest_split(split, steps)


WIDE_MIN_BLOCK_M = 128   # M > 128: block_m from 128 up, by _launch_cost
TILE_FIXED_ROWS = 32     # a tile's fixed cost per K step (weight decode, barriers), in activation rows
SK_WAVE_COST = 0.15      # stream-K's cost (partial sums through global memory, flags), in waves, ...
SK_COST_STEPS = 20       # ... at least this many 64-K steps of one CTA slot (sk_waves)


def sk_waves(k: int) -> float:
    """Stream-K's cost in waves of the CTA slots at this K, for launches of less than two waves:
    SK_WAVE_COST (fitted at K = 8192), or at shorter K SK_COST_STEPS of its 64-K steps (stream_k_pays)."""
    return max(SK_WAVE_COST, SK_COST_STEPS / -(-k // BLOCK_K))


def _launch_cost(t: "WgmmaMmTactic", p: MmProblem) -> float:
    """A launch's time in units of one K step of one activation row, for choosing block_m at M > 128:
    waves x (block_m + TILE_FIXED_ROWS). Waves: whole waves of the CTA slots; with stream-K, which
    shares the last ones out, the fraction, plus SK_WAVE_COST past half a wave (few tiles shared over
    every slot, _few_tiles' at most a third of a wave, pay none: split-K, their alternative, pays
    too); a split-K launch's waves divided by
    its split (each CTA takes 1 / split of the K steps). Checked against the fastest tactic at each
    of 50 points of a sweep (H200, "sm90" weights, scripts/sweep_block_m.py, every block_m from 128,
    with and without stream-K at some: M = 160-1024 on 8192 x 8192, 28672 x 8192 and 8192 x 28672,
    M = 1100-4096 on the first two; docs/benchmarks/mm_block_m_sweep_h200.txt). Its choice lost
    0.05% on average, at most 2.5% (28672 x 8192 M = 1536). With stream-K at no cost it lost 5.2%
    at 8192 x 8192 M = 704 (block_m 256 with stream-K 151.0 us, 192 without 143.6). With no
    fixed cost per tile it picked block_m 128 where 192 was 27% faster (8192 x 8192 M = 384).
    Stream-K below one wave (stream_k_pays) pays the same cost past half a wave: at the 27 points
    where that changed the choice on shapes of 2048-12288 x 8192-18944 (H200,
    scripts/ab_stream_k_one_wave.py, docs/benchmarks/mm_stream_k_one_wave_h200.txt), 24 ran
    2-33% faster and 3 slower (6144 x 8192 M = 240 +1.1%, 2048 x 8192 M = 1040 +2.2%, 2304 x 14336
    M = 496 +7.0%: 128-row tiles with stream-K against 192-row tiles at split 2); at no cost it
    also displaced split 2 and whole waves of smaller tiles where those were up to 16% faster."""
    sms = problem_sm_count(p)
    tiles = -(-p.m // t.block_m) * -(-p.n // ROWS)
    slots = t.ctas_per_sm * sms
    if t.persistent:
        # block_m as at long K, where the fit was made: stream-K where stream_k_pays takes it there.
        # With stream-K at this K (without its cost: 256 x 28672 x 4096 went from block_m 256 to 128,
        # 94.2 -> 102.8 us "sm90", 95.3 -> 115.7 row-major; with sk_waves here: 23 problems per layout
        # changed block_m, "sm90" 15 faster and 8 slower, row-major 18 slower, up to 22%; H200)
        sk = t.stream_k or stream_k_pays(tiles, slots, -(-p.n // ROWS), t.block_m, p.k, long_k=True)
        waves = tiles / slots + (SK_WAVE_COST if 2 * tiles > slots else 0.0) if sk else -(-tiles // slots)
    else:
        waves = -(-tiles * t.split_k // slots) / t.split_k
    return waves * (t.block_m + TILE_FIXED_ROWS)


def default(p: MmProblem) -> Tactic:
    """At M <= 128 the smallest block_m covering M (_tactic_for; block_m 96 at M = 65-96: 3.4-9.2%
    faster than 128 at 12 points, H200, scripts/ab_block_m.py --without 96,
    docs/benchmarks/mm_block_m_96_h200.txt); above, of the block_m from 128 up,
    the one whose tactic has the lowest _launch_cost (ties: the larger block_m). Each block_m's tile
    waste differs: M = 320 fills two tiles of 160, M = 448 two of 224, M = 576 three of 192 (H200,
    8192 x 8192: 320 at block_m 160 62.8 us against 71.0 at 192 and 91.7 at 256; 28672 x 8192 M = 448
    314.5 at 224 against 352.8 at 256; docs/benchmarks/mm_block_m_sweep_h200.txt)."""
    if p.m <= WIDE_MIN_BLOCK_M:
        return _tactic_for(p, next(b for b in BLOCK_MS if b >= p.m))
    tactics = [_tactic_for(p, b) for b in reversed(BLOCK_MS) if b >= WIDE_MIN_BLOCK_M]
    return min(tactics, key=lambda t: _launch_cost(t, p))


def _tactic_for(p: MmProblem, bm: int) -> Tactic:
    """The tactic at block_m `bm` (up to 256: more activation rows per weight decode won every
    H100 sweep, e.g. M = 128, N = 8192, K = 28672: block_m 128 with split 2 153 us, block_m 64
    266 us), split-K up to one wave, as many stages as fit, persistent without split-K; two CTAs
    per SM at block_m 32 (TWO_CTA_AUTO_MAX_BLOCK_M) once the tiles fill TWO_CTA_AUTO_FILL of the
    two-CTA slots (H100, N = 28672, K = 8192, sm90 weights: M = 32 79.2 -> 68.1 us; with fewer
    tiles the split-K launch at one CTA per SM stays ahead: N = 8192 M = 64 78.1 us against 107 us
    at split 4 x 2). Below that fill, one CTA per SM (persistent, stream-K where stream_k_pays,
    two K groups on "sm90" weights): H200, M = 32, 160 tiles on 264 slots, N x K = 20480 x 8192,
    "sm90" 54.5 -> 41.6 us, row-major 73.8 -> 56.8; at 224 tiles, 85% of the slots, the two-CTA
    launch stays within 3% (28672 x 8192 55.6 against 54.2, 28672 x 4096 30.6 against 31.1;
    docs/benchmarks/mm_two_ctas_and_stream_k_cost_h200.txt).
    Not at block_m 64, whose one-CTA stages of two sub-tiles convert the scales once per CTA (H200,
    "sm90" weights, same rounds, one CTA persistent (stream-K where stream_k_pays) against two:
    28672 x 8192 M = 48 / 64 67.4 / 68.1 against 79.2 / 79.8 us, 20480 x 8192 M = 64 51.4 against
    79.3, 28672 x 4096 M = 64 40.1 against 42.7; at block_m 32 two CTAs stayed ahead, 55.5 against
    58.8 us at 28672 x 8192);
    stream-K where stream_k_pays; two K groups for the split-K launches at block_m <= 64 on "sm90"
    weights (H200, against one K group in the same rounds: N x K = 8192 x 28672 M = 32 65.7 ->
    61.8 us, M = 64 74.8 -> 69.9 us; 8192 x 8192 M = 64 26.8 -> 26.1 us; at block_m 128, not
    compiled, the accumulators spilled: 97.6 -> 105.7 us) and for the one-CTA persistent launches
    at block_m 32 (K_GROUPS_PERSISTENT_MAX_BLOCK_M; 28672 x 8192 M = 32 with stream-K 58.8 -> 54.2
    us, 20480 x 8192 44.6 -> 41.5; 14336 x 4096, one wave, 19.0 -> 18.0; at block_m 64 one K group
    stayed ahead, 68.1 against 69.2). Where split 2 would leave the SMs short (N <= ~5600 at
    M <= block_m), _few_tiles (which may take another block_m and split, of clusters that all run
    at once)."""
    m, n, k = p.m, p.n, p.k
    n_tiles = -(-n // ROWS)
    tiles = -(-m // bm) * n_tiles
    sms = problem_sm_count(p)
    two = bm <= TWO_CTA_AUTO_MAX_BLOCK_M and tiles >= TWO_CTA_AUTO_FILL * 2 * sms
    ctas, stream_k = (2 if two else 1), False
    split = _split_for(tiles, k, sms, bm, ctas, p.packed)
    if split > MAX_CLUSTER_SPLIT:
        bm, split, ctas, stream_k = _few_tiles(m, n_tiles, k, sms, bm, split, p.packed)
        tiles = -(-m // bm) * n_tiles
    persistent = split == 1
    kg = 2 if p.packed and ctas == 1 and (bm <= K_GROUPS_PERSISTENT_MAX_BLOCK_M or
                                          (bm <= K_GROUPS_MAX_BLOCK_M and not persistent)) else 1
    stages = max_stages(bm, smem_limit(p, ctas), persistent, kg, ctas_per_sm=ctas, packed=p.packed)
    sk = persistent and (stream_k or stream_k_pays(tiles, ctas * sms, n_tiles, bm, k))
    return WgmmaMmTactic(bm, stages, split, persistent, ctas, sk, kg)


MAX_CLUSTER_SPLIT = 2     # a split-K launch of more CTAs per tile goes through _few_tiles
FILL = 0.9                # share of the SMs a split-2 launch of 128-row tiles should occupy (long K)
LONG_K_STEPS = 128        # K >= 8192: stream-K over every CTA slot ...
SK_MAX_PARTS = 8          # ... while each tile's K steps go to at most about this many CTAs
# Clusters of each size (the split) that one-CTA-per-SM CTAs can all hold at once on a Hopper GPU
# of SM90_CLUSTER_SMS SMs (scaled by the SM count): a cluster's CTAs share one GPC, so a launch of
# more of them runs a second wave at about twice the time. H200 (scripts/sweep_few_tiles.py;
# docs/benchmarks/mm_small_weights_h200.txt, part D): 36 / 28 / 20 / 16 / 12 / 12 clusters of
# 3 / 4 / 5 / 6 / 7 / 8 ran in one wave, 40 / 32 / 24 / 20 / 16 / 16 did not; these leave a tenth
# of margin for GPUs whose GPCs hold fewer SMs. Pairs fill every SM.
SM90_CLUSTER_SMS = 132
SM90_CLUSTERS_AT_ONCE = {2: 66, 3: 32, 4: 25, 5: 18, 6: 14, 7: 11, 8: 11}
# The fixed cost of one K step of one CTA (weight decode, barriers) in activation rows, for
# choosing among few tiles' split-K launches: "sm90" weights, whose two K groups at block_m <= 64
# hide more of it, and row-major weights (fitted to the sweep's 72 points per layout).
FEW_TILES_FIXED_ROWS = {True: 16, False: 48}


def clusters_at_once(split: int, sms: int) -> int:
    """Clusters of `split` one-CTA-per-SM CTAs that run at once on `sms` SMs (SM90_CLUSTERS_AT_ONCE)."""
    return SM90_CLUSTERS_AT_ONCE[split] * sms // SM90_CLUSTER_SMS


def _few_tiles(m: int, n_tiles: int, k: int, sms: int, bm: int, split: int,
               packed: bool) -> tuple[int, int, int, bool]:
    """(block_m, split_k, ctas_per_sm, stream_k) where the tiles of block_m `bm` are too few for
    split 2 to fill the SMs (N <= ~5600 at M <= block_m), instead of `split` (3 to 8) CTAs along K
    per tile. At block_m 256, block_m 128 at split 2 where its tiles fill FILL of the SMs (H200,
    4096 x 14336 M = 256: stream-K 54.8 -> 50.2 us). Long K, every tile's steps over at most
    SK_MAX_PARTS CTAs: persistent stream-K over every slot (H200, "sm90" weights, N x K = 4096 x
    14336, M = 32 / 128 / 256: 38.1 -> 26.1, 55.1 -> 35.5, 85.8 -> 55.4 us against split 4;
    docs/benchmarks/mm_few_tiles_heuristic_h200.csv). Else the one-CTA-per-SM split-K launch of
    the least time per SM: of every block_m up to `bm` (128 at most: 256-row tiles at split 4
    measured 14% slower than 128-row ones at split 2, 3072 x 4096 M = 256) and split 2 to 8 whose
    clusters all run at once (clusters_at_once), the one of the fewest K steps per CTA times (block_m +
    FEW_TILES_FIXED_ROWS of the layout), times the CTAs per SM where they outnumber the SMs (ties: the larger
    block_m, then the fewer CTAs). H200, against the rule before (smaller block_m at split 2 where
    it filled 90% of the SMs, else two CTAs per SM at block_m <= 64, else `split`), over 72 points
    per layout of N = 512-4096, K = 3584-8192, M = 32-256 (scripts/sweep_few_tiles.py, every
    split-K launch timed; docs/benchmarks/mm_small_weights_h200.txt, part D): "sm90" weights
    1200.8 -> 1003.5 us in all (every launch's best: 977.4), row-major 1400.1 -> 1130.1 (best 1084.1); 3584 x 3584
    M = 128: 24.1 -> 14.7 us ("sm90"), 29.6 -> 17.0 (row-major); 2048 x 4096 M = 96: 22.1 -> 13.3.
    Before, the one-CTA-per-SM clusters of 4 to 8 that did not all fit at once ran a second wave
    (2048 x 4096 M = 96: block_m 96 at split 8, 16 clusters of 8), and block_m 32 at split 2
    decoded each weight tile four to eight times (3584 x 3584 M = 128)."""
    tiles = -(-m // bm) * n_tiles
    if bm > 128 and 2 * -(-m // 128) * n_tiles >= FILL * sms:
        return 128, 2, 1, False
    if -(-k // BLOCK_K) >= LONG_K_STEPS and tiles * SK_MAX_PARTS >= sms:
        return bm, 1, 1, True
    launches = []   # (time per SM, -block_m, split): ties go to the larger block_m, then fewer CTAs
    for b in (b for b in BLOCK_MS if b <= min(bm, 128)):
        clusters = -(-m // b) * n_tiles
        steps = _steps(k, b, 1, packed)
        step_cost = (b + FEW_TILES_FIXED_ROWS[packed]) * stage_k(b, 1, packed) // BLOCK_K
        launches += [(-(-clusters * s // sms) * -(-steps // s) * step_cost, -b, s)
                     for s in range(2, MAX_SPLIT + 1)
                     if not empty_k_slice(s, steps) and clusters <= clusters_at_once(s, sms)]
    if not launches:  # unreachable: block_m min(bm, 128) at split 2 makes fewer than SMs / 2 clusters here
        return bm, split, 1, False
    _, neg_b, s = min(launches)
    return -neg_b, s, 1, False


SK_MIN_IDLE = 0.10                 # idle share of the last wave's CTA slots that stream-K wins back
SK_MAX_ACT_BYTES = 36 << 20        # activations the stream-K tiles span at once: ~70% of the 50 MB L2


def stream_k_pays(tiles: int, slots: int, n_tiles: int, block_m: int, k: int, long_k: bool = False) -> bool:
    """Stream-K for a persistent launch when the tiles fill at least one wave of the CTA slots and
    leave at least SK_MIN_IDLE of the last wave idle; below two waves (where every tile's K steps
    are shared out) also more idle slots than stream-K's own cost (sk_waves; unless `long_k`, as
    _launch_cost asks): its partial sums and flags cost about 18-29 64-K steps of a slot at K = 2048
    to 8192 (H200, against the same launch without it, 224 tiles on 132 slots, 0.30 of a wave idle:
    block_m 64 "sm90" 28672 x 2048 / 4096 / 8192 M = 64 22.4 -> 25.9, 37.9 -> 39.6, 70.4 -> 67.5 us;
    block_m 128 28672 x 4096 / 8192 M = 128 53.0 -> 54.3, 107.6 -> 100.0; 160 tiles, 0.79 idle,
    20480 x 4096 M = 64 37.9 -> 31.6; from two waves on, where only the last waves' tiles are
    shared out, 448 tiles at K = 2048 (0.61 idle) ran 2-13% faster with it;
    docs/benchmarks/mm_two_ctas_and_stream_k_cost_h200.txt); and the activation rows of its tiles (taken
    at different K offsets at once: the m-tiles they reach, at most all) stay within
    SK_MAX_ACT_BYTES. Also where the tiles of block_m >= 128 fill less than one wave (too many for
    split 2) and leave more of the slots idle than stream-K's own cost (SK_WAVE_COST), at long K
    (LONG_K_STEPS): their K steps are shared out over every slot (H200, against the whole tiles:
    5120 x 8192 M = 288, 80 tiles of 160 rows on 132 slots, 52.2 -> 47.6 us; 12288 x 8192 M = 144,
    96 tiles, 60.4 -> 55.3; 3584 x 18944 M = 832, 112 tiles, 177.8 -> 173.4; at K = 4096 it lost:
    14336 x 4096 M = 160, 112 tiles, 31.3 -> 37.0). H100, sm90 weights, against the
    same tactic without it: N x K = 28672 x 8192 M = 256 (224 tiles on 132 slots) 176 -> 162 us,
    M = 512 380 -> 335 us, M = 128 112 -> 105 us (M = 64 at two CTAs per SM, 224 tiles on 264
    slots, less than one wave: 79.8 -> 77.7 us, not taken); with 3% of the last wave idle it loses
    (8192 x 8192 M = 1024, 256 tiles: 180 -> 195 us); and with K = 28672 four 256-row activation
    tiles (59 MB) at once thrash the L2 (8192 x 28672 M = 1024: 627 -> 1054 us). Up to 44 MB they
    did not (H200, 8192 x 28672 M = 576 three 192-row tiles, 33 MB: 437.0 -> 383.8 us; M = 768
    three 256-row tiles: 570.5 -> 533.5; docs/benchmarks/mm_block_m_sweep_h200.txt)."""
    m_tiles = -(-tiles // n_tiles)
    if tiles < slots:
        return (block_m >= WIDE_MIN_BLOCK_M and -(-k // BLOCK_K) >= LONG_K_STEPS
                and slots - tiles > SK_WAVE_COST * slots and m_tiles * block_m * k * 2 <= SK_MAX_ACT_BYTES)
    if tiles % slots == 0:
        return False
    waves = -(-tiles // slots)
    idle = waves * slots - tiles
    if idle < SK_MIN_IDLE * waves * slots or (not long_k and waves == 2 and idle < sk_waves(k) * slots):
        return False
    sk_tiles = tiles - (tiles // slots - 1) * slots
    return min(-(-sk_tiles // n_tiles) + 1, m_tiles) * block_m * k * 2 <= SK_MAX_ACT_BYTES


def candidates(p: MmProblem) -> list[Tactic]:
    if problem_reason(p) is not None:
        return []
    m, n, k = p.m, p.n, p.k
    sms = problem_sm_count(p)
    out: list[Tactic] = [default(p)]
    packed = p.packed
    for bm in BLOCK_MS:
        if bm > max(64, 2 * m):
            continue
        tiles = -(-m // bm) * -(-n // ROWS)
        base = _split_for(tiles, k, sms, bm, 1, packed)
        one = dict(ctas_per_sm=1, packed=packed)
        for stages in sorted({4, max_stages(bm, smem_limit(p), **one)}):
            for split in sorted({1, base, min(MAX_SPLIT, 2 * base)}):
                out.append(WgmmaMmTactic(bm, stages, split))
        for sk in (False, True):
            out.append(WgmmaMmTactic(bm, max_stages(bm, smem_limit(p), True, **one), 1, True, stream_k=sk))
        if bm <= K_GROUPS_MAX_BLOCK_M and packed:
            for split in sorted({1, base}):
                persistent = split == 1
                out.append(WgmmaMmTactic(bm, max_stages(bm, smem_limit(p), persistent, 2, **one), split, persistent,
                                         k_groups=2))
        if bm <= TWO_CTA_MAX_BLOCK_M:
            two, pair = smem_limit(p, 2), dict(ctas_per_sm=2, packed=packed)
            base2 = _split_for(tiles, k, 2 * sms, bm, 2, packed)
            for split in sorted({1, base2}):
                out.append(WgmmaMmTactic(bm, max_stages(bm, two, **pair), split, ctas_per_sm=2))
            for sk in (False, True):
                out.append(WgmmaMmTactic(bm, max_stages(bm, two, True, **pair), 1, True, 2, stream_k=sk))
    return valid_unique(out, why_not, p)


KEY_STEP_MIN_M = 64     # from above here up to KEY_STEP_MAX_M the tactic cache's M buckets are
KEY_STEP_MAX_M = 1024   # steps of 32 rows (key)


def key(p: MmProblem) -> str:
    """M in power-of-two buckets, but from 65 to KEY_STEP_MAX_M in steps of 32 rows: there the
    heuristic's block_m changes with M (default; a tactic tuned at M = 320, two tiles of 160, would
    take three, 480 rows, at M = 352; one tuned at M = 96, one tile of 96, two at M = 128)."""
    if KEY_STEP_MIN_M < p.m <= KEY_STEP_MAX_M:
        return mm_key(p, -(-p.m // 32) * 32)
    return mm_key(p, max(32, 1 << (p.m - 1).bit_length()))

