"""Tactics of the cuda backend's fused_moe (kernels/cuda/moe.py), two families: below
SMALL_M_BELOW routed rows per expert (decode) the grouped small-M GEMM (moe_small_m_tactics.py);
from there both grouped GEMMs run the Hopper FP4-weight GEMM of csrc/mm_wgmma.cu over the routed
rows grouped by expert (this module). Cheap to import: no toolchain, no extension build.

A wgmma tactic picks block_m (rows of one expert per block: the grouping's padding unit and the GEMM's
activation tile, the wgmma N), the shared-memory stages (both GEMMs; mm_wgmma_tactics.stage_k), and
ctas_per_sm (2 at block_m 64: two CTAs share an SM; a candidate, not the default). Launches are
persistent (one or two CTAs per SM over every tile of the upper bound of used blocks; tiles of
unused blocks end a CTA's list early), with no split-K or stream-K: the number of used tiles is
only known on the device.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ...backends import Backend
from ...problems import MoeProblem
from ...tactics import Tactic, TacticSpace, register_family, valid_unique
from .._common import smem_reason
from ..triton.moe_align import max_blocks
from . import mm_wgmma_tactics as wg
from . import moe_small_m_tactics as small
from .moe_small_m_tactics import SmallMMoeTactic

# Routed rows per expert below which the small-M GEMMs run (each routed expert's weights streamed
# once per tile; the wgmma GEMM's 64-row tiles would be mostly padding).
SMALL_M_BELOW = 16

BLOCK_MS = (64, 128, 256)
# Routed rows per expert from which 256- and 128-row blocks win (more activation rows per weight
# decode; fewer padding rows below). H100, W4A16, scripts/sweep_moe_cuda.py (us, block_m/stages/
# CTAs per SM): Mixtral-8x7B T = 1024 (256 rows per expert) 256/5/1 1560, 128/9/1 1865; Qwen3-30B-A3B
# T = 4096 (256) 256/5/1 1116, 128/9/1 1131; DeepSeek-V3 T = 4096 (128) 128/9/1 9730, 256/5/1
# 9762, 64/7/2 11980; Mixtral T = 256 (64) 128/9/1 779, 64/7/2 901; Qwen3 T = 1024 (64) 64/7/2
# 446, 128/9/1 474; below 64 rows 64/7/2 wins every sweep (e.g. DeepSeek-V3 T = 1024, 32 rows:
# 4560 against 6279 at 128/9/1).
BLOCK_M_FROM = {256: 192, 128: 64}


@register_family
@dataclass(frozen=True)
class WgmmaMoeTactic(Tactic):
    block_m: int = 128        # rows of one expert per block (grouping and GEMM tile)
    stages: int = 4           # shared-memory stages of wg.stage_k(...) K elements
    ctas_per_sm: int = 1      # 2: two CTAs per SM (block_m 64)

    backend = Backend.CUDA
    family = "cuda_moe_wgmma"


def _gemms(p: MoeProblem):
    """(name, N, K) of FC1 and FC2."""
    return (("FC1", 2 * p.inter, p.hidden), ("FC2", p.hidden, p.inter))


def problem_reason(p: MoeProblem) -> Optional[str]:
    """Why the grouped Hopper GEMMs cannot run this fused_moe problem at all, or None."""
    if p.is_cuda and p.capability != (9, 0):
        return "the Hopper fused_moe (wgmma, sm_90a) needs compute capability 9.0"
    for name, n, k in _gemms(p):
        if k % 32:
            return f"{name}: the Hopper GEMM needs K % 32 == 0 (16-byte weight rows for TMA), got K={k}"
        if n * p.experts >= 2**31:
            return f"{name}: E * N = {p.experts} * {n} weight rows exceed 32-bit TMA coordinates"
    if p.weight_align < 16:
        return "w1, w1_scale, w2 and w2_scale must be 16-byte aligned (TMA and bulk copies)"
    rows = max_blocks(p.tokens * p.top_k, p.experts, BLOCK_MS[-1]) * BLOCK_MS[-1]
    if max(rows, p.hidden, 2 * p.inter) >= 2**31:
        return f"sizes beyond 2^31 (up to {rows} grouped rows)"
    return None


def why_not(t: Tactic, p: MoeProblem) -> Optional[str]:
    if isinstance(t, SmallMMoeTactic):
        return small.why_not(t, p)
    if not isinstance(t, WgmmaMoeTactic):
        return f"{t.family} is not a cuda fused_moe tactic"
    reason = (small.gpt_oss_reason(p, "the grouped Hopper GEMMs", w4a4=True) or problem_reason(p)
              or wg.tile_reason(t.block_m, t.stages, t.ctas_per_sm, BLOCK_MS))
    if reason is not None:
        return reason
    smem = wg.smem_bytes(t.block_m, t.stages, True, ctas_per_sm=t.ctas_per_sm, packed=p.packed)
    return smem_reason(smem, wg.smem_limit(p, t.ctas_per_sm))


def _tactic(p: MoeProblem, block_m: int, ctas: int) -> WgmmaMoeTactic:
    return WgmmaMoeTactic(block_m, wg.max_stages(block_m, wg.smem_limit(p, ctas), True, ctas_per_sm=ctas,
                                                 packed=p.packed), ctas)


def default(p: MoeProblem) -> Tactic:
    """Below SMALL_M_BELOW routed rows per expert the small-M family's heuristic (where it can run),
    else the wgmma family's."""
    if p.tokens * p.top_k < SMALL_M_BELOW * p.experts:
        t = small.default(p)
        if small.why_not(t, p) is None or problem_reason(p) is not None:
            return t
    return wgmma_default(p)


def wgmma_default(p: MoeProblem) -> WgmmaMoeTactic:
    """256- or 128-row blocks once the routed rows per expert reach BLOCK_M_FROM (fewer padding
    rows below: 64-row blocks), one CTA per SM, as many stages as fit. At block_m 64 one CTA's
    stages hold two sub-tiles and convert the block scales once per CTA, which two CTAs per SM
    (64-K stages) do not: H200, one CTA against two per SM on the grouped GEMMs of Mixtral-8x7B,
    Qwen3-30B-A3B and DeepSeek-V3 (FC1 and FC2, 16-48 rows per expert, row-major and "sm90"
    experts, same bits) 1.7-15% less time at each of 36 points (BENCHMARKS.md)."""
    per_expert = p.tokens * p.top_k / max(1, p.experts)
    for bm in (256, 128):
        if per_expert >= BLOCK_M_FROM[bm]:
            return _tactic(p, bm, 1)
    return _tactic(p, 64, 1)


def candidates(p: MoeProblem) -> list[Tactic]:
    out: list[Tactic] = [default(p)]
    if p.tokens * p.top_k < SMALL_M_BELOW * p.experts:
        out += small.candidates(p)
    if problem_reason(p) is None:
        out += [wgmma_default(p), _tactic(p, 256, 1), _tactic(p, 128, 1), _tactic(p, 64, 1), _tactic(p, 64, 2)]
        out += [WgmmaMoeTactic(bm, 4, c) for bm, c in ((256, 1), (128, 1), (64, 1), (64, 2))]
    return valid_unique(out, why_not, p)


def key(p: MoeProblem) -> str:
    pairs = p.tokens * p.top_k
    bucket = 1 << max(0, (pairs - 1).bit_length())
    a_kind = "w4a4" if p.w4a4 else str(p.x_dtype).removeprefix("torch.")
    extra = f",{p.gpt_oss_features}" if p.gpt_oss_features is not None else ""   # MXFP4, biases, clamp
    w_kind = ",w:sm90" if p.packed else ""
    return f"pairs<={bucket},E={p.experts},H={p.hidden},I={p.inter},{a_kind}{extra}{w_kind}"


MOE_SPACE = TacticSpace(candidates=candidates, default=default, key=key, why_not=why_not)
