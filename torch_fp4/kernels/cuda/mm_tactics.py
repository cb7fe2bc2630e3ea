"""Tactics of the cuda backend's small-M FP4 GEMM (torch_fp4/csrc/mm_small_m.cu). Cheap to import:
no toolchain, no extension build.

A tactic picks one compiled tile shape (warps per CTA x 16-row MMA tiles per warp = weight rows per
CTA, and block_k, the K elements of one pipeline stage), the number of shared-memory stages, and
split_k: CTAs along K per weight tile, launched as a thread-block cluster whose partial tiles are
added in rank order through distributed shared memory (deterministic, no workspace).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

import torch

from ... import formats as F
from ...backends import Backend
from ...tactics import Tactic, TacticSpace, register_family, valid_unique
from ...problems import MmProblem
from .._common import (empty_k_slice, largest_split, mm_key, problem_sm_count, problem_smem_per_block,
                       smem_reason)

MAX_M = 64
PACKED_MAX_M = 32         # M range compiled for "sm90" weights (packed_compiled below)
MAX_MM_OPERAND = 2**31 - 1   # the kernel indexes its operands with 32-bit offsets
MAX_SPLIT = 8             # a portable cluster size
STAGES = (2, 3, 4, 5, 6)  # cp.async.wait_group takes stages - 2 as an immediate (0..4)
TILE_SHAPES = ((8, 1, 256), (8, 1, 128), (4, 1, 256), (4, 1, 128), (4, 2, 256), (4, 2, 128))
SM90_SMEM_PER_SM = 228 * 1024       # shared memory of an H100 SM (per-CTA reserve: 1 KiB)
SM90_SMEM_PER_BLOCK = 227 * 1024


def tile_compiled(nb: int, warps: int, tiles: int, block_k: int) -> bool:
    """The tile shapes compiled for n-block count nb (mirror of tile_compiled in mm_small_m.cuh)."""
    if warps == 8 and tiles == 1:
        return block_k == 128 or (block_k == 256 and nb <= 4)
    if warps == 4 and tiles == 1:
        return nb >= 4 if block_k == 128 else nb <= 4
    if warps == 4 and tiles == 2:
        return nb <= 2 if block_k == 256 else True
    return False


def packed_compiled(nb: int, warps: int, tiles: int) -> bool:
    """The tiles compiled for "sm90" weights (mirror of packed_compiled in mm_small_m.cuh): every
    tile up to M = 16, only the 64-row CTAs (4 warps x 1 tile) up to M = PACKED_MAX_M."""
    return nb <= 2 or (8 * nb <= PACKED_MAX_M and warps == 4 and tiles == 1)


def compiled(nb: int, warps: int, tiles: int, block_k: int, packed: bool) -> bool:
    """Whether the tile is compiled for n-block count nb and the weight layout."""
    return tile_compiled(nb, warps, tiles, block_k) and (not packed or packed_compiled(nb, warps, tiles))


def n_blocks(m: int) -> int:
    """Activation n-blocks of 8 rows the kernel is instantiated for (1, 2, 4 or 8)."""
    return 1 if m <= 8 else 2 if m <= 16 else 4 if m <= 32 else 8


@register_family
@dataclass(frozen=True)
class CudaMmTactic(Tactic):
    warps: int = 8           # warps per CTA (4 or 8)
    tiles_per_warp: int = 1  # 16-row MMA tiles per warp (1 or 2)
    block_k: int = 256       # K elements per pipeline stage (128 or 256)
    stages: int = 4          # shared-memory pipeline stages
    split_k: int = 1         # CTAs along K (a cluster; 1..8)

    backend = Backend.CUDA
    family = "cuda_mm_small_m"

    @property
    def block_n(self) -> int:
        """Weight rows per CTA."""
        return 16 * self.warps * self.tiles_per_warp


def smem_bytes(t: CudaMmTactic, nb: int, block: int, packed: bool = False) -> int:
    """Dynamic shared memory of a launch (mirror of smem_bytes in mm_small_m.cuh): a 1 KiB scale
    table, then `stages` stages of weights, activations (one 16-byte pad per 8 units; "sm90"
    weights (`packed`): one per row) and scale words; the epilogue's fp32 partial tile reuses the
    stages."""
    bn, bk = t.block_n, t.block_k
    act_rows = 8 * nb
    act_pitch = bk // 8 + (1 if packed else bk // 64)
    kw = bk // (4 * block)
    scale_pitch = {4: 20, 2: 12, 1: 5}[kw]
    stage = bn * bk // 2 + act_rows * act_pitch * 16 + (32 * scale_pitch * 4 + 15) // 16 * 16
    partial = act_rows * (bn + 4) * 4
    return 1024 + max(t.stages * stage, partial)


def _warps_per_sm_by_registers(t: CudaMmTactic, nb: int) -> int:
    """The register budget the kernel is compiled for (Config::kMinBlocks in mm_small_m.cuh)."""
    acc = nb * t.tiles_per_warp
    if acc <= 4 or (t.warps == 8 and acc <= 8):
        return 16
    return 12 if acc <= 8 else 8


def ctas_per_sm(t: CudaMmTactic, nb: int, block: int, packed: bool = False) -> int:
    """Resident CTAs per SM (shared memory, registers, 64 warps) on sm_90."""
    by_smem = SM90_SMEM_PER_SM // (smem_bytes(t, nb, block, packed) + 1024)
    by_regs = max(1, _warps_per_sm_by_registers(t, nb) // t.warps)
    return max(0, min(by_smem, by_regs, 64 // t.warps))


def _smem_limit(p: MmProblem) -> int:
    return problem_smem_per_block(p, SM90_SMEM_PER_BLOCK)


def _steps(k: int, block_k: int) -> int:
    return -(-k // block_k)


def half_mx_reason(p: MmProblem) -> Optional[str]:
    """The cuda GEMMs multiply in the activations' 16-bit type: fp16 cannot hold every MXFP4 value."""
    if not p.w4a4 and p.a_dtype == torch.float16 and p.fmt is F.MXFP4:
        return ("fp16 activations with MXFP4 weights: the kernel multiplies in fp16 for fp16 "
                "activations, which cannot hold every MXFP4 value (triton handles this case)")
    return None


def operand_reason(p: MmProblem) -> Optional[str]:
    """Why the kernel cannot address these operands (sizes, alignment), or None."""
    m, n, k = p.m, p.n, p.k
    if n * (k // 2) > MAX_MM_OPERAND or m * k > MAX_MM_OPERAND:
        return f"operands beyond 2^31 elements (M={m}, N={n}, K={k}) need 64-bit offsets"
    if not p.w4a4 and p.a_align < 16:
        return "the activations a must be 16-byte aligned"
    if p.b_align < (16 if p.packed else 8) or p.b_scale_align < 4:
        return (f"b must be {16 if p.packed else 8}-byte and b_scale 4-byte aligned")
    return None


def problem_reason(p: MmProblem) -> Optional[str]:
    """Why the small-M GEMM cannot run this problem with any tactic, or None (the tactic space
    checks it before a tactic's own limits, why_not)."""
    if p.m > MAX_M:
        return f"the cuda mm_fp4 kernel is for M <= {MAX_M} (decode); larger M uses triton"
    if p.packed and p.m > PACKED_MAX_M:
        return (f"the small-M kernel reads 'sm90' weights for M <= {PACKED_MAX_M} (the Hopper GEMM "
                f"reads them at every M)")
    return half_mx_reason(p) or operand_reason(p)


def why_not(t: Tactic, p: MmProblem) -> Optional[str]:
    """Why tactic `t` cannot run problem `p` that the small-M GEMM runs (problem_reason None)."""
    if not isinstance(t, CudaMmTactic):
        return f"{t.family} is not a cuda tactic"
    fmt, k = p.fmt, p.k
    if t.block_k % fmt.block_size:
        return (f"block_k={t.block_k} is not a multiple of the {fmt.name.upper()} block "
                f"({fmt.block_size})")
    if t.block_k not in (128, 256):
        return f"block_k={t.block_k} must be 128 or 256"
    nb = n_blocks(p.m)
    if not compiled(nb, t.warps, t.tiles_per_warp, t.block_k, p.packed):
        have = ", ".join(f"warps={w} tiles_per_warp={r} block_k={b}" for w, r, b in TILE_SHAPES
                         if compiled(nb, w, r, b, p.packed))
        return (f"warps={t.warps}, tiles_per_warp={t.tiles_per_warp}, block_k={t.block_k} is not "
                f"compiled for M <= {8 * nb}{' with sm90 weights' if p.packed else ''} (compiled: {have})")
    if t.stages not in STAGES:
        return f"stages={t.stages} must be one of {STAGES}"
    if not 1 <= t.split_k <= MAX_SPLIT:
        return f"split_k={t.split_k} must be between 1 and {MAX_SPLIT} (a thread-block cluster along K)"
    steps = _steps(k, t.block_k)
    if empty_k_slice(t.split_k, steps):
        return f"split_k={t.split_k} leaves an empty K slice for K={k} with block_k={t.block_k}"
    return smem_reason(smem_bytes(t, nb, fmt.block_size, p.packed), _smem_limit(p))


def _split_for(t: CudaMmTactic, p: MmProblem, per_sm: Optional[int] = None) -> int:
    """The largest split (any cluster size up to 8) whose grid fits one wave of `per_sm` CTAs
    per SM (default: as many as are resident), keeping at least two stages per split."""
    tiles = -(-p.n // t.block_n)
    per_sm = per_sm or max(1, ctas_per_sm(t, n_blocks(p.m), p.fmt.block_size, p.packed))
    slots = problem_sm_count(p) * per_sm
    steps = _steps(p.k, t.block_k)
    split = max(1, min(MAX_SPLIT, slots // tiles, steps // 2))
    return largest_split(split, steps)


FEW_TILES = 4   # "sm90" weights with at most SMs / FEW_TILES 128-row tiles take 64-row CTAs
LONG_K = 8192             # ... except at long K where the 128-row tiles are at least
LONG_K_MIN_TILES_SHARE = 6   # SMs / 6 (N >= ~2900): _two_tile_ctas
ONE_WAVE_TILES = 1.0      # _two_tile_ctas also from SMs / FEW_TILES up to ONE_WAVE_TILES x SMs tiles,
FULL_WAVE = 0.95          # where the 8-warp CTAs leave more than 1 - FULL_WAVE of the SMs idle or K < LONG_K
PAIR_CTAS = 1.75          # CTAs of _two_tile_ctas' launch, in SMs (at most; split 2 always)
ROW_MIN_TILES_SHARE = 9   # row-major weights take _two_tile_ctas from SMs / 9 tiles (N >= ~1900) at any K


def _two_tiles_pay(p: MmProblem, tiles: int, sms: int) -> bool:
    """Whether _two_tile_ctas replaces the heuristic at M <= 16 (its docstring says where and why)."""
    if tiles * FEW_TILES <= sms:
        return (p.k >= LONG_K and tiles * LONG_K_MIN_TILES_SHARE >= sms
                or not p.packed and tiles * ROW_MIN_TILES_SHARE >= sms)
    if tiles > ONE_WAVE_TILES * sms:
        return False
    one_tile = CudaMmTactic(8, 1, 256, 4, 1)
    return p.k < LONG_K or tiles * _split_for(one_tile, p, per_sm=1) < FULL_WAVE * sms


def _two_tile_ctas(tiles: int, sms: int, k: int, packed: bool) -> CudaMmTactic:
    """M <= 16 where the 128-row weight tiles do not fill a wave of SMs: 128-row CTAs of 4 warps x 2
    tiles (up to four CTAs per SM), split-K up to PAIR_CTAS x SMs CTAs and at least 2 (H200, 132
    SMs: 22-28 tiles split 8, 32 tiles split 7, 72 tiles split 3, 80-128 tiles split 2). "sm90"
    weights: 4 stages of K = 128, from SMs / 6 tiles at K >= LONG_K and from SMs / 4 at any K;
    row-major weights: 2 stages of K = 256, from SMs / 9 tiles at any K. From SMs / 4 tiles up to
    SMs, only where the 8-warp CTAs of one tile leave more than 1 - FULL_WAVE of the SMs idle or
    K < LONG_K (default). Longer
    clusters past PAIR_CTAS x SMs measured slower (6144 x 4096: split 5 over 4, 5120 x 5120: split 6
    over 5), while pairs fill every SM (16384 x 4096: split 2 over 1). Found by timing every
    small-M tactic (scripts/sweep_small_m_decode.py; docs/benchmarks/mm_small_m_decode_h200.txt):
    - with at most SMs / 4 tiles at long K, against the 64-row CTAs (which halve the rows instead),
      2-21% faster at all 15 points of scripts/ab_small_m_two_tile.py (4096 x 14336 M = 1 / 8 / 16:
      17.67 -> 16.00, 18.24 -> 16.40, 21.23 -> 18.93 us); at K = 4096 and for fewer tiles not
      consistently (4096 x 4096 M = 16 +4%, 2048 x 8192 M = 1 +12%): those keep the 64-row CTAs;
    - with more tiles, against the 8-warp CTAs of one 128-row tile at split SMs // tiles
      (scripts/ab_small_m_two_tile.py --rule one_wave; docs/benchmarks/mm_small_m_one_wave_h200.txt):
      2-39% faster at all 48 points where those leave SMs idle or K < LONG_K (M = 16: 9216 x 4096
      19.22 -> 14.46 us, 5120 x 27648 69.19 -> 42.47, 10240 x 8192 35.73 -> 31.90, 14336 x 4096
      19.86 -> 18.47; 16384 x 4096, 97% of the SMs busy: 19.82 -> 18.39), but
      13-21% slower where they fill the SMs at long K (8192 x 8192 and 8192 x 28672, 64 tiles at
      split 2 against split 3: 17.23 -> 20.28, 48.22 -> 58.34 us at M = 1): those keep them;
    - row-major weights at the same splits, against their CTAs of one 128-row tile (`--layout row`):
      8-38% faster at all 39 points from SMs / 4 tiles (9216 x 4096 M = 16: 19.71 -> 14.90 us;
      5120 x 27648: 66.56 -> 41.33; 14336 x 8192: 36.67 -> 31.21), 10-40% at all 15 with fewer at
      long K (4096 x 14336 M = 1 / 16: 23.41 -> 15.93, 29.22 -> 18.72; 4096 x 28672: 42.51 ->
      27.37, 53.52 -> 32.17), and 2-18% at all 12 points from SMs / 9 tiles below those
      (`--rule row_few`; 4096 x 4096 M = 16: 12.03 -> 9.83 us); with 8 tiles (N = 1024) between
      2.4% slower and 1.0% faster, so fewer tiles keep their CTAs of one tile."""
    split = max(2, min(MAX_SPLIT, int(PAIR_CTAS * sms) // tiles))
    block_k, stages = (128, 4) if packed else (256, 2)
    return CudaMmTactic(4, 2, block_k, stages, largest_split(split, _steps(k, block_k)))


def default(p: MmProblem) -> Tactic:
    """Heuristic, from `bench mm --tactics` sweeps on H100 (N=8192, K=28672): M <= 8: 4 warps of
    two 16-row tiles (128 weight rows per CTA), 4 stages of K=256 (54.4 us at M = 1, 3.0x bf16);
    M <= 16: 8 warps of one tile, 4 stages of 256 (64.0 us); split_k gives about one CTA per SM
    (2 there; the split 8 that fills every resident slot was 14% slower). M <= 32: 8 warps x 1
    tile with 3 stages of 256; M <= 64: 8 warps x 1 tile with 4 stages of 128 (the activation
    tile is 4x wider; HMMA-bound, 0.85x bf16 at M = 64 where Triton reaches 1.6x, so `auto` uses
    this backend only up to M = 16).
    "sm90" weights (H100 sweep over every candidate, N x K = 8192 x 8192, 28672 x 8192, 8192 x
    28672): M <= 8 runs 8 warps of one tile, 4 stages of 256, 5-6% faster there than two tiles
    per warp (8192 x 28672 M = 1: 49.8 against 52.3 us); at M <= 16, once the 128-row tiles
    outnumber the SMs (no split), 4 warps of two tiles with 4 stages of K = 128 (28672 x 8192:
    56.0 against 61.7 us; with fewer tiles the 8 x 1 tile of 256 stays best)."""
    nb = n_blocks(p.m)
    packed = p.packed
    sms = problem_sm_count(p)
    if packed and nb == 4:
        # M <= 32 ("sm90" weights compile only the 64-row CTAs there): about one wave; with at most
        # a quarter as many 64-row tiles as SMs, K stages of 128 and two CTAs per SM (H200, 2048 x
        # 4096 M = 17: 9.3 -> 8.4 us; docs/benchmarks/mm_small_m_sm90_m32_h200.csv).
        if -(-p.n // 64) * FEW_TILES <= sms:
            t = CudaMmTactic(4, 1, 128, 4, 1)
            return dataclasses.replace(t, split_k=_split_for(t, p, per_sm=2))
        t = CudaMmTactic(4, 1, 256, 4, 1)
        return dataclasses.replace(t, split_k=_split_for(t, p, per_sm=1))
    tiles = -(-p.n // 128)
    if nb <= 2 and _two_tiles_pay(p, tiles, sms):
        return _two_tile_ctas(tiles, sms, p.k, packed)
    if packed and nb <= 2 and tiles * FEW_TILES <= sms:
        # few 128-row tiles (N <= ~4200): 64-row CTAs, split-K over every resident slot (M <= 8)
        # or about one wave (M <= 16). H200, against the 128-row default (4 CTAs per tile):
        # 4096 x 14336 M = 1 / 8 / 16: 24.4 -> 17.7, 25.1 -> 18.4, 29.3 -> 21.5 us; 4096 x 4096:
        # 10.1 -> 8.3, 10.6 -> 8.8, 12.0 -> 9.0 us (docs/benchmarks/mm_small_m_few_tiles_h200.csv)
        t = CudaMmTactic(4, 1, 256, 2 if nb == 1 else 4, 1)
        return dataclasses.replace(t, split_k=_split_for(t, p, per_sm=None if nb == 1 else 1))
    if nb == 1:
        t = CudaMmTactic(8, 1, 256, 4, 1) if packed else CudaMmTactic(4, 2, 256, 4, 1)
    elif nb == 2:
        t = CudaMmTactic(8, 1, 256, 4, 1)
        if packed and -(-p.n // t.block_n) > sms:
            t = CudaMmTactic(4, 2, 128, 4, 1)
    elif nb == 4:
        t = CudaMmTactic(8, 1, 256, 3, 1)
    else:
        t = CudaMmTactic(8, 1, 128, 4, 1)
    return dataclasses.replace(t, split_k=_split_for(t, p, per_sm=1))


def candidates(p: MmProblem) -> list[Tactic]:
    if problem_reason(p) is not None:
        return []
    nb = n_blocks(p.m)
    out: list[Tactic] = [default(p)]
    for warps, tiles, bk in TILE_SHAPES:
        if not compiled(nb, warps, tiles, bk, p.packed):
            continue
        for stages in (2, 3, 4):
            t = CudaMmTactic(warps, tiles, bk, stages, 1)
            base = _split_for(t, p)
            for split in sorted({max(1, base // 2), base, min(MAX_SPLIT, 2 * base)}):
                out.append(CudaMmTactic(warps, tiles, bk, stages, split))
    return valid_unique(out, why_not, p)


def key(p: MmProblem) -> str:
    return mm_key(p, 8 * n_blocks(p.m))


def space_why_not(t: Tactic, p: MmProblem) -> Optional[str]:
    """The family's problem limits, then the tactic's own."""
    return problem_reason(p) or why_not(t, p)


MM_SPACE = TacticSpace(candidates=candidates, default=default, key=key, why_not=space_why_not)
