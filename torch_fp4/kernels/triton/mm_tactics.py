"""Tactics of the Triton FP4 GEMM (cheap to import: no triton).

One kernel (torch_fp4/kernels/triton/mm.py) serves every architecture; a tactic is its launch
configuration. Small M swaps the operands (the MMA's M dimension runs over the weight rows N and
the activations are the narrow N side), so a decode-sized batch still fills the tensor cores, and
splits K so that enough programs stream the weight at once; the split partial sums are added in
a fixed order by a second kernel (deterministic, no atomics).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ... import formats as F
from ...backends import Backend
from ...tactics import Tactic, TacticSpace, register_family, valid_unique
from ...problems import MmProblem
from .._common import mm_key, problem_sm_count
from . import mm_dot_scaled_tactics as dot_scaled
from .mm_dot_scaled_tactics import DotScaledMmTactic


@register_family
@dataclass(frozen=True)
class TritonMmTactic(Tactic):
    block_m: int        # rows of A per program (the MMA's N side when swap_ab)
    block_n: int        # weight rows per program
    block_k: int        # K elements per step (a multiple of the FP4 block)
    split_k: int = 1    # programs along K; > 1 adds a fixed-order reduction launch
    swap_ab: bool = False
    num_warps: int = 4
    num_stages: int = 3
    group_m: int = 8    # programs along M sharing weight tiles in L2 (grouped order)

    backend = Backend.TRITON
    family = "triton_mm"


@register_family
@dataclass(frozen=True)
class DequantMmTactic(Tactic):
    """Large M: dequantize the FP4 operands to bf16/fp16 (exact) with the Triton dequantize kernel,
    multiply with torch.mm into fp32 (cuBLAS, fp32 accumulation), then alpha and the output
    rounding. Needs a temporary of N x K 16-bit values (and M x K for W4A4)."""
    backend = Backend.TRITON
    family = "triton_dequant_mm"


def _dot_dtype_bytes(p: MmProblem) -> int:
    return 4 if dot_dtype(p) == torch.float32 else 2


def dot_dtype(p: MmProblem) -> torch.dtype:
    """The operand type fed to the MMA: every decoded FP4 value is exact in it. bf16 covers both
    formats' ranges; fp16 activations with MXFP4 weights (whose values can exceed fp16's range)
    multiply in tf32, exact for fp16 inputs and FP4 values."""
    if p.w4a4:
        return torch.bfloat16
    if p.a_dtype == torch.float16:
        return torch.float16 if p.fmt is F.NVFP4 else torch.float32
    return torch.bfloat16


def why_not(t: Tactic, p: MmProblem) -> Optional[str]:
    """Why tactic `t` cannot run problem `p` (the tl.dot_scaled family's problem limits first)."""
    k, fmt = p.k, p.fmt
    if isinstance(t, DotScaledMmTactic):
        return dot_scaled.problem_reason(p) or dot_scaled.why_not(t, p)
    if isinstance(t, DequantMmTactic):
        if dot_dtype(p) == torch.float32:
            return "fp16 activations with MXFP4 weights have no exact 16-bit dequantized form"
        return None
    if not isinstance(t, TritonMmTactic):
        return f"{t.family} is not a Triton tactic"
    if t.block_k % fmt.block_size:
        return f"block_k={t.block_k} is not a multiple of the {fmt.name.upper()} block ({fmt.block_size})"
    for name in ("block_m", "block_n", "block_k"):
        v = getattr(t, name)
        if v < 16 or v & (v - 1):
            return f"{name}={v} must be a power of two >= 16"
    per_split = _k_per_split(k, t)
    if (t.split_k - 1) * per_split >= k:
        return f"split_k={t.split_k} leaves an empty K slice for K={k} with block_k={t.block_k}"
    # Pipelined raw tiles (packed FP4 or 16-bit activations, scale bytes) plus one decoded
    # operand tile staged for the MMA.
    a_bytes = t.block_m * t.block_k // 2 if p.w4a4 else t.block_m * t.block_k * p.a_itemsize
    w_bytes = t.block_n * t.block_k // 2 + t.block_n * t.block_k // 16
    smem = t.num_stages * (a_bytes + w_bytes) + (t.block_m + t.block_n) * t.block_k * _dot_dtype_bytes(p)
    if smem > 200 * 1024:
        return f"needs about {smem // 1024} KiB of shared memory (more than the 227 KiB of sm_90)"
    return None


def _k_per_split(k: int, t: TritonMmTactic) -> int:
    steps = -(-k // t.block_k)
    return -(-steps // t.split_k) * t.block_k


def k_per_split(p: MmProblem, t: TritonMmTactic) -> int:
    return _k_per_split(p.k, t)


def _split_for(m: int, n: int, k: int, bm: int, bn: int, bk: int, sms: int, waves: int = 2) -> int:
    """Enough K slices that about `waves` waves of programs stream the weight, each slice at
    least four steps long."""
    tiles = -(-m // bm) * -(-n // bn)
    split = 1
    while tiles * split < waves * sms and k // (2 * split) >= 4 * bk and split < 16:
        split *= 2
    return split


def default(p: MmProblem) -> Tactic:
    """The heuristic tactic, from `bench mm --tactics` sweeps on H100 (N=8192, K=28672): M <= 32
    swaps operands, with 256 weight rows x 128 K per program and K split so that at most two
    waves of programs run (8 ways there); M around 128 splits K with 128x128 tiles; from
    M = 512 on, dequantize-then-cuBLAS is fastest (0.90x bf16 at M = 2048, against 0.48x for the
    best fused tile)."""
    m, n, k = p.m, p.n, p.k
    sms = problem_sm_count(p)
    if dot_dtype(p) == torch.float32:
        bm = 16 if m <= 16 else 64
        return TritonMmTactic(bm, 64, 64, _split_for(m, n, k, bm, 64, 64, sms), swap_ab=m <= 64)
    if m >= 512:
        return DequantMmTactic()
    if m <= 32:
        bm = max(16, 1 << (m - 1).bit_length())
        tiles, split = -(-n // 256), 1
        while tiles * split * 2 <= 2 * sms and k // (2 * split) >= 4 * 128:
            split *= 2
        return TritonMmTactic(bm, 256, 128, split, swap_ab=True)
    if m <= 64:
        return TritonMmTactic(64, 128, 128, _split_for(m, n, k, 64, 128, 128, sms), swap_ab=True)
    return TritonMmTactic(128, 128, 64, _split_for(m, n, k, 128, 128, 64, sms))


def candidates(p: MmProblem) -> list[TritonMmTactic]:
    m, n, k = p.m, p.n, p.k
    sms = problem_sm_count(p)
    out: list[TritonMmTactic] = [default(p)]
    if m <= 64:
        bm = max(16, 1 << (m - 1).bit_length())
        for bn, bk, warps in ((64, 256, 4), (128, 128, 4), (256, 128, 4), (256, 128, 8),
                              (128, 64, 4), (256, 64, 4), (256, 64, 8), (512, 64, 8)):
            base = _split_for(m, n, k, bm, bn, bk, sms)
            for split in sorted({base, 2 * base, max(1, base // 2)}):
                out.append(TritonMmTactic(bm, bn, bk, split, swap_ab=True, num_warps=warps))
            for stages in (2, 4):
                out.append(TritonMmTactic(bm, bn, bk, base, swap_ab=True, num_warps=warps,
                                          num_stages=stages))
    else:
        for bm, bn, bk, warps in ((64, 128, 128, 4), (128, 128, 64, 4), (128, 128, 128, 8),
                                  (128, 256, 64, 8), (256, 128, 64, 8), (64, 256, 128, 4)):
            for stages in (3, 4):
                for split in sorted({1, _split_for(m, n, k, bm, bn, bk, sms)}):
                    out.append(TritonMmTactic(bm, bn, bk, split, num_warps=warps, num_stages=stages))
    if m >= 128 and dot_dtype(p) != torch.float32:
        out.append(DequantMmTactic())
    out.extend(dot_scaled.candidates(p))   # none off sm_100/sm_103/sm_12x, none for W4A16
    return valid_unique(out, why_not, p)


def key(p: MmProblem) -> str:
    return mm_key(p, 1 << max(0, (p.m - 1).bit_length()))


MM_SPACE = TacticSpace(candidates=candidates, default=default, key=key, why_not=why_not)
