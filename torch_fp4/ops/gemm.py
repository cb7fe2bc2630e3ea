"""mm_fp4: FP4 GEMM, W4A4 (NVFP4 / MXFP4) and W4A16."""
from __future__ import annotations

from typing import Optional

import torch

from .. import formats as F
from .. import meta, reference
from ..problems import MmProblem
from ..backends import Backend
from . import _checks as C
from ._registry import define, eager, register_impl, register_problem, run, tactics_for
from .quantize import check_quantize_global_scale, check_scale, check_scale_dtype

OP = "mm_fp4"


def _validate(a, b, a_scale, b_scale, alpha, out_dtype, block_size, sf_layout, backend, weight_layout,
              quantize_a=False, a_global_scale=None, b_global_scale=None, bias=None):
    fmt = C.block_size(OP, block_size)
    layout = F.SfLayout.parse(sf_layout, f"{OP}: sf_layout")
    wlayout = F.WeightLayout.parse(weight_layout, f"{OP}: weight_layout")
    C.dtype(OP, "b", b, F.FP4_DATA_DTYPES)
    C.ndim(OP, "b", b, (2,), "a 2-D [K/2, N] tensor (the weight [N, K/2] passed as w.T)")
    C.transposed_row_major(OP, "b", b, "[N, K/2] weight")
    half_k, n = b.shape
    k = 2 * half_k
    C.multiple_of(OP, "b", k, fmt.block_size, f"K = 2 * b.shape[0] (the {fmt.name.upper()} block size)")
    if wlayout is not F.WeightLayout.ROW:
        reason = F.sm90_layout_reason(n, k)
        if reason is not None:
            C.fail(OP, "weight_layout", f"'row' for b of shape {tuple(b.shape)} ({reason})", repr(wlayout.value))
    C.tensor(OP, "a", a)
    if a_scale is None:
        if a.dtype in F.FP4_DATA_DTYPES:
            C.fail(OP, "a_scale", "the block scales of the FP4 operand a", "None")
        C.dtype(OP, "a", a, C.HALF_DTYPES)
        C.ndim(OP, "a", a, (2,), "a 2-D [M, K] tensor")
        if a.shape[1] != k:
            C.fail(OP, "a", f"shape [M, {k}] (K = 2 * b.shape[0])", f"shape {tuple(a.shape)}")
    else:
        C.dtype(OP, "a", a, F.FP4_DATA_DTYPES)
        C.ndim(OP, "a", a, (2,), "a 2-D [M, K/2] tensor")
        if a.shape[1] != half_k:
            C.fail(OP, "a", f"shape [M, {half_k}] (K/2 = b.shape[0])", f"shape {tuple(a.shape)}")
        check_scale(OP, "a_scale", a_scale, (a.shape[0], k), fmt, layout)
        C.contiguous(OP, "a_scale", a_scale)
    C.contiguous(OP, "a", a)
    _check_quantize_a(fmt, a_scale, quantize_a, a_global_scale, b_global_scale)
    _check_global_scales(fmt, a_scale, quantize_a, alpha, a_global_scale, b_global_scale)
    check_scale_dtype(OP, "b_scale", b_scale, fmt)
    np_, kp = F.padded_scale_shape(n, k // fmt.block_size, F.SfLayout.LAYOUT_128x4)
    C.shape(OP, "b_scale", b_scale, (kp, np_),
            f"(the 128x4 scales [{np_}, {kp}] of b, passed transposed as w_scale.T)")
    C.transposed_row_major(OP, "b_scale", b_scale, f"[{np_}, {kp}] 128x4 scale matrix")
    if alpha is not None:
        C.dtype(OP, "alpha", alpha, (torch.float32,))
        if alpha.numel() != 1:
            C.fail(OP, "alpha", "a one-element fp32 tensor", f"shape {tuple(alpha.shape)}")
    C.dtype_arg(OP, "out_dtype", out_dtype, C.OUT_DTYPES)
    if bias is not None:
        C.tensor(OP, "bias", bias)
        C.dtype(OP, "bias", bias, C.OUT_DTYPES)
        C.shape(OP, "bias", bias, (n,), "(one value per output column, N = b.shape[1])")
        C.contiguous(OP, "bias", bias)
    C.same_device(OP, a=a, b=b, a_scale=a_scale, b_scale=b_scale, alpha=alpha, a_global_scale=a_global_scale,
                  b_global_scale=b_global_scale, bias=bias)
    return fmt, layout, wlayout, Backend.parse(backend, f"{OP}: backend")


def _check_quantize_a(fmt: F.Fp4Format, a_scale, quantize_a, a_global_scale, b_global_scale) -> None:
    """quantize_a: a (bf16/fp16, checked above) is quantized in W's format on the way in, with
    the global scale a_global_scale (NVFP4) or none (MXFP4)."""
    if not isinstance(quantize_a, bool):
        C.fail(OP, "quantize_a", "a bool", repr(quantize_a), TypeError)
    if not quantize_a:
        if a_global_scale is not None and (a_scale is None or b_global_scale is None):
            C.fail(OP, "a_global_scale", "None unless quantize_a=True, or a is FP4 and b_global_scale is given",
                   "a tensor")
        return
    if a_scale is not None:
        C.fail(OP, "a_scale", "None with quantize_a=True (a holds the 16-bit activations to quantize)",
               "a tensor")
    check_quantize_global_scale(OP, "a_global_scale", a_global_scale, fmt, None,
                                "with quantize_a=True and NVFP4 (block_size=16)")


def _check_global_scales(fmt: F.Fp4Format, a_scale, quantize_a, alpha, a_global_scale, b_global_scale) -> None:
    """b_global_scale (NVFP4): W's global scale; the op then forms alpha = RN(1 / RN(gs_a * gs_w))
    itself (RN(1 / gs_w) for 16-bit a; formats.nvfp4_alpha), gs_a = a_global_scale: the global
    scale of a's quantization (quantize_a), or the one a's FP4 codes were quantized with."""
    if b_global_scale is None:
        return
    check_quantize_global_scale(OP, "b_global_scale", b_global_scale, fmt, None, "")
    if alpha is not None:
        C.fail(OP, "alpha", "None when b_global_scale is given (alpha is then formed from the global scales)",
               "a tensor")
    if a_scale is not None and a_global_scale is None:
        C.fail(OP, "a_global_scale", "the global scale a's FP4 codes were quantized with (fp32 [1]), "
               "when a is FP4 and b_global_scale is given", "None", TypeError)
    if a_scale is not None:
        C.global_scale(OP, "a_global_scale", a_global_scale, None)


def _problem(a, b, a_scale, b_scale, alpha, out_dtype, block_size, sf_layout, backend,
             weight_layout, quantize_a=False, a_global_scale=None,
             b_global_scale=None, bias=None) -> tuple[MmProblem, Backend]:
    """The validated arguments as one problem object, and the requested backend."""
    fmt, layout, wlayout, bk = _validate(a, b, a_scale, b_scale, alpha, out_dtype, block_size, sf_layout,
                                         backend, weight_layout, quantize_a, a_global_scale, b_global_scale, bias)
    return MmProblem.of(a, b, a_scale, b_scale, alpha, out_dtype, fmt, layout, wlayout, quantize_a,
                        b_global_scale), bk


def _mm_fp4(a: torch.Tensor, b: torch.Tensor, a_scale: Optional[torch.Tensor], b_scale: torch.Tensor,
            alpha: Optional[torch.Tensor], out_dtype: torch.dtype, block_size: int, sf_layout: str,
            backend: int, weight_layout: str = "row", quantize_a: bool = False,
            a_global_scale: Optional[torch.Tensor] = None,
            b_global_scale: Optional[torch.Tensor] = None,
            bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    return run(OP, _problem, (a, b, a_scale, b_scale, alpha, out_dtype, block_size, sf_layout, backend,
                              weight_layout, quantize_a, a_global_scale, b_global_scale, bias),
               lambda p: (a, b, a_scale, b_scale, alpha, out_dtype, p.fmt, p.sf_layout, p.weight_layout,
                          p.quantize_a, a_global_scale, b_global_scale, bias))


def _mm_fp4_fake(a, b, a_scale, b_scale, alpha, out_dtype, block_size, sf_layout, backend, weight_layout="row",
                 quantize_a=False, a_global_scale=None, b_global_scale=None, bias=None):
    _validate(a, b, a_scale, b_scale, alpha, out_dtype, block_size, sf_layout, backend, weight_layout,
              quantize_a, a_global_scale, b_global_scale, bias)
    return meta.mm_fp4(a, b, out_dtype)


mm_fp4_op = define(OP, _mm_fp4, _mm_fp4_fake)
register_impl(OP, Backend.REFERENCE, reference.mm_fp4)


def mm_fp4(a: torch.Tensor, b: torch.Tensor, a_scale: Optional[torch.Tensor], b_scale: torch.Tensor,
           alpha: Optional[torch.Tensor] = None, out_dtype: torch.dtype = torch.bfloat16,
           block_size: int = 16, sf_layout: F.SfLayout | str = "128x4",
           backend: Backend | str = "auto",
           weight_layout: F.WeightLayout | str = "row", quantize_a: bool = False,
           a_global_scale: Optional[torch.Tensor] = None,
           b_global_scale: Optional[torch.Tensor] = None,
           bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """out [M, N] = alpha * A @ W^T (+ bias) with FP4 weights W [N, K/2] passed transposed (b = w.T).

    - W4A4: a is FP4 [M, K/2] with block scales a_scale in `sf_layout` ("128x4", "8x4" or
      "linear"); NVFP4 (block_size=16, e4m3 scales) or MXFP4 (block_size=32, e8m0 scales).
    - W4A16: a is bf16/fp16 [M, K] and a_scale is None.
    - W4A4 from 16-bit activations (`quantize_a=True`, a_scale None): a (bf16/fp16 [M, K]) is
      quantized in W's format (NVFP4 with the fp32 [1] global scale `a_global_scale`, MXFP4
      without) and its FP4 values multiply W: the same result as
      `mm_fp4(fp4_quantized_values(a, a_global_scale, block_size), b, None, b_scale, alpha, ...)`
      (docs/NUMERICS.md section 5), in one op call (the GPU backends quantize, then run the
      W4A16 GEMM).
    b_scale holds W's 128x4 block scales [Np, Kp], passed transposed (w_scale.T). alpha is an
    fp32 device tensor with one element (for NVFP4, 1 / (gs_a * gs_w) with encode global
    scales; `torch_fp4.formats.nvfp4_alpha` computes it); None means 1. Accumulates in fp32.
    NVFP4 W may instead pass its global scale as `b_global_scale` (fp32 [1]) with alpha None: the
    op forms alpha = RN(1 / RN(gs_a * gs_w)) itself, bit for bit as nvfp4_alpha (the cuda backend
    inside the GEMM's epilogue: no launch computes it), with gs_a = `a_global_scale` (quantize_a,
    or FP4 a: the global scale its codes were quantized with), and RN(1 / gs_w) for 16-bit a.
    weight_layout: the byte order of W: "row" (row-major, as quantized) or "sm90" (W made by
    `torch_fp4.prepack_weight`, read by the cuda backend's Hopper GEMM; N % 128 == 0, K % 64 == 0).
    bias: [N] bf16 / fp16 / fp32 (contiguous), added in fp32 to RN_fp32(alpha * acc) before the one
    rounding to out_dtype (docs/NUMERICS.md section 5; the cuda backend adds it in its GEMMs'
    epilogue, no launch of its own).
    """
    if eager(a, b, a_scale, b_scale, alpha, a_global_scale, b_global_scale, bias):
        return _mm_fp4(a, b, a_scale, b_scale, alpha, out_dtype, block_size, sf_layout, backend, weight_layout,
                       quantize_a, a_global_scale, b_global_scale, bias)
    C.tensors(OP, a=a, b=b, b_scale=b_scale, **({} if bias is None else {"bias": bias}))
    return mm_fp4_op(a, b, a_scale, b_scale, alpha, out_dtype, block_size,
                     F.SfLayout.parse(sf_layout, f"{OP}: sf_layout").value, int(Backend.parse(backend, f"{OP}: backend")),
                     F.WeightLayout.parse(weight_layout, f"{OP}: weight_layout").value, quantize_a, a_global_scale,
                     b_global_scale, bias)


def mm_fp4_tactics(a: torch.Tensor, b: torch.Tensor, a_scale: Optional[torch.Tensor],
                   b_scale: torch.Tensor, alpha: Optional[torch.Tensor] = None,
                   out_dtype: torch.dtype = torch.bfloat16, block_size: int = 16,
                   sf_layout: F.SfLayout | str = "128x4", backend: Backend | str = "auto",
                   weight_layout: F.WeightLayout | str = "row", quantize_a: bool = False,
                   a_global_scale: Optional[torch.Tensor] = None,
                   b_global_scale: Optional[torch.Tensor] = None,
                   bias: Optional[torch.Tensor] = None) -> list:
    """The tactics that can run this mm_fp4 problem (every supported backend's for "auto"),
    the heuristic default of each backend first. Run one with `torch_fp4.use_tactic(t)`."""
    return tactics_for(OP, *_problem(a, b, a_scale, b_scale, alpha, out_dtype, block_size, sf_layout, backend,
                                     weight_layout, quantize_a, a_global_scale, b_global_scale, bias))


register_problem(OP, mm_fp4, _problem)
