"""fused_moe on the cuda backend (same signature as torch_fp4/reference/moe.py, plus the tactic),
two grouped GEMM families (kernels/cuda/moe_tactics.py picks by routed rows per expert).

Decode sizes (SmallMMoeTactic): the small-M GEMM of csrc/mm_small_m.cuh run grouped
(csrc/moe_small_m.cu, torch_fp4_moe_small_m): moe_align groups the pairs by expert in blocks of
block_m rows; FC1 reads each block's activation rows straight from x through the pairs, streams
its expert's gate and up rows of 64 (or 32) columns per CTA and writes RN_bf16(silu(gate) * up)
(gate and up each RN_bf16(alpha1[e] * acc), the bf16 h of the spec); FC2 writes each row to its
pair's row of y [T k, H]; the Triton finalize sums y in slot order. Four launches, none reading
anything back; each block's alpha is formed in the GEMM from the global scales (no launch). W4A4 replaces x by the exact values of its quantization (quantize.nvfp4_exact_values:
one launch), and FC1's epilogue
quantizes its output with a2_global_scale and writes the exact dequantized values (16 columns of
a row are four lanes' chunks: one shuffle pair gives the block amax), the global scales entering
through the alphas.

From SMALL_M_BELOW rows per expert (WgmmaMoeTactic): the shared grouped-GEMM MoE launches (kernels/triton/moe_grouped.py: align, gather, alphas,
inverse permutation, finalize) around the Hopper FP4-weight GEMM of csrc/mm_wgmma.cu run grouped
(torch_fp4_mm_wgmma_grouped): one persistent launch per GEMM over every block of block_m routed
rows, each block multiplying its expert's FP4 weights (decoded in registers, as mm_fp4) and
scaled by its expert's alpha in the epilogue; blocks past the used rows cost nothing.

FC1 writes h = RN_bf16(alpha1[e] * acc) [rows, 2I] and moe_grouped.silu_mul forms
RN_bf16(silu(gate) * up). W4A16 feeds x's rows (bf16/fp16) to FC1 and the bf16 intermediate to
FC2 as they are. W4A4 replaces both by the exact values of their NVFP4 quantization without the
global scales (quantize.nvfp4_exact_values: quantize and dequantize in one launch; every NVFP4
value times its e4m3 block scale is a bf16 value), the global scales entering through the
alphas, as mm_fp4's W4A4 does.
"""
from __future__ import annotations

from typing import Optional

import torch

from ... import formats as F
from ...problems import MoeProblem
from .. import _common
from .._common import tactic_or_default
from ... import meta
from ..triton import moe_grouped
from ..triton.moe_align import align
from ..triton.moe_fused import finalize
from ..triton.moe_numerics import interpreting
from .build import mm_variant
from .moe_tactics import MOE_SPACE, SmallMMoeTactic, WgmmaMoeTactic
from .native import DTYPE_CODES, library, raw_stream
from .quantize import gs_pointer, nvfp4_exact_values, nvfp4_quantize

LAYOUT = F.SfLayout.LINEAR   # the quantized activations' scales: never read by another backend


def _grouped_gemm(a: torch.Tensor, a_scale: Optional[torch.Tensor], w: torch.Tensor, w_scale: torch.Tensor,
                  alpha: torch.Tensor, block_expert: torch.Tensor, swiglu: bool, *,
                  tactic: WgmmaMoeTactic) -> torch.Tensor:
    rows, k = a.shape[0], w.shape[2] * 2
    experts, n = w.shape[0], w.shape[1]
    if a_scale is not None:   # W4A4 arrives as exact 16-bit values (GroupedGemm.exact)
        raise RuntimeError("torch_fp4 internal: the cuda grouped GEMM takes 16-bit activations only")
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


def _small_m_gemm(a: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, w_gs: torch.Tensor,
                  a_gs: Optional[torch.Tensor], out: torch.Tensor, blocks, top_k: int, split: int, fc1: bool,
                  t: SmallMMoeTactic, qdq_gs: Optional[torch.Tensor] = None) -> None:
    """FC1 (gather x's rows through the pairs, SwiGLU; out [rows, I]; with qdq_gs ([1] or [E])
    each row's NVFP4 quantization with that global scale, dequantized without it) or FC2 (out
    [T k, H] in pair order) over every block of blocks (moe_align.ExpertBlocks); expert e's alpha
    is formats.nvfp4_alpha(a_gs ([1] or [E], or None), w_gs[e]), formed in the kernel (which reads
    w_gs [E] contiguous and a_gs / qdq_gs at their element stride)."""
    i = a.get_device()
    fp16 = a.dtype == torch.float16
    experts, k = w.shape[0], w.shape[2] * 2
    n = out.shape[1]
    lib = library(i, f"moe_small_m{mm_variant(fp16, False, False)}")
    status = lib.moe_small_m(
        i, raw_stream(i), _common.PDL, a.data_ptr(), w.data_ptr(), w_scale.data_ptr(), None,
        out.data_ptr(), blocks.rows, n, k, w_scale.shape[2], int(fp16), 0, DTYPE_CODES[torch.bfloat16], 0,
        t.warps, t.tiles_per_warp, t.block_k, t.stages, split, t.block_m, blocks.block_expert.data_ptr(),
        blocks.num_blocks, experts, w.stride(0), w_scale.stride(0) * w_scale.element_size(),
        blocks.sorted_pairs.data_ptr(), blocks.expert_end.data_ptr(), top_k, int(fc1), int(fc1), int(not fc1),
        *gs_pointer(qdq_gs), w_gs.contiguous().data_ptr(), *gs_pointer(a_gs))
    if status:
        lib.check(status, f"fused_moe grouped small-M {'FC1' if fc1 else 'FC2'} (N={n}, K={k}, E={experts}) "
                          f"with {t}")


def _small_m_moe(x, w1, w1_scale, w1_global_scale, w2, w2_scale, w2_global_scale, topk_ids, topk_weights,
                 a1_global_scale, a2_global_scale, local_expert_offset, out_dtype, strict_ids,
                 t: SmallMMoeTactic) -> torch.Tensor:
    out = _common.prepare_outputs(meta.fused_moe(x, out_dtype))
    tokens, top_k = x.shape[0], topk_ids.shape[1]
    if tokens == 0 or top_k == 0:
        return out.zero_() if tokens else out
    experts, inter, hidden = w1.shape[0], w1.shape[1] // 2, x.shape[1]
    ids, tw = topk_ids.contiguous(), topk_weights.contiguous()
    blocks = align(ids, experts, local_expert_offset, t.block_m)
    a = x.contiguous()
    if a1_global_scale is not None:   # exact bf16 values of x~, the global scale in alpha1
        a = nvfp4_exact_values(a, a1_global_scale)
    elif a.data_ptr() % 16:
        a = a.clone()
    h = torch.empty((blocks.rows, inter), dtype=torch.bfloat16, device=x.device)
    _small_m_gemm(a, w1, w1_scale, w1_global_scale, a1_global_scale, h, blocks, top_k, t.fc1_split, True, t,
                  qdq_gs=a2_global_scale)
    y = torch.empty((ids.numel(), hidden), dtype=torch.bfloat16, device=x.device)
    _small_m_gemm(h, w2, w2_scale, w2_global_scale, a2_global_scale, y, blocks, top_k, t.fc2_split, False, t)
    finalize(y, ids, tw, out, experts, local_expert_offset, interpreting(), strict=strict_ids)
    return out


def fused_moe(x: torch.Tensor, w1: torch.Tensor, w1_scale: torch.Tensor, w1_global_scale: torch.Tensor,
              w2: torch.Tensor, w2_scale: torch.Tensor, w2_global_scale: torch.Tensor,
              topk_ids: torch.Tensor, topk_weights: torch.Tensor,
              a1_global_scale: Optional[torch.Tensor], a2_global_scale: Optional[torch.Tensor],
              local_expert_offset: int, out_dtype: torch.dtype, strict_ids: bool = False,
              tactic: Optional[WgmmaMoeTactic] = None, problem: Optional[MoeProblem] = None) -> torch.Tensor:
    p = problem or MoeProblem.of(x, w1, w1_scale, w2, w2_scale, topk_ids, a1_global_scale, a2_global_scale,
                                 local_expert_offset, None if strict_ids else w1.shape[0], out_dtype)
    t = tactic_or_default(tactic, MOE_SPACE, p, op="fused_moe")
    if isinstance(t, SmallMMoeTactic):
        return _small_m_moe(x, w1, w1_scale, w1_global_scale, w2, w2_scale, w2_global_scale, topk_ids, topk_weights,
                            a1_global_scale, a2_global_scale, local_expert_offset, out_dtype, strict_ids, t)

    def gemm(a, a_scale, w, w_scale, alpha, block_expert, swiglu):
        return _grouped_gemm(a, a_scale, w, w_scale, alpha, block_expert, swiglu, tactic=t)
    g = moe_grouped.GroupedGemm(gemm=gemm, block_m=t.block_m, quantize=nvfp4_quantize, sf_layout=LAYOUT,
                                exact=nvfp4_exact_values)
    return moe_grouped.fused_moe(x, w1, w1_scale, w1_global_scale, w2, w2_scale, w2_global_scale, topk_ids,
                                 topk_weights, a1_global_scale, a2_global_scale, local_expert_offset, out_dtype,
                                 strict_ids, g)
