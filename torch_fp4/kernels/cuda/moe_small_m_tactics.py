"""Tactics of the cuda backend's fused_moe at decode sizes (kernels/cuda/moe.py, csrc/moe_small_m.cu):
both GEMMs are the small-M FP4 GEMM of csrc/mm_small_m.cuh run grouped, one block of block_m
routed rows of one expert per grid z, so each CTA streams one tile of one routed expert's
weights once for all of that expert's rows in the block. Cheap to import: no toolchain.

A tactic is the small-M tile (warps, tiles_per_warp, block_k, stages: kernels/cuda/mm_tactics.py)
shared by both GEMMs, block_m (8, 16, 32 or 64 rows: the kernel's activation tile and the
grouping's padding unit) and each GEMM's split-K cluster size.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ... import formats as F
from ...backends import Backend
from ...problems import MoeProblem
from ...tactics import Tactic, register_family
from .._common import MAX_GRID_Z, empty_k_slice, largest_split, problem_sm_count, problem_smem_per_block, smem_reason
from ..triton.moe_align import max_blocks
from . import mm_tactics as sm

BLOCK_MS = (8, 16, 32, 64)
MAX_OPERAND = 2**31 - 1       # 32-bit element offsets inside one expert's operands
MAX_EXPERTS = 2048            # the decode path's one-CTA grouping (csrc/moe_route.cuh kMaxExperts)

PACKED_MAX_BLOCK_M = 16   # "sm90" experts: the grouped decode path reads them at block_m <= 16 (kPackedMaxBlockM)


@register_family
@dataclass(frozen=True)
class SmallMMoeTactic(Tactic):
    block_m: int = 16         # routed rows of one expert per block (8, 16, 32, 64)
    warps: int = 8            # the small-M tile (mm_tactics.CudaMmTactic)
    tiles_per_warp: int = 1
    block_k: int = 256
    stages: int = 4
    fc1_split: int = 1        # CTAs along K per weight tile (a cluster), FC1 and FC2
    fc2_split: int = 1

    backend = Backend.CUDA
    family = "cuda_moe_small_m"

    def gemm_tactic(self, split: int) -> sm.CudaMmTactic:
        return sm.CudaMmTactic(self.warps, self.tiles_per_warp, self.block_k, self.stages, split)


def _gemms(p: MoeProblem, t: SmallMMoeTactic):
    """(name, weight rows per output tile, K, split) of FC1 (SwiGLU: half the CTA's rows are
    gate rows, half up rows) and FC2."""
    bn = 16 * t.warps * t.tiles_per_warp
    return (("FC1", bn // 2, p.hidden, t.fc1_split), ("FC2", bn, p.inter, t.fc2_split))


def problem_reason(p: MoeProblem) -> Optional[str]:
    """Why the grouped small-M GEMMs cannot run this fused_moe problem at all, or None."""
    if p.is_cuda and p.capability < (9, 0):
        return "the grouped small-M GEMM needs compute capability 9.0+ (thread-block clusters)"
    if p.experts > MAX_EXPERTS:
        return f"the decode path groups the pairs of at most {MAX_EXPERTS} local experts, got {p.experts}"
    if p.hidden == 0 or p.inter == 0:
        return "empty expert weights (H or I is 0)"
    if p.hidden * max(p.tokens, 1) > MAX_OPERAND:
        return f"x [{p.tokens}, {p.hidden}] is beyond 2^31 elements (32-bit row offsets)"
    if 2 * p.inter * (p.hidden // 2) > MAX_OPERAND or p.hidden * (p.inter // 2) > MAX_OPERAND:
        return "one expert's weights are beyond 2^31 bytes (32-bit offsets)"
    if p.weight_align < 8:
        return "w1 and w2 must be 8-byte aligned, their scales 4-byte aligned"
    return gpt_oss_reason(p, "the decode path")


def gpt_oss_reason(p: MoeProblem, family: str, w4a4: bool = False) -> Optional[str]:
    """What a cuda fused_moe GEMM family (`family`, named) refuses of gpt-oss's features: W4A4
    with them (unless `w4a4`: the family takes them), and MXFP4 experts on fp16 activations
    (W4A16: W4A4 feeds the GEMMs bf16 values); else None."""
    if p.w4a4 and p.gpt_oss_features is not None and not w4a4:
        return f"{family} runs {p.gpt_oss_features} in W4A16 only (W4A4: the grouped Hopper GEMMs)"
    if p.fmt is F.MXFP4 and p.x_dtype != torch.bfloat16 and not p.w4a4:
        return f"{family} runs MXFP4 experts on bf16 activations only"
    return None


def why_not(t: SmallMMoeTactic, p: MoeProblem) -> Optional[str]:
    reason = problem_reason(p)
    if reason is not None:
        return reason
    if t.block_m not in BLOCK_MS:
        return f"block_m={t.block_m} must be one of {BLOCK_MS}"
    if p.packed and t.block_m > PACKED_MAX_BLOCK_M:
        return f"'sm90' experts are read at block_m <= {PACKED_MAX_BLOCK_M} (csrc/moe_small_m.cu), got block_m={t.block_m}"
    nb = t.block_m // 8
    if not sm.tile_compiled(nb, t.warps, t.tiles_per_warp, t.block_k):
        return (f"warps={t.warps}, tiles_per_warp={t.tiles_per_warp}, block_k={t.block_k} is not "
                f"compiled for block_m={t.block_m}")
    if t.stages not in sm.STAGES:
        return f"stages={t.stages} must be one of {sm.STAGES}"
    for name, cols, k, split in _gemms(p, t):
        if not 1 <= split <= sm.MAX_SPLIT:
            return f"{name}: split {split} must be between 1 and {sm.MAX_SPLIT} (a thread-block cluster)"
        if empty_k_slice(split, -(-k // t.block_k)):
            return f"{name}: split {split} leaves an empty K slice for K={k} with block_k={t.block_k}"
    blocks = max_blocks(p.tokens * p.top_k, p.experts, t.block_m)
    if blocks > MAX_GRID_Z:
        return f"{blocks} blocks of {t.block_m} routed rows exceed the grid's {MAX_GRID_Z}"
    return smem_reason(sm.smem_bytes(t.gemm_tactic(1), nb, p.fmt.block_size, p.packed),
                       problem_smem_per_block(p, sm.SM90_SMEM_PER_BLOCK))


def expected_experts(p: MoeProblem) -> float:
    """Distinct experts a batch routes to, for uniform routing: E (1 - (1 - k / E)^T)."""
    e = max(1, p.experts)
    return e * (1.0 - (1.0 - min(p.top_k, e) / e) ** p.tokens)


def _split(p: MoeProblem, t: SmallMMoeTactic, cols: int, n: int, k: int) -> int:
    """The largest split (up to 8) whose grid over the expected routed experts fits one CTA per
    SM, as the dense small-M heuristic, keeping two stages per split."""
    tiles = max(1.0, -(-n // cols) * expected_experts(p))
    steps = -(-k // t.block_k)
    split = max(1, min(sm.MAX_SPLIT, int(problem_sm_count(p) // tiles), steps // 2))
    return largest_split(split, steps)


def with_splits(p: MoeProblem, t: SmallMMoeTactic) -> SmallMMoeTactic:
    bn = 16 * t.warps * t.tiles_per_warp
    return SmallMMoeTactic(t.block_m, t.warps, t.tiles_per_warp, t.block_k, t.stages,
                           _split(p, t, bn // 2, p.inter, p.hidden), _split(p, t, bn, p.hidden, p.inter))


# The tile per n-block count: 4 warps of two 16-row tiles with 3 stages of K = 256 at 8 and 16 rows
# (fastest or within 3% of it in the H100 sweeps of the three bench moe models at T = 4-256: e.g.
# Qwen3 T = 4 58.1 us against 63.6 with 4 stages, DeepSeek-V3 T = 256 2592), except where FC2's
# weight tiles of the expected routed experts do not fill the SMs (T = 1 on Mixtral-8x7B and
# Qwen3-30B-A3B): there 8 warps of one tile with 4 stages (Mixtral T = 1 100.3 us against 111+;
# fewer CTAs, each needs more loads in flight); the dense heuristic's tiles (mm_tactics.default)
# from 32 rows.
_TILES = {1: (4, 2, 256, 3), 2: (4, 2, 256, 3), 4: (8, 1, 256, 3), 8: (8, 1, 128, 4)}
# "sm90" experts (block_m 8 and 16): 4 warps of two tiles with 4 stages of K = 128, fastest at
# T = 4-16 on all three models in the H200 sweep (scripts/sweep_moe_cuda.py --sm90, us against the
# row-major tile above on the same experts: Qwen3-30B-A3B T = 16 91.5 against 98.0, Mixtral-8x7B
# T = 4 204.3 against 211.1, DeepSeek-V3 T = 4 252.4 against 264.1).
_TILES_SM90 = {1: (4, 2, 128, 4), 2: (4, 2, 128, 4)}
_FEW_TILES = (8, 1, 256, 4)


def rows_per_block(p: MoeProblem) -> int:
    """The rows of one expert a block should hold: every token (an expert has at most T rows) up
    to the mean rows per expert plus 4, so that most routed experts' weights are read once
    without MMA rows that are nearly all padding (H100 sweeps, scripts/sweep_moe_cuda.py, W4A16
    us: Mixtral-8x7B T = 16, 4 rows per expert: 8-row blocks 309, 16-row 335; Qwen3-30B-A3B
    T = 64, 4 rows: 165 against 185; DeepSeek-V3 T = 256, 8 rows: 16-row blocks 2592, 32-row 3331)."""
    mean = p.tokens * p.top_k / max(1, p.experts)
    return max(1, min(p.tokens, int(mean) + 4, sm.MAX_M))


def default(p: MoeProblem) -> SmallMMoeTactic:
    """block_m from rows_per_block (at most 16 for "sm90" experts); the tile for that many rows
    (_TILES, _TILES_SM90); splits for about one CTA per SM over the expected routed experts."""
    rows = rows_per_block(p)
    nb = sm.n_blocks(min(rows, PACKED_MAX_BLOCK_M) if p.packed else rows)
    tile = (_TILES_SM90 if p.packed else _TILES)[nb]
    if nb <= 2 and -(-p.hidden // 128) * expected_experts(p) < problem_sm_count(p):
        tile = _FEW_TILES
    return with_splits(p, SmallMMoeTactic(8 * nb, *tile))


def candidates(p: MoeProblem) -> list[SmallMMoeTactic]:
    """The heuristic, its neighbours in block_m, every compiled tile with 2-4 stages, and half and
    double splits."""
    if problem_reason(p) is not None:
        return []
    base = default(p)
    out = [base]
    for bm in BLOCK_MS:
        if bm < base.block_m // 2 or bm > 2 * base.block_m:
            continue
        for warps, tiles, bk in sm.TILE_SHAPES:
            if not sm.tile_compiled(bm // 8, warps, tiles, bk):
                continue
            for stages in (3, 4):
                t = with_splits(p, SmallMMoeTactic(bm, warps, tiles, bk, stages))
                out.append(t)
                out.append(SmallMMoeTactic(bm, warps, tiles, bk, stages, max(1, t.fc1_split // 2),
                                           max(1, t.fc2_split // 2)))
                out.append(SmallMMoeTactic(bm, warps, tiles, bk, stages, min(8, 2 * t.fc1_split),
                                           min(8, 2 * t.fc2_split)))
    return [t for t in dict.fromkeys(out) if why_not(t, p) is None]
