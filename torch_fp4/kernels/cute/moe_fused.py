"""The `cute-dsl` fused_moe backend (opt-in, W4A4 only: NVFP4, or MXFP4 experts with MXFP4
activations): the grouped tcgen05 GEMMs of
moe_blockscaled.py in the shared grouped-GEMM MoE launches (kernels/triton/moe_grouped.py: align,
gather, quantizations, alphas, inverse permutation, finalize), with SwiGLU fused into FC1's GEMM
and activations quantized by the Triton quantize kernel in the 128x4 layout, whose 128-row scale
tiles are exactly the grouping's blocks (the layout the grouped GEMM reads; a per-expert a2 scale
quantizes [rows, I] viewed as [blocks, 128, I], whose batched 128x4 scales are byte for byte the
128x4 scales of [rows, I]).

Status: the grouped GEMM kernels are compiled for sm_100a / sm_103a and never run (no Blackwell
GPU was available). The glue is checked on a CPU against the reference bit for bit, with Triton's
interpreter for the Triton kernels and a PyTorch emulation of the grouped GEMM's contract in
place of the CuTe kernel (tests/test_cute_moe_wiring.py). `"auto"` never picks this backend
(torch_fp4.tuning.OP_ORDER); ask for it with `backend="cute-dsl"`.
"""
from __future__ import annotations

from typing import Optional

import torch

from ... import formats as F
from ...problems import MoeProblem
from ..triton import moe_grouped
from ..triton.moe_gemm import GptOss
from ..triton.moe_align import max_blocks
from ..triton.moe_numerics import interpreting
from .moe_tactics import TILE_M, CuteMoeTactic

BLOCK_M = TILE_M      # rows per block_expert entry: the 1x1-cluster tactics' grouping
MAX_QUANTIZE_BATCH = moe_grouped.MAX_QUANTIZE_BATCH


def _quantize(x: torch.Tensor, gs: Optional[torch.Tensor], layout: F.SfLayout):
    """NVFP4 with the global scale gs, or MXFP4 when gs is None (MXFP4 activations)."""
    if interpreting():
        from ...reference.quantize import mxfp4_quantize, nvfp4_quantize
    else:
        from ..triton.quantize import mxfp4_quantize, nvfp4_quantize
    return mxfp4_quantize(x, layout) if gs is None else nvfp4_quantize(x, gs, layout)


def _grouped_gemm(a, a_scale, w, w_scale, alpha, block_expert, swiglu: bool, *,
                  tactic: Optional[CuteMoeTactic] = None, mx: bool = False):
    """moe_blockscaled.grouped_gemm with the GEMM's part of `tactic` (default: the default tiles,
    no clusters) (imported on first use: it imports cutlass); mx: MXFP4 operands. The CPU tests
    replace this function by an emulation of the grouped GEMM's contract."""
    from .moe_blockscaled import grouped_gemm
    if tactic is None:
        return grouped_gemm(a, a_scale, w, w_scale, alpha, block_expert, swiglu, block_m=BLOCK_M, mx=mx)
    return grouped_gemm(a, a_scale, w, w_scale, alpha, block_expert, swiglu, block_m=tactic.block_m,
                        tactic=tactic.fc1() if swiglu else tactic.fc2(), mx=mx)


def shape_reason(p: MoeProblem) -> Optional[str]:
    """None when the grouped GEMMs' default tactics (moe_tactics.default_for) can run this
    problem on its device's compute capability, else why not (moe_tactics.why_not)."""
    from .moe_tactics import default_for, why_not
    n_blocks = max_blocks(p.tokens * p.top_k, p.experts, BLOCK_M)
    rows = n_blocks * BLOCK_M
    block_expert = torch.empty(n_blocks, dtype=torch.int32, device="meta")
    for name, k, n_w, swiglu, n_out in (("FC1", p.hidden, 2 * p.inter, True, p.inter),
                                        ("FC2", p.inter, p.hidden, False, p.hidden)):
        a = torch.empty((rows, k // 2), dtype=torch.uint8, device="meta")
        w = torch.empty((p.experts, n_w, k // 2), dtype=torch.uint8, device="meta")
        reason = why_not(default_for(p.capability, swiglu, n_out), a, None, w, None, None, block_expert,
                         swiglu, BLOCK_M, cap=p.capability)
        if reason is not None:
            return f"{name}: {reason}"
    if p.a2_per_expert and n_blocks > MAX_QUANTIZE_BATCH:
        return (f"a per-expert a2_global_scale quantizes the intermediate per 128-row block, at "
                f"most {MAX_QUANTIZE_BATCH} blocks (grid z); this problem can use {n_blocks}")
    return None


def fused_moe(x: torch.Tensor, w1: torch.Tensor, w1_scale: torch.Tensor, w1_global_scale: torch.Tensor,
              w2: torch.Tensor, w2_scale: torch.Tensor, w2_global_scale: torch.Tensor,
              topk_ids: torch.Tensor, topk_weights: torch.Tensor,
              a1_global_scale: Optional[torch.Tensor], a2_global_scale: Optional[torch.Tensor],
              local_expert_offset: int, out_dtype: torch.dtype, strict_ids: bool = False,
              fmt: F.Fp4Format = F.NVFP4, w1_bias: Optional[torch.Tensor] = None,
              w2_bias: Optional[torch.Tensor] = None, activation: str = "swiglu", swiglu_alpha: float = 1.702,
              swiglu_limit: float = 7.0, w4a4: bool = False, *,
              tactic: Optional[CuteMoeTactic] = None, problem: Optional[MoeProblem] = None) -> torch.Tensor:
    """Launcher with torch_fp4.reference.fused_moe's signature (W4A4 only: NVFP4 experts with
    a1/a2_global_scale, or MXFP4 experts with MXFP4 activations, `w4a4`, no biases, SwiGLU),
    plus the dispatch's tactic (moe_tactics.CuteMoeTactic: both GEMMs' tiles and the cluster, whose
    rows per block the grouping takes; None: the default tiles, no clusters) and problem.
    Launches only; reads nothing back."""
    mx = fmt.block_size == 32
    if mx and not (w4a4 and w1_bias is None and w2_bias is None and activation == "swiglu"):
        raise ValueError("cute-dsl fused_moe runs MXFP4 experts in W4A4 (MXFP4 activations), without biases, "
                         "with the SwiGLU")
    if not mx and (a1_global_scale is None or a2_global_scale is None):
        raise ValueError("cute-dsl fused_moe needs W4A4 (a1_global_scale and a2_global_scale)")

    def gemm(*args, mx: bool = False):   # looked up per call: the CPU tests replace _grouped_gemm
        return _grouped_gemm(*args, tactic=tactic, mx=mx)
    g = moe_grouped.GroupedGemm(gemm=gemm, block_m=BLOCK_M if tactic is None else tactic.block_m,
                                quantize=_quantize, sf_layout=F.SfLayout.LAYOUT_128x4)
    gpt_oss = GptOss.of(fmt, None, None, activation, swiglu_alpha, swiglu_limit) if mx else None
    return moe_grouped.fused_moe(x, w1, w1_scale, w1_global_scale, w2, w2_scale, w2_global_scale, topk_ids,
                                 topk_weights, a1_global_scale, a2_global_scale, local_expert_offset, out_dtype,
                                 strict_ids, g, gpt_oss, F.MXFP4 if mx else None)
