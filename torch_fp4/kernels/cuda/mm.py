"""mm_fp4 on the cuda backend (same signature as torch_fp4/reference/gemm.py, plus the tactic):
the small-M FP4 GEMM of torch_fp4/csrc/mm_small_m.cu (M <= 64) or the Hopper wgmma GEMM of
torch_fp4/csrc/mm_wgmma.cu (sm_90, any M), whichever family the tactic belongs to. Both read
weights in the "sm90" layout (torch_fp4.prepack_weight); the small-M GEMM for M <= 16.

W4A16 feeds the bf16/fp16 activations to the kernel as they are. W4A4 first dequantizes the FP4
activations to bf16 with the backend's dequantize kernel (exact: every NVFP4/MXFP4 value is a bf16
value), then runs the same kernel; the weights are decoded in registers inside the GEMM.
"""
from __future__ import annotations

import torch

from ... import formats as F
from ... import meta
from ...problems import MmProblem
from .._common import prepare_outputs, tactic_or_default, use_pdl
from .build import extension
from .mm_space import MM_SPACE
from .mm_tactics import CudaMmTactic
from .mm_wgmma_tactics import WgmmaMmTactic
from .quantize import _LAYOUT_CODES


def mm_fp4(a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor | None, b_scale: torch.Tensor,
           alpha: torch.Tensor | None, out_dtype: torch.dtype, fmt: F.Fp4Format,
           layout: F.SfLayout, wlayout: F.WeightLayout = F.WeightLayout.ROW,
           tactic: CudaMmTactic | WgmmaMmTactic | None = None,
           problem: MmProblem | None = None) -> torch.Tensor:
    p = problem or MmProblem.of(a, b, a_scale, b_scale, alpha, out_dtype, fmt, layout, wlayout)
    t = tactic_or_default(tactic, MM_SPACE, p)
    out = prepare_outputs(meta.mm_fp4(a, b, out_dtype))
    m, n, k = p.m, p.n, p.k
    if m == 0 or n == 0:
        return out
    ext = extension(a.device)
    pdl = use_pdl(a.device)
    if a_scale is not None:
        act = torch.empty((m, k), dtype=torch.bfloat16, device=a.device)
        ext.dequantize(a.view(torch.uint8), a_scale.view(torch.uint8), None, act, fmt.block_size,
                       _LAYOUT_CODES[layout], pdl)
    else:
        act = a
    packed = p.packed
    # The binding takes the weight and its scales transposed, as mm_fp4 does (no views here).
    if isinstance(t, WgmmaMmTactic):
        ext.mm_fp4_wgmma(act, b, b_scale, alpha, out, fmt.block_size, t.block_m, t.stages, t.split_k,
                         t.persistent, t.ctas_per_sm, t.stream_k, packed, pdl)
    else:
        ext.mm_fp4_small_m(act, b, b_scale, alpha, out, fmt.block_size, t.warps, t.tiles_per_warp, t.block_k,
                           t.stages, t.split_k, packed, pdl)
    return out
