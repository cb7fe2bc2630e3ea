"""fused_moe on the cuda backend (same signature as torch_fp4/reference/moe.py, plus the tactic):
the shared grouped-GEMM MoE launches (kernels/triton/moe_grouped.py: align, gather, alphas,
inverse permutation, finalize) around the Hopper FP4-weight GEMM of csrc/mm_wgmma.cu run grouped
(torch_fp4_mm_wgmma_grouped): one persistent launch per GEMM over every block of block_m routed
rows, each block multiplying its expert's FP4 weights (decoded in registers, as mm_fp4) and
scaled by its expert's alpha in the epilogue; blocks past the used rows cost nothing.

FC1 writes h = RN_bf16(alpha1[e] * acc) [rows, 2I] and moe_grouped.silu_mul forms
RN_bf16(silu(gate) * up). W4A16 feeds x's rows (bf16/fp16) to FC1 and the bf16 intermediate to
FC2 as they are. W4A4 quantizes both with the cuda quantize kernel (linear scale layout) and
dequantizes them without their global scales (exact: every NVFP4 value times its e4m3 block
scale is a bf16 value), the global scales entering through the alphas, as mm_fp4's W4A4 does.
"""
from __future__ import annotations

from typing import Optional

import torch

from ... import formats as F
from ...problems import MoeProblem
from .. import _common
from .._common import tactic_or_default
from ..triton import moe_grouped
from .build import mm_variant
from .moe_tactics import MOE_SPACE, WgmmaMoeTactic
from .native import DTYPE_CODES, library, raw_stream
from .quantize import dequantize_into, nvfp4_quantize

LAYOUT = F.SfLayout.LINEAR   # the quantized activations' scales: never read by another backend


def _grouped_gemm(a: torch.Tensor, a_scale: Optional[torch.Tensor], w: torch.Tensor, w_scale: torch.Tensor,
                  alpha: torch.Tensor, block_expert: torch.Tensor, swiglu: bool, *,
                  tactic: WgmmaMoeTactic) -> torch.Tensor:
    rows, k = a.shape[0], w.shape[2] * 2
    experts, n = w.shape[0], w.shape[1]
    if a_scale is not None:   # NVFP4 activations: exact bf16 values, the global scale in alpha
        a = dequantize_into(torch.empty((rows, k), dtype=torch.bfloat16, device=a.device), a, a_scale, None,
                            F.NVFP4, LAYOUT)
    out = torch.empty((rows, n), dtype=torch.bfloat16, device=a.device)
    if rows:
        i = a.get_device()
        fp16 = a.dtype == torch.float16
        kp = w_scale.shape[2]
        lib = library(i, f"wgmma{mm_variant(fp16, False, False)}")
        pdl = _common.PDL
        status = lib.mm_wgmma_grouped(
            i, raw_stream(i), pdl, a.data_ptr(), w.data_ptr(), w_scale.data_ptr(), alpha.data_ptr(),
            out.data_ptr(), rows, n, k, kp, int(fp16), 0, DTYPE_CODES[torch.bfloat16], 0,
            tactic.block_m, tactic.stages, 1, 1, tactic.ctas_per_sm, block_expert.data_ptr(), experts,
            w.stride(0), w_scale.stride(0) * w_scale.element_size())
        if status:
            lib.check(status, f"fused_moe grouped GEMM (rows={rows}, N={n}, K={k}, E={experts}) with {tactic}")
    return moe_grouped.silu_mul(out) if swiglu else out


def fused_moe(x: torch.Tensor, w1: torch.Tensor, w1_scale: torch.Tensor, w1_global_scale: torch.Tensor,
              w2: torch.Tensor, w2_scale: torch.Tensor, w2_global_scale: torch.Tensor,
              topk_ids: torch.Tensor, topk_weights: torch.Tensor,
              a1_global_scale: Optional[torch.Tensor], a2_global_scale: Optional[torch.Tensor],
              local_expert_offset: int, out_dtype: torch.dtype, strict_ids: bool = False,
              tactic: Optional[WgmmaMoeTactic] = None, problem: Optional[MoeProblem] = None) -> torch.Tensor:
    p = problem or MoeProblem.of(x, w1, w1_scale, w2, w2_scale, topk_ids, a1_global_scale, a2_global_scale,
                                 local_expert_offset, None if strict_ids else w1.shape[0], out_dtype)
    t = tactic_or_default(tactic, MOE_SPACE, p, op="fused_moe")

    def gemm(a, a_scale, w, w_scale, alpha, block_expert, swiglu):
        return _grouped_gemm(a, a_scale, w, w_scale, alpha, block_expert, swiglu, tactic=t)
    g = moe_grouped.GroupedGemm(gemm=gemm, block_m=t.block_m, quantize=nvfp4_quantize, sf_layout=LAYOUT)
    return moe_grouped.fused_moe(x, w1, w1_scale, w1_global_scale, w2, w2_scale, w2_global_scale, topk_ids,
                                 topk_weights, a1_global_scale, a2_global_scale, local_expert_offset, out_dtype,
                                 strict_ids, g)
