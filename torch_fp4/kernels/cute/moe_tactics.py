"""Tactics of the CuTe DSL grouped MoE GEMM (moe_blockscaled.py): data only, no cutlass import.

`Sm100MoeTactic` (family "cute_moe_tcgen05"): one CTA per (128-row block of one expert, N tile),
MMA tile 128 x tile_n x tile_k on `tcgen05.mma.cta_group::1.kind::mxf4nvf4.block_scale.block16`,
cluster cluster_m x 1 (cluster_m = 2 multicasts the expert's B tile to both CTAs of a cluster,
so both 128-row blocks must belong to the same expert: rows grouped in blocks of 256).
FC1 (SwiGLU) needs tile_n = 256: the MMA tile holds 128 gate columns and the matching 128 up
columns, and each CTA writes 128 columns of the intermediate.

Dispatch by compute capability: 10.0 -> SM100_MOE_TACTICS (128x128x256, 128x256x256);
10.3 -> SM103_MOE_TACTICS (the K-deep 128x128x768, 128x256x768) + SM100_MOE_TACTICS; clusters
1x1 and 2x1 each. Compiled and SASS-checked in CI, never run (compiled, not run): no Blackwell
GPU was available.

`CuteMoeTactic` (family "cute_moe") is fused_moe's tactic on the opt-in cute-dsl backend
(kernels/cute/moe_fused.py): the tiles of its two grouped GEMMs and the cluster both use, checked
against the fused_moe problem; `MOE_OP_SPACE` puts it in the tactic system (listable with
torch_fp4.fused_moe_tactics, forcible with use_tactic, autotunable, cached). `MOE_SPACE` checks
one grouped GEMM's call (moe_blockscaled.grouped_gemm).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

import torch

from ...backends import Backend
from ...problems import MoeProblem
from ...tactics import Tactic, TacticSpace, register_family, valid_unique

TILE_M = 128       # rows per CTA: one block of the expert grouping


@register_family
@dataclass(frozen=True)
class Sm100MoeTactic(Tactic):
    """Grouped tcgen05 block-scaled GEMM: MMA tile (128 x tile_n x tile_k), cluster_m x 1."""
    backend: ClassVar[Backend] = Backend.CUTE_DSL
    family: ClassVar[str] = "cute_moe_tcgen05"
    tile_n: int = 128
    tile_k: int = 256
    cluster_m: int = 1

    def invalid(self) -> Optional[str]:
        if self.tile_n not in (128, 256):
            return f"tile_n must be 128 or 256, got {self.tile_n}"
        if self.tile_k not in (256, 768):
            return f"tile_k must be 256 or 768, got {self.tile_k}"
        if self.cluster_m not in (1, 2):
            return f"cluster_m must be 1 or 2, got {self.cluster_m}"
        return None


T = Sm100MoeTactic
SM100_MOE_TACTICS = tuple(T(n, 256, cm) for n in (128, 256) for cm in (1, 2))
SM103_MOE_TACTICS = tuple(T(n, 768, cm) for n in (128, 256) for cm in (1, 2))


def tactics_for_capability(cap: tuple[int, int]) -> tuple[Tactic, ...]:
    if cap == (10, 0):
        return SM100_MOE_TACTICS
    if cap == (10, 3):
        return SM103_MOE_TACTICS + SM100_MOE_TACTICS
    return ()


def _capability(t: torch.Tensor) -> tuple[int, int]:
    if t.device.type != "cuda":
        return (0, 0)
    return tuple(torch.cuda.get_device_capability(t.device))


def why_not(tactic: Tactic, a, a_scale, w, w_scale, alpha, block_expert, swiglu: bool,
            block_m: int = 128, cap: Optional[tuple[int, int]] = None) -> Optional[str]:
    """None when `tactic` can run the grouped GEMM with moe_blockscaled.grouped_gemm's
    arguments, else why not."""
    cap = _capability(a) if cap is None else cap
    if tactic not in tactics_for_capability(cap):
        return (f"{tactic.label()} is not a grouped MoE tactic of compute capability "
                f"{cap[0]}.{cap[1]} (10.0: SM100 tiles; 10.3: SM103 + SM100 tiles)")
    bad = tactic.invalid()
    if bad is not None:
        return bad
    rows, half_k = a.shape
    experts, n_w, _ = w.shape
    k = 2 * half_k
    if k % 32:
        return f"K = {k} must be a multiple of 32 (TMA needs 16-byte rows of packed FP4)"
    if block_m % (TILE_M * tactic.cluster_m):
        return (f"cluster_m={tactic.cluster_m} multicasts the expert's B tile to "
                f"{tactic.cluster_m} CTAs, so rows must be grouped by expert in blocks of "
                f"{TILE_M * tactic.cluster_m} (moe_align block_m), got block_m={block_m}")
    if rows % block_m or block_expert.numel() * block_m != rows:
        return (f"a has {rows} rows: expected block_expert.numel() * block_m = "
                f"{block_expert.numel()} * {block_m}")
    if swiglu:
        if tactic.tile_n != 256:
            return ("FC1 (SwiGLU) needs tile_n=256: 128 gate and 128 up columns per MMA tile "
                    "(64-row halves would split w1's 128-row scale-factor atoms)")
        if n_w % 256:
            return (f"FC1 needs I = w1.shape[1] / 2 = {n_w // 2} to be a multiple of 128 (gate "
                    "and up tiles start on 128-row scale-factor atoms)")
    if n_w * k >= 2**31 or rows >= 2**31:
        return "problem too large for 32-bit strides"
    return None


def default_for(cap: tuple[int, int], swiglu: bool, n_out: int) -> Tactic:
    """FC1: 128x256x256 (the only FC1 tile shape besides the SM103 K-deep one); FC2: 128x256
    when N >= 2048, else 128x128. No clusters (the 2x1 clusters are for the autotuner)."""
    if swiglu or n_out >= 2048:
        return T(256, 256, 1)
    return T(128, 256, 1)


def _candidates(a, a_scale, w, w_scale, alpha, block_expert, swiglu, block_m=128) -> list:
    cap = _capability(a)
    return [t for t in tactics_for_capability(cap)
            if why_not(t, a, a_scale, w, w_scale, alpha, block_expert, swiglu, block_m, cap=cap) is None]


def _default(a, a_scale, w, w_scale, alpha, block_expert, swiglu, block_m=128) -> Tactic:
    n_out = w.shape[1] // 2 if swiglu else w.shape[1]
    return default_for(_capability(a), swiglu, n_out)


def _key(a, a_scale, w, w_scale, alpha, block_expert, swiglu, block_m=128) -> str:
    rows = a.shape[0]
    bucket = 1 << max(0, (rows - 1).bit_length())
    mx = any(s is not None and s.dtype == torch.float8_e8m0fnu for s in (a_scale, w_scale))
    return (f"rows<={bucket},E={w.shape[0]},N={w.shape[1]},K={2 * a.shape[1]},"
            f"{'fc1_swiglu' if swiglu else 'fc2'},block_m={block_m}{',mxfp4' if mx else ''}")


MOE_SPACE = TacticSpace(candidates=_candidates, default=_default, key=_key, why_not=why_not)


@register_family
@dataclass(frozen=True)
class CuteMoeTactic(Tactic):
    """fused_moe on cute-dsl: FC1 (SwiGLU; tile_n 256, 128 gate and 128 up columns) with K tile
    fc1_tile_k, FC2 with tile fc2_tile_n x fc2_tile_k, both in clusters of cluster_m x 1 (rows
    grouped by expert in blocks of 128 * cluster_m)."""
    backend: ClassVar[Backend] = Backend.CUTE_DSL
    family: ClassVar[str] = "cute_moe"
    fc1_tile_k: int = 256
    fc2_tile_n: int = 128
    fc2_tile_k: int = 256
    cluster_m: int = 1

    @property
    def block_m(self) -> int:
        return TILE_M * self.cluster_m

    def fc1(self) -> Sm100MoeTactic:
        return T(256, self.fc1_tile_k, self.cluster_m)

    def fc2(self) -> Sm100MoeTactic:
        return T(self.fc2_tile_n, self.fc2_tile_k, self.cluster_m)


def op_why_not(t: Tactic, p: MoeProblem) -> Optional[str]:
    """None when both grouped GEMMs of fused_moe problem p can run with t (MOE_SPACE's checks on
    the operands' shapes, as meta tensors), else why not."""
    from .._common import MAX_GRID_Z
    from ..triton.moe_align import max_blocks
    if not isinstance(t, CuteMoeTactic):
        return f"{t.family} is not a cute-dsl fused_moe tactic"
    n_blocks = max_blocks(p.tokens * p.top_k, p.experts, t.block_m)
    if p.a2_per_expert and n_blocks > MAX_GRID_Z:
        return (f"a per-expert a2_global_scale quantizes the intermediate per block of {t.block_m} rows, at "
                f"most {MAX_GRID_Z} blocks (grid z); this problem can use {n_blocks}")
    rows = n_blocks * t.block_m
    block_expert = torch.empty(n_blocks, dtype=torch.int32, device="meta")
    for name, k, n_w, gemm in (("FC1", p.hidden, 2 * p.inter, t.fc1()), ("FC2", p.inter, p.hidden, t.fc2())):
        a = torch.empty((rows, k // 2), dtype=torch.uint8, device="meta")
        w = torch.empty((p.experts, n_w, k // 2), dtype=torch.uint8, device="meta")
        reason = why_not(gemm, a, None, w, None, None, block_expert, name == "FC1", t.block_m, cap=p.capability)
        if reason is not None:
            return f"{name}: {reason}"
    return None


def op_default(p: MoeProblem) -> CuteMoeTactic:
    """default_for's tiles for both GEMMs, no clusters."""
    fc2 = default_for(p.capability, False, p.hidden)
    return CuteMoeTactic(default_for(p.capability, True, p.inter).tile_k, fc2.tile_n, fc2.tile_k, 1)


def op_candidates(p: MoeProblem) -> list[CuteMoeTactic]:
    """The default, then every FC1 K tile x FC2 tile x cluster of the capability's tiles."""
    tiles = tactics_for_capability(p.capability)
    out = [op_default(p)] + [CuteMoeTactic(k1, t2.tile_n, t2.tile_k, cm) for cm in (1, 2)
                             for k1 in sorted({t.tile_k for t in tiles}) for t2 in tiles if t2.cluster_m == cm]
    return valid_unique(out, op_why_not, p)


def op_key(p: MoeProblem) -> str:
    pairs = p.tokens * p.top_k
    bucket = 1 << max(0, (pairs - 1).bit_length())
    fmt = "" if p.fmt.block_size == 16 else f",{p.fmt.name}"
    return f"pairs<={bucket},E={p.experts},H={p.hidden},I={p.inter},a2_per_expert={p.a2_per_expert}{fmt}"


MOE_OP_SPACE = TacticSpace(candidates=op_candidates, default=op_default, key=op_key, why_not=op_why_not)
