"""The cuda backend's mm_fp4 tactic space: the small-M GEMM (mm_tactics, M <= 64) and the Hopper
wgmma GEMM (mm_wgmma_tactics, any M on sm_90) as one space. Cheap to import.

Heuristic, from `bench mm` on H100: the small-M kernel up to M = SMALL_M_MAX (its cp.async +
mma.sync decode reads the weights at 0.8 of copy bandwidth there; row-major and "sm90" weights)
and up to M = 32 for small "sm90" weights (_small_m_first, H200), the wgmma kernel above; at
M = 9-16 on "sm90" weights the wgmma kernel where its split-K ranges are long (_hopper_first, H200).
"""
from __future__ import annotations

from typing import Optional

from ...tactics import Tactic, TacticSpace
from ...problems import MmProblem
from . import mm_tactics as small
from . import mm_wgmma_tactics as wg

SMALL_M_MAX = 16
SMALL_WEIGHT = 4096 * 4096   # "sm90" weights of at most this many elements: the small-M kernel up to PACKED_MAX_M
HOPPER_FIRST_K = 8192        # K per split of the Hopper GEMM from which it runs M = 9-16 on "sm90" weights


def small_m_reason(p: MmProblem) -> Optional[str]:
    """Why the small-M kernel cannot run this problem at all, or None: its problem limits, and
    its heuristic's tactic must fit this device (shared memory)."""
    if p.m > small.MAX_M:
        return f"the small-M kernel is for M <= {small.MAX_M}"
    return small.problem_reason(p) or small.why_not(small.default(p), p)


def _hopper_first(p: MmProblem) -> bool:
    """M = 9-16 on "sm90" weights where the Hopper GEMM's heuristic is a split-K launch of at least
    HOPPER_FIRST_K per split: there the small-M kernel's second 8-row MMA tile costs more than the
    Hopper GEMM's fixed costs. H200, small-M / Hopper GEMM us (quack; scripts/ab_small_m_vs_wgmma.py,
    docs/benchmarks/mm_small_m_vs_wgmma_h200.txt): 8192 x 28672 (split 2, 14336 per split) M = 12
    60.4 / 57.1 (62.0), M = 16 61.1 / 56.5 (61.5), but M = 8 49.9 / 57.5; 8192 x 8192 (4096 per
    split) M = 16 20.9 / 21.3; persistent launches (28672 x 8192, 4096 x 14336) lose by 10-21%."""
    if not (p.packed and 8 < p.m <= SMALL_M_MAX) or wg.problem_reason(p) is not None:
        return False
    t = wg.default(p)
    return t.split_k > 1 and p.k // t.split_k >= HOPPER_FIRST_K


def _small_m_first(p: MmProblem) -> bool:
    """M <= SMALL_M_MAX (unless _hopper_first); M <= PACKED_MAX_M for small "sm90" weights, whose
    few tiles leave the Hopper GEMM's fixed costs (pipeline fill, epilogue) the larger part of its time. H200, M = 17
    / 32, the small-M kernel's best tactic against the Hopper GEMM's heuristic (torch bf16):
    4096 x 4096 10.7 / 11.3 against 15.5 / 16.2 us (10.3 / 10.1), 2048 x 4096 8.5 / 8.9 against
    9.9 / 10.3 us; above SMALL_WEIGHT the Hopper GEMM is as fast or faster (6144 x 4096 equal,
    4096 x 14336 25.5 against 27.3 us, 8192 x 8192 21.8 against 26.3 us;
    docs/benchmarks/mm_small_m_sm90_m32_h200.csv)."""
    if p.m <= SMALL_M_MAX:
        return not _hopper_first(p)
    return p.packed and p.m <= small.PACKED_MAX_M and p.n * p.k <= SMALL_WEIGHT


def default(p: MmProblem) -> Tactic:
    if (_small_m_first(p) or wg.problem_reason(p) is not None) and small_m_reason(p) is None:
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
