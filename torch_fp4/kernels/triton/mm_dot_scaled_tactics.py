"""Tactics of the Triton `tl.dot_scaled` FP4 GEMM (mm_dot_scaled.py): data only, no triton import.

Status: the kernel is compiled and PTX/SASS-checked for sm_100/sm_103 (tcgen05 block-scaled
MMA) and sm_120 (warp-level block-scaled mma.sync), never run (compiled, not run): no Blackwell
GPU was available. The Triton backend's tactic space (kernels/triton/mm_tactics.py) offers
these tactics to the autotuner and `use_tactic` on those architectures; its heuristic default
stays the decode kernel until they are measured.

A tactic is the kernel's launch configuration. The MMA's M side (128 or 256 rows, tcgen05 M=128
per instruction) holds the activations, or with `swap_ab` the weight rows, so that a
decode-sized batch becomes the MMA's narrow N side (16..128 columns).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ... import formats as F
from ...backends import Backend
from ...problems import MmProblem
from ...tactics import Tactic, register_family

# Where Triton (3.6 and 3.9 checked) lowers tl.dot_scaled of two e2m1 operands to block-scaled
# MMA: tcgen05.mma on 10.0 / 10.3, mma.sync ... block_scale (SASS OMMA.SF) on 12.x. Shared
# memory budget per CTA for the pipelined tiles (sm_12x has about 99 KiB, sm_100 227 KiB).
SMEM_LIMIT = {10: 200 * 1024, 12: 96 * 1024}


def offered(cap: tuple[int, int]) -> bool:
    return cap in ((10, 0), (10, 3)) or cap[0] == 12


@register_family
@dataclass(frozen=True)
class DotScaledMmTactic(Tactic):
    block_m: int        # activation rows per program (the MMA's N side when swap_ab)
    block_n: int        # weight rows per program
    block_k: int        # K elements per step (a multiple of 4 FP4 blocks: one 128x4 scale chunk)
    swap_ab: bool = False
    num_warps: int = 4
    num_stages: int = 3
    group_m: int = 8    # programs along M sharing weight tiles in L2 (grouped order)

    backend = Backend.TRITON
    family = "triton_mm_dot_scaled"

    @property
    def mma_m(self) -> int:
        """Rows of the MMA's M side: weight rows when swap_ab, else activation rows."""
        return self.block_n if self.swap_ab else self.block_m

    @property
    def mma_n(self) -> int:
        return self.block_m if self.swap_ab else self.block_n

    def invalid(self, fmt: F.Fp4Format) -> Optional[str]:
        """Why this is not a kernel configuration for `fmt` at all (None when it is)."""
        if self.mma_m not in (128, 256):
            side = "block_n (swap_ab)" if self.swap_ab else "block_m"
            return f"{side}={self.mma_m}: the MMA's M side must be 128 or 256 rows (tcgen05 M=128)"
        if self.mma_n not in (16, 32, 64, 128, 256):
            side = "block_m (swap_ab)" if self.swap_ab else "block_n"
            return f"{side}={self.mma_n}: the MMA's N side must be 16, 32, 64, 128 or 256"
        if not self.swap_ab and self.block_n % 128:
            return f"block_n={self.block_n}: weight scales are read in 128-row chunks"
        chunk = 4 * fmt.block_size
        if self.block_k % chunk or self.block_k & (self.block_k - 1) or self.block_k > 512:
            return (f"block_k={self.block_k} must be a power of two <= 512 and a multiple of "
                    f"{chunk} (4 {fmt.name.upper()} blocks: one 128x4 scale chunk)")
        if self.num_warps not in (4, 8):
            return f"num_warps={self.num_warps} must be 4 or 8"
        return None


def smem_bytes(t: DotScaledMmTactic, fmt: F.Fp4Format) -> int:
    """Pipelined operand tiles (packed FP4) and their scale bytes."""
    scales = (t.block_m + t.block_n) * t.block_k // fmt.block_size
    return t.num_stages * ((t.block_m + t.block_n) * t.block_k // 2 + scales)


def problem_reason(p: MmProblem) -> Optional[str]:
    """Why the kernel cannot run this problem with any tactic, or None (the Triton tactic space
    checks it before a tactic's own limits, why_not)."""
    cap = p.capability
    if not offered(cap):
        return (f"tl.dot_scaled lowers to block-scaled MMA on compute capability 10.0 / 10.3 "
                f"(tcgen05) and 12.x (mma.sync) only; device has {cap[0]}.{cap[1]}")
    if not p.w4a4:
        return "W4A4 only: a must be FP4 with block scales (a_scale is None)"
    if p.m == 0 or p.n == 0 or p.k == 0:
        return f"empty problem M={p.m} N={p.n} K={p.k}"
    return None


def why_not(t: DotScaledMmTactic, p: MmProblem) -> Optional[str]:
    """Why tactic `t` cannot run problem `p` that the kernel runs (problem_reason None)."""
    bad = t.invalid(p.fmt)
    if bad is not None:
        return bad
    major = p.capability[0]
    smem = smem_bytes(t, p.fmt)
    if smem > SMEM_LIMIT[major]:
        return (f"needs about {smem // 1024} KiB of shared memory for {t.num_stages} stages "
                f"(sm_{major}x budget {SMEM_LIMIT[major] // 1024} KiB)")
    return None


def candidates(p: MmProblem) -> list[DotScaledMmTactic]:
    """Tactics worth timing for this problem (every one passes why_not)."""
    if problem_reason(p) is not None:
        return []
    bk = 256
    out = []
    if p.m <= 64:
        bm = max(16, 1 << max(0, (p.m - 1).bit_length()))
        for bn in (128, 256):
            for stages in (2, 3, 4):
                out.append(DotScaledMmTactic(bm, bn, bk, swap_ab=True, num_stages=stages))
    for bm, bn, warps in ((128, 128, 4), (128, 128, 8), (128, 256, 8), (256, 128, 8)):
        for stages in (2, 3, 4):
            out.append(DotScaledMmTactic(bm, bn, bk, num_warps=warps, num_stages=stages))
    return [t for t in out if why_not(t, p) is None]


def default(p: MmProblem) -> DotScaledMmTactic:
    """Heuristic (never timed on a GPU): swap operands for decode-sized M, else 128x128 tiles;
    3 stages on sm_10x, 2 (and 8 warps, so the register accumulators do not spill) on sm_12x."""
    small_smem = p.capability[0] == 12
    stages = 2 if small_smem else 3
    if p.m <= 64:
        bm = max(16, 1 << max(0, (p.m - 1).bit_length()))
        return DotScaledMmTactic(bm, 128, 256, swap_ab=True, num_stages=stages)
    return DotScaledMmTactic(128, 128, 256, num_warps=8 if small_smem else 4, num_stages=stages)
