"""The cuda backend's mm_fp4 tactic space: the small-M GEMM (mm_tactics, M <= 64) and the Hopper
wgmma GEMM (mm_wgmma_tactics, any M on sm_90) as one space. Cheap to import.

Heuristic, from `bench mm` on H100: the small-M kernel up to M = SMALL_M_MAX (its cp.async +
mma.sync decode reads the weights at 0.8 of copy bandwidth there; row-major and "sm90" weights),
the wgmma kernel above.
"""
from __future__ import annotations

from typing import Optional

from ...tactics import Tactic, TacticSpace
from .._common import mm_problem
from . import mm_tactics as small
from . import mm_wgmma_tactics as wg

SMALL_M_MAX = 16


def small_m_reason(args) -> Optional[str]:
    """Why the small-M kernel cannot run these arguments at all, or None (its default tactic
    checks the problem-level limits)."""
    if mm_problem(args)[0] > small.MAX_M:
        return f"the small-M kernel is for M <= {small.MAX_M}"
    return small.why_not(small.default(*args), *args) or small.operand_reason(args)


def _family(t: Tactic):
    return wg if isinstance(t, wg.WgmmaMmTactic) else small


def default(*args) -> Tactic:
    m = mm_problem(args)[0]
    if (m <= SMALL_M_MAX or wg.problem_reason(args) is not None) and small_m_reason(args) is None:
        return small.default(*args)
    return wg.default(*args)


def candidates(*args) -> list[Tactic]:
    first = default(*args)
    rest = (small.candidates(*args) if small_m_reason(args) is None else []) + wg.candidates(*args)
    return [first] + [t for t in rest if t != first]


def why_not(t: Tactic, *args) -> Optional[str]:
    return _family(t).why_not(t, *args)


def key(*args) -> str:
    return small.key(*args) if small_m_reason(args) is None else wg.key(*args)


MM_SPACE = TacticSpace(candidates=candidates, default=default, key=key, why_not=why_not)
