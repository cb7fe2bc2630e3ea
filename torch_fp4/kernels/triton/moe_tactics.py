"""Tactics of the Triton fused MoE (cheap to import: no triton at import time).

A tactic is the launch configuration of the two grouped GEMMs (kernels/triton/moe_gemm.py's
MoeConfig, as flat fields): sorted rows per block, swapped operands, each GEMM's tile, warps and
stages, FC2's K slices and whether the finalize runs in FC2's epilogue. The default is
moe_gemm.default_config (from the routed rows per expert); `with torch_fp4.autotune():` times the
candidates, `torch_fp4.fused_moe_tactics(...)` lists them and `torch_fp4.use_tactic(t)` forces one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ...backends import Backend
from ...problems import MoeProblem
from ...tactics import Tactic, TacticSpace, register_family, valid_unique
from .._common import problem_sm_count

BLOCK_KS = (64, 128)            # block_k 256 spills in the main loop (tests/test_triton_moe_compile.py)
WARPS = (4, 8)
STAGES = (2, 3, 4)
MAX_SPLIT = 8


@register_family
@dataclass(frozen=True)
class TritonMoeTactic(Tactic):
    block_m: int                # sorted rows per block (one expert); the MMA's N side when swap_ab
    swap_ab: bool
    fc1_block_n: int            # FC1: gate rows (and as many up rows) per program
    fc1_block_k: int
    fc2_block_n: int
    fc2_block_k: int
    fc2_split: int = 1          # K slices of FC2 (fp32 partials added in order by the finalize)
    fused_finalize: bool = True  # the top-k sum in FC2's epilogue, else a kernel of its own
    fc1_warps: int = 4
    fc1_stages: int = 3
    fc2_warps: int = 4
    fc2_stages: int = 3

    backend = Backend.TRITON
    family = "triton_moe"

    def config(self):
        """The launcher's moe_gemm.MoeConfig."""
        from .moe_gemm import GemmTile, MoeConfig
        return MoeConfig(self.block_m, self.swap_ab, GemmTile(self.fc1_block_n, self.fc1_block_k, self.fc1_warps,
                                                              self.fc1_stages),
                         GemmTile(self.fc2_block_n, self.fc2_block_k, self.fc2_warps, self.fc2_stages),
                         self.fc2_split, self.fused_finalize)

    @classmethod
    def of(cls, cfg) -> "TritonMoeTactic":
        return cls(cfg.block_m, cfg.swap_ab, cfg.fc1.block_n, cfg.fc1.block_k, cfg.fc2.block_n, cfg.fc2.block_k,
                   cfg.fc2_split, cfg.fused_finalize, cfg.fc1.num_warps, cfg.fc1.num_stages, cfg.fc2.num_warps,
                   cfg.fc2.num_stages)


def _power_of_two(v: int, least: int) -> bool:
    return v >= least and not v & (v - 1)


def why_not(t: Tactic, p: MoeProblem) -> Optional[str]:
    if not isinstance(t, TritonMoeTactic):
        return f"{t.family} is not a Triton fused_moe tactic"
    for name in ("block_m", "fc1_block_n", "fc2_block_n"):
        if not _power_of_two(getattr(t, name), 16):
            return f"{name}={getattr(t, name)} must be a power of two >= 16"
    for name in ("fc1_block_k", "fc2_block_k"):
        if getattr(t, name) not in BLOCK_KS:
            return f"{name}={getattr(t, name)} must be one of {BLOCK_KS}"
    for name in ("fc1_warps", "fc2_warps"):
        if getattr(t, name) not in WARPS:
            return f"{name}={getattr(t, name)} must be one of {WARPS}"
    for name in ("fc1_stages", "fc2_stages"):
        if getattr(t, name) not in STAGES:
            return f"{name}={getattr(t, name)} must be one of {STAGES}"
    if not _power_of_two(t.fc2_split, 1) or t.fc2_split > MAX_SPLIT:
        return f"fc2_split={t.fc2_split} must be a power of two <= {MAX_SPLIT}"
    steps = -(-p.inter // t.fc2_block_k)
    if t.fc2_split > steps:
        return f"fc2_split={t.fc2_split} leaves empty K slices (FC2 has {steps} K steps of {t.fc2_block_k})"
    return None


def default(p: MoeProblem) -> TritonMoeTactic:
    """moe_gemm.default_config: tiles from the routed rows per active expert."""
    from .moe_gemm import default_config
    return TritonMoeTactic.of(default_config(p.tokens, p.top_k, p.experts, p.hidden, p.inter, problem_sm_count(p)))


def candidates(p: MoeProblem) -> list[TritonMoeTactic]:
    """The default, then each row-block size with its regime's tiles (swapped operands up to 64
    rows), FC2's K split halved and doubled, the finalize the other way, and 8 warps."""
    base = default(p)
    out = [base]
    for bm in (16, 32, 64, 128):
        swap = bm <= 64
        warps = 4 if swap else 8
        out.append(TritonMoeTactic(bm, swap, 64, 128 if swap else 64, 64 if swap else 128, 128 if swap else 64,
                                   base.fc2_split if swap else 1, base.fused_finalize, warps, 3, warps, 3))
    for split in (base.fc2_split // 2, base.fc2_split * 2):
        if split >= 1:
            out.append(TritonMoeTactic(**{**base.__dict__, "fc2_split": split}))
    out.append(TritonMoeTactic(**{**base.__dict__, "fused_finalize": not base.fused_finalize}))
    out.append(TritonMoeTactic(**{**base.__dict__, "fc1_warps": 8, "fc2_warps": 8}))
    return valid_unique(out, why_not, p)


def key(p: MoeProblem) -> str:
    pairs = p.tokens * p.top_k
    bucket = 1 << max(0, (pairs - 1).bit_length())
    a_kind = "w4a4" if p.w4a4 else str(p.x_dtype).removeprefix("torch.")
    extra = f",{p.gpt_oss_features}" if p.gpt_oss_features is not None else ""
    return f"pairs<={bucket},E={p.experts},H={p.hidden},I={p.inter},{p.fmt.name},{a_kind}{extra}"


MOE_SPACE = TacticSpace(candidates=candidates, default=default, key=key, why_not=why_not)
