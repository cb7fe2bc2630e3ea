"""The cuda backend's mm_fp4 tactic space: the small-M GEMM (mm_tactics, M <= 64) and the Hopper
wgmma GEMM (mm_wgmma_tactics, any M on sm_90) as one space. Cheap to import.

Heuristic, from `bench mm` on H100: the small-M kernel up to M = SMALL_M_MAX (its cp.async +
mma.sync decode reads the weights at 0.8 of copy bandwidth there; row-major and "sm90" weights),
the wgmma kernel above.
"""
from __future__ import annotations

from typing import Optional

from ...tactics import Tactic, TacticSpace
from ...problems import MmProblem
from . import mm_tactics as small
from . import mm_wgmma_tactics as wg

SMALL_M_MAX = 16


def small_m_reason(p: MmProblem) -> Optional[str]:
    """Why the small-M kernel cannot run this problem at all, or None: its problem limits, and
    its heuristic's tactic must fit this device (shared memory)."""
    if p.m > small.MAX_M:
        return f"the small-M kernel is for M <= {small.MAX_M}"
    return small.problem_reason(p) or small.why_not(small.default(p), p)


def default(p: MmProblem) -> Tactic:
    if (p.m <= SMALL_M_MAX or wg.problem_reason(p) is not None) and small_m_reason(p) is None:
        return small.default(p)
    return wg.default(p)


def candidates(p: MmProblem) -> list[Tactic]:
    first = default(p)
    rest = (small.candidates(p) if small_m_reason(p) is None else []) + wg.candidates(p)
    return [first] + [t for t in rest if t != first]


def why_not(t: Tactic, p: MmProblem) -> Optional[str]:
    """The limits of the tactic's family on this problem, then the tactic's own (the Hopper
    family's why_not checks both)."""
    if isinstance(t, wg.WgmmaMmTactic):
        return wg.why_not(t, p)
    return small.space_why_not(t, p)


def key(p: MmProblem) -> str:
    return small.key(p) if small_m_reason(p) is None else wg.key(p)


MM_SPACE = TacticSpace(candidates=candidates, default=default, key=key, why_not=why_not)
