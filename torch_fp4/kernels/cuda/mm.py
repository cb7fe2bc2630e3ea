"""mm_fp4 on the cuda backend (same signature as torch_fp4/reference/gemm.py, plus the tactic):
the small-M FP4 GEMM of torch_fp4/csrc/mm_small_m.cu (M <= 64) or the Hopper wgmma GEMM of
torch_fp4/csrc/mm_wgmma.cu (sm_90, any M), whichever family the tactic belongs to. Both read
weights in the "sm90" layout (torch_fp4.prepack_weight); the small-M GEMM for M <= 32.

W4A16 feeds the bf16/fp16 activations to the kernel as they are. Given the global scales
(b_global_scale), the kernels form alpha in their epilogue (csrc/mm_small_m.cuh epilogue_alpha). W4A4 first dequantizes the FP4
activations to bf16 with the backend's dequantize kernel (exact: every NVFP4/MXFP4 value is a bf16
value), then runs the same kernel; the weights are decoded in registers inside the GEMM.
W4A4 from 16-bit activations (quantize_a, FP4Linear's W4A4): the quantize kernel's exact-values
mode writes the activations' quantized values as bf16 (fp4_quantized_values, one launch), then
the same GEMM runs on them (BENCHMARKS.md: quantizing inside the small-M GEMM was slower).
A bias is added in both kernels' epilogues, in fp32 before the output's one rounding.
"""
from __future__ import annotations

import torch

from ... import formats as F
from ...problems import MmProblem
from .. import _common
from .._common import cuda_empty, prepare_outputs, tactic_or_default
from .build import mm_variant, small_m_library, wgmma_library
from .mm_space import MM_SPACE
from .mm_tactics import CudaMmTactic
from .mm_wgmma_tactics import WgmmaMmTactic
from .native import DTYPE_CODES, library, raw_stream
from .quantize import dequantize_into, exact_values


def mm_fp4(a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor | None, b_scale: torch.Tensor,
           alpha: torch.Tensor | None, out_dtype: torch.dtype, fmt: F.Fp4Format,
           layout: F.SfLayout, wlayout: F.WeightLayout = F.WeightLayout.ROW,
           quantize_a: bool = False, a_global_scale: torch.Tensor | None = None,
           b_global_scale: torch.Tensor | None = None, bias: torch.Tensor | None = None,
           tactic: CudaMmTactic | WgmmaMmTactic | None = None,
           problem: MmProblem | None = None) -> torch.Tensor:
    p = problem or MmProblem.of(a, b, a_scale, b_scale, alpha, out_dtype, fmt, layout, wlayout, quantize_a,
                                b_global_scale)
    t = tactic_or_default(tactic, MM_SPACE, p)
    m, n, k = p.m, p.n, p.k
    out = prepare_outputs(cuda_empty((m, n), out_dtype, a))
    if m == 0 or n == 0:
        return out
    i = a.get_device()
    stream, pdl = raw_stream(i), _common.PDL and p.capability >= (9, 0)   # use_pdl, from the problem
    if a_scale is not None:
        act = dequantize_into(cuda_empty((m, k), torch.bfloat16, a), a, a_scale, None, fmt,
                              layout)
    elif quantize_a:
        act = exact_values(a, a_global_scale, fmt, out=cuda_empty((m, k), torch.bfloat16, a))
    else:
        act = a
    fp16, mx = act.dtype == torch.float16, fmt.block_size == 32
    # Operands in make_mm_operands' order (csrc/mm_operands.h); b and b_scale are w.T and w_scale.T,
    # whose storage is w [N, K/2] and its 128x4 scales [Np, Kp] (kp = the padded scale columns).
    # With b_global_scale the epilogue forms alpha from the global scales (w_gs, a_gs).
    kp = -(-(k // fmt.block_size) // 4) * 4
    w_gs = a_gs = None
    if b_global_scale is not None:
        w_gs = b_global_scale.data_ptr()
        a_gs = None if a_global_scale is None else a_global_scale.data_ptr()
    ops = (act.data_ptr(), b.data_ptr(), b_scale.data_ptr(), None if alpha is None else alpha.data_ptr(), w_gs,
           a_gs, out.data_ptr(), m, n, k, kp, int(fp16), int(mx), DTYPE_CODES[out_dtype], int(p.packed))
    variant = mm_variant(fp16, mx, p.packed)
    bias_args = (None, 0) if bias is None else (bias.data_ptr(), DTYPE_CODES[bias.dtype])
    if isinstance(t, WgmmaMmTactic):
        lib = library(i, wgmma_library(variant, t.block_m))
        tactic_args = (t.block_m, t.stages, t.split_k, int(t.persistent), t.ctas_per_sm, int(t.stream_k),
                       t.k_groups)
        workspace = None
        if t.stream_k:
            size = lib.mm_wgmma_workspace_bytes(i, *ops, *tactic_args)
            if size < 0:
                lib.check(-size, "mm_fp4 stream-K workspace size")
            if size > 0:
                workspace = cuda_empty((size,), torch.uint8, a)
        status = lib.mm_wgmma(i, stream, pdl, *ops, *bias_args, *tactic_args,
                              None if workspace is None else workspace.data_ptr())
    else:
        lib = library(i, small_m_library(variant, m))
        status = lib.mm_small_m(i, stream, pdl, *ops, *bias_args, t.warps, t.tiles_per_warp, t.block_k, t.stages,
                                t.split_k)
    if status:
        lib.check(status, f"mm_fp4 (M={m}, N={n}, K={k}) with {t}")
    return out
