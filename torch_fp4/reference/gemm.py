"""Reference FP4 GEMM (spec section 5)."""
from __future__ import annotations

import torch

from .. import formats as F
from .quantize import dequantize_fp32, fp4_quantized_values


def mm_fp4(a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor | None, b_scale: torch.Tensor,
           alpha: torch.Tensor | None, out_dtype: torch.dtype, fmt: F.Fp4Format,
           sf_layout: F.SfLayout, weight_layout: F.WeightLayout = F.WeightLayout.ROW,
           quantize_a: bool = False, a_global_scale: torch.Tensor | None = None,
           b_global_scale: torch.Tensor | None = None, bias: torch.Tensor | None = None) -> torch.Tensor:
    """out = RN_out(RN_fp32(alpha * acc)), acc = A @ B^T (spec section 5), with A [M, K] (FP4 with
    a_scale, or bf16/fp16 when a_scale is None; quantize_a: the exact values of its quantization
    in fmt, fp4_quantized_values) and B given transposed: b [K/2, N] (a view of [N, K/2] in
    `weight_layout`), b_scale [Kp, Np] (a view of the 128x4 [Np, Kp] scales). Products are summed
    exactly (fp64) and rounded once to fp32 for acc, which is within the spec's bound and exact on
    grid-exact inputs. With b_global_scale (alpha None), alpha = RN(1 / RN(gs_a * gs_b))
    (formats.nvfp4_alpha; gs_a = a_global_scale, or 1 for 16-bit a). With bias [N]: out =
    RN_out(RN_fp32(RN_fp32(alpha * acc) + bias[n]))."""
    if b_global_scale is not None:
        alpha = F.nvfp4_alpha(a_global_scale, b_global_scale)
    if quantize_a:
        a = fp4_quantized_values(a, a_global_scale, fmt)
    if a_scale is None:
        a_hat = a.float()
    else:
        a_hat = dequantize_fp32(a, a_scale, None, fmt, sf_layout)
    w = F.from_weight_layout(b.T, weight_layout)  # row-major [N, K/2]
    b_hat = dequantize_fp32(w, b_scale.T, None, fmt, F.SfLayout.LAYOUT_128x4)
    acc = (a_hat.double() @ b_hat.double().T).float()
    if alpha is not None:
        acc = acc * alpha.float().reshape(())
    if bias is not None:   # a separate fp32 add (no fused multiply-add with alpha)
        acc = acc + bias.float()
    return acc.to(out_dtype)
