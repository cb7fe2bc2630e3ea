"""Quantize family: compute_global_scale, nvfp4_quantize, mxfp4_quantize, fp4_dequantize,
fp4_quantized_values."""
from __future__ import annotations

from typing import Optional

import torch

from .. import formats as F
from .. import meta, reference
from ..problems import DequantizeProblem, GlobalScaleProblem, QuantizeProblem
from ..backends import Backend
from . import _checks as C
from ._registry import eager, define, register_impl, register_problem, run

FP4_DATA = F.FP4_DATA_DTYPES
_BATCH_DIMS = "a 2-D [M, K] or 3-D [E, M, K] tensor"


# ---------------------------------------------------------------------------------------------
# Validation (shared by the real and the fake implementation)
# ---------------------------------------------------------------------------------------------
def _check_source(op: str, x: torch.Tensor, fmt: F.Fp4Format) -> None:
    C.dtype(op, "x", x, C.FLOAT_INPUT_DTYPES)
    C.ndim(op, "x", x, (2, 3), _BATCH_DIMS)
    C.contiguous(op, "x", x)
    C.multiple_of(op, "x", x.shape[-1], fmt.block_size,
                  f"K (last dimension; the {fmt.name.upper()} block size)")


def _batch(t: torch.Tensor) -> Optional[int]:
    return t.shape[0] if t.dim() == 3 else None


def check_scale_dtype(op: str, name: str, scale: torch.Tensor, fmt: F.Fp4Format) -> None:
    """Block scales of `fmt` (or their uint8 view); the other format's scales name block_size."""
    C.tensor(op, name, scale)
    other = F.MXFP4 if fmt is F.NVFP4 else F.NVFP4
    if scale.dtype == other.scale_dtype:
        C.fail(op, name, f"{fmt.name.upper()} block scales ({fmt.scale_dtype}) for block_size="
               f"{fmt.block_size}; {other.name.upper()} scales need block_size={other.block_size}",
               scale.dtype, TypeError)
    C.dtype(op, name, scale, (fmt.scale_dtype, torch.uint8))


def check_scale(op: str, name: str, scale: torch.Tensor, rows_k: tuple[int, ...],
                fmt: F.Fp4Format, layout: F.SfLayout) -> None:
    """Block scales of `fmt` for an unpacked [*batch, rows, K] operand, stored in `layout`."""
    check_scale_dtype(op, name, scale, fmt)
    expected = F.scale_shape(rows_k, fmt.block_size, layout)
    C.shape(op, name, scale, expected,
            f"({layout.value} scales of a {list(rows_k)} {fmt.name.upper()} operand)")


def _check_data(op: str, data: torch.Tensor, fmt: F.Fp4Format) -> tuple[int, ...]:
    C.dtype(op, "data", data, FP4_DATA)
    C.ndim(op, "data", data, (2, 3), "a 2-D [M, K/2] or 3-D [E, M, K/2] tensor")
    C.contiguous(op, "data", data)
    k = data.shape[-1] * 2
    C.multiple_of(op, "data", k, fmt.block_size,
                  f"K = 2 * data.shape[-1] (the {fmt.name.upper()} block size)")
    return (*data.shape[:-1], k)


def _validate_global_scale(x: torch.Tensor, backend: int) -> Backend:
    C.dtype("compute_global_scale", "x", x, C.FLOAT_INPUT_DTYPES)
    return Backend.parse(backend, "compute_global_scale: backend")


def _validate_nvfp4(x, global_scale, sf_layout, backend) -> tuple[F.SfLayout, Backend]:
    op = "nvfp4_quantize"
    _check_source(op, x, F.NVFP4)
    C.global_scale(op, "global_scale", global_scale, _batch(x))
    C.same_device(op, x=x, global_scale=global_scale)
    return F.SfLayout.parse(sf_layout, f"{op}: sf_layout"), Backend.parse(backend, f"{op}: backend")


def _validate_mxfp4(x, sf_layout, backend) -> tuple[F.SfLayout, Backend]:
    op = "mxfp4_quantize"
    _check_source(op, x, F.MXFP4)
    return F.SfLayout.parse(sf_layout, f"{op}: sf_layout"), Backend.parse(backend, f"{op}: backend")


def _validate_dequantize(data, scale, global_scale, block_size, sf_layout, out_dtype, backend):
    op = "fp4_dequantize"
    fmt = C.block_size(op, block_size)
    layout = F.SfLayout.parse(sf_layout, f"{op}: sf_layout")
    rows_k = _check_data(op, data, fmt)
    check_scale(op, "scale", scale, rows_k, fmt, layout)
    C.contiguous(op, "scale", scale)
    if global_scale is not None:
        if not fmt.has_global_scale:
            C.fail(op, "global_scale", "None for MXFP4 (block_size=32 has no global scale)",
                   "a tensor")
        C.global_scale(op, "global_scale", global_scale, _batch(data))
    C.dtype_arg(op, "out_dtype", out_dtype, C.OUT_DTYPES)
    C.same_device(op, data=data, scale=scale, global_scale=global_scale)
    return fmt, layout, Backend.parse(backend, f"{op}: backend")


def check_quantize_global_scale(op: str, name: str, gs, fmt: F.Fp4Format, batch: Optional[int],
                                when: str) -> None:
    """The global scale of a quantization in `fmt`: an fp32 tensor [1] (or [batch]) for NVFP4
    (`when`: the case that needs it, for the message), None for MXFP4."""
    if fmt.has_global_scale:
        if gs is None:
            C.fail(op, name, f"an fp32 tensor [1] {when}", "None", TypeError)
        C.global_scale(op, name, gs, batch)
    elif gs is not None:
        C.fail(op, name, "None for MXFP4 (block_size=32 has no global scale)", "a tensor")


def _validate_values(x, global_scale, block_size, backend) -> tuple[F.Fp4Format, Backend]:
    op = "fp4_quantized_values"
    fmt = C.block_size(op, block_size)
    _check_source(op, x, fmt)
    check_quantize_global_scale(op, "global_scale", global_scale, fmt, _batch(x),
                                "for NVFP4 (block_size=16; see compute_global_scale)")
    C.same_device(op, x=x, global_scale=global_scale)
    return fmt, Backend.parse(backend, f"{op}: backend")


# The validated arguments as one problem object, and the requested backend (ops._registry.run).
def _global_scale_problem(x, backend) -> tuple[GlobalScaleProblem, Backend]:
    bk = _validate_global_scale(x, backend)
    return GlobalScaleProblem.of(x), bk


def _nvfp4_problem(x, global_scale, sf_layout, backend) -> tuple[QuantizeProblem, Backend]:
    layout, bk = _validate_nvfp4(x, global_scale, sf_layout, backend)
    return QuantizeProblem.of(x, F.NVFP4, layout), bk


def _mxfp4_problem(x, sf_layout, backend) -> tuple[QuantizeProblem, Backend]:
    layout, bk = _validate_mxfp4(x, sf_layout, backend)
    return QuantizeProblem.of(x, F.MXFP4, layout), bk


def _dequantize_problem(data, scale, global_scale, block_size, sf_layout, out_dtype,
                        backend) -> tuple[DequantizeProblem, Backend]:
    fmt, layout, bk = _validate_dequantize(data, scale, global_scale, block_size, sf_layout, out_dtype,
                                           backend)
    return DequantizeProblem.of(data, scale, global_scale, fmt, layout, out_dtype), bk


def _values_problem(x, global_scale, block_size, backend) -> tuple[QuantizeProblem, Backend]:
    fmt, bk = _validate_values(x, global_scale, block_size, backend)
    return QuantizeProblem.of(x, fmt, F.SfLayout.LINEAR), bk


# ---------------------------------------------------------------------------------------------
# Ops
# ---------------------------------------------------------------------------------------------
def _compute_global_scale(x: torch.Tensor, backend: int) -> torch.Tensor:
    return run("compute_global_scale", _global_scale_problem, (x, backend), lambda p: (x,))


def _compute_global_scale_fake(x: torch.Tensor, backend: int) -> torch.Tensor:
    _validate_global_scale(x, backend)
    return meta.compute_global_scale(x)


def _nvfp4_quantize(x: torch.Tensor, global_scale: torch.Tensor, sf_layout: str,
                    backend: int) -> tuple[torch.Tensor, torch.Tensor]:
    return run("nvfp4_quantize", _nvfp4_problem, (x, global_scale, sf_layout, backend),
               lambda p: (x, global_scale, p.sf_layout))


def _nvfp4_quantize_fake(x, global_scale, sf_layout, backend):
    layout, _ = _validate_nvfp4(x, global_scale, sf_layout, backend)
    return meta.quantize(x, F.NVFP4, layout)


def _mxfp4_quantize(x: torch.Tensor, sf_layout: str, backend: int) -> tuple[torch.Tensor, torch.Tensor]:
    return run("mxfp4_quantize", _mxfp4_problem, (x, sf_layout, backend), lambda p: (x, p.sf_layout))


def _mxfp4_quantize_fake(x, sf_layout, backend):
    layout, _ = _validate_mxfp4(x, sf_layout, backend)
    return meta.quantize(x, F.MXFP4, layout)


def _fp4_dequantize(data: torch.Tensor, scale: torch.Tensor, global_scale: Optional[torch.Tensor],
                    block_size: int, sf_layout: str, out_dtype: torch.dtype,
                    backend: int) -> torch.Tensor:
    return run("fp4_dequantize", _dequantize_problem,
               (data, scale, global_scale, block_size, sf_layout, out_dtype, backend),
               lambda p: (data, scale, global_scale, p.fmt, p.sf_layout, out_dtype))


def _fp4_dequantize_fake(data, scale, global_scale, block_size, sf_layout, out_dtype, backend):
    _validate_dequantize(data, scale, global_scale, block_size, sf_layout, out_dtype, backend)
    return meta.fp4_dequantize(data, out_dtype)


def _fp4_quantized_values(x: torch.Tensor, global_scale: Optional[torch.Tensor], block_size: int,
                          backend: int) -> torch.Tensor:
    return run("fp4_quantized_values", _values_problem, (x, global_scale, block_size, backend),
               lambda p: (x, global_scale, p.fmt))


def _fp4_quantized_values_fake(x, global_scale, block_size, backend):
    _validate_values(x, global_scale, block_size, backend)
    return meta.fp4_quantized_values(x)


compute_global_scale_op = define("compute_global_scale", _compute_global_scale,
                                 _compute_global_scale_fake)
nvfp4_quantize_op = define("nvfp4_quantize", _nvfp4_quantize, _nvfp4_quantize_fake)
mxfp4_quantize_op = define("mxfp4_quantize", _mxfp4_quantize, _mxfp4_quantize_fake)
fp4_dequantize_op = define("fp4_dequantize", _fp4_dequantize, _fp4_dequantize_fake)
fp4_quantized_values_op = define("fp4_quantized_values", _fp4_quantized_values, _fp4_quantized_values_fake)

register_impl("compute_global_scale", Backend.REFERENCE, reference.compute_global_scale)
register_impl("nvfp4_quantize", Backend.REFERENCE, reference.nvfp4_quantize)
register_impl("mxfp4_quantize", Backend.REFERENCE, reference.mxfp4_quantize)
register_impl("fp4_dequantize", Backend.REFERENCE, reference.fp4_dequantize)
register_impl("fp4_quantized_values", Backend.REFERENCE, reference.fp4_quantized_values)


# ---------------------------------------------------------------------------------------------
# Public functions
# ---------------------------------------------------------------------------------------------
def compute_global_scale(x: torch.Tensor, backend: Backend | str = "auto") -> torch.Tensor:
    """NVFP4 encode global scale of a whole tensor: a [1] fp32 tensor on x's device.

    gs = RN(2688 / amax), amax the largest |x| over the finite elements (±Inf and NaN are
    ignored: they affect only their own blocks when quantized), or 1.0 when amax is 0 or the
    quotient is not finite. Computed on the device with no host synchronization.
    """
    if eager(x):
        return _compute_global_scale(x, backend)
    C.tensors("compute_global_scale", x=x)
    return compute_global_scale_op(x, int(Backend.parse(backend, "compute_global_scale: backend")))


def expert_global_scales(w: torch.Tensor, backend: Backend | str = "auto") -> torch.Tensor:
    """One NVFP4 encode global scale per expert of a 3-D weight w [E, rows, K]: an fp32 [E]
    tensor, entry e = compute_global_scale(w[e]) (what fused_moe's w1/w2_global_scale and a
    3-D nvfp4_quantize take). One launch per expert: meant for load time."""
    C.tensor("expert_global_scales", "w", w)
    C.ndim("expert_global_scales", "w", w, (3,), "a 3-D [E, rows, K] tensor")
    return torch.cat([compute_global_scale(e, backend) for e in w])


def nvfp4_quantize(x: torch.Tensor, global_scale: torch.Tensor, sf_layout: F.SfLayout | str = "128x4",
                   backend: Backend | str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize x [M, K] or [E, M, K] (bf16, fp16, fp32 or fp8 e4m3; K a multiple of 16) to NVFP4.

    global_scale: fp32 device tensor [1] (or [E] for 3-D x), encode convention (2688 / amax; see
    `compute_global_scale`). Returns (data float4_e2m1fn_x2 [..., K/2], scale float8_e4m3fn),
    scale [Mp, Kp] ([E, Mp, Kp]) for "128x4"/"8x4", [M, K/16] for "linear".
    """
    if eager(x, global_scale):
        return _nvfp4_quantize(x, global_scale, sf_layout, backend)
    C.tensors("nvfp4_quantize", x=x, global_scale=global_scale)
    return nvfp4_quantize_op(x, global_scale, F.SfLayout.parse(sf_layout, "nvfp4_quantize: sf_layout").value,
                             int(Backend.parse(backend, "nvfp4_quantize: backend")))


def mxfp4_quantize(x: torch.Tensor, sf_layout: F.SfLayout | str = "128x4",
                   backend: Backend | str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize x [M, K] or [E, M, K] (K a multiple of 32) to MXFP4: (data, float8_e8m0fnu scale)."""
    if eager(x):
        return _mxfp4_quantize(x, sf_layout, backend)
    C.tensors("mxfp4_quantize", x=x)
    return mxfp4_quantize_op(x, F.SfLayout.parse(sf_layout, "mxfp4_quantize: sf_layout").value,
                             int(Backend.parse(backend, "mxfp4_quantize: backend")))


def fp4_dequantize(data: torch.Tensor, scale: torch.Tensor, global_scale: Optional[torch.Tensor] = None,
                   block_size: int = 16, sf_layout: F.SfLayout | str = "128x4",
                   out_dtype: torch.dtype = torch.bfloat16,
                   backend: Backend | str = "auto") -> torch.Tensor:
    """FP4 data [..., K/2] and its block scales -> out_dtype [..., K].

    block_size 16 is NVFP4 (e4m3 scales; global_scale optional, encode convention), 32 is MXFP4
    (e8m0 scales, no global scale). Values are LUT(q) * scale * RN(1/global_scale) in fp32, then
    rounded to out_dtype. data and scale may be uint8 views.
    """
    if eager(data, scale, global_scale):
        return _fp4_dequantize(data, scale, global_scale, block_size, sf_layout, out_dtype, backend)
    C.tensors("fp4_dequantize", data=data, scale=scale)
    return fp4_dequantize_op(data, scale, global_scale, block_size,
                             F.SfLayout.parse(sf_layout, "fp4_dequantize: sf_layout").value, out_dtype,
                             int(Backend.parse(backend, "fp4_dequantize: backend")))


def fp4_quantized_values(x: torch.Tensor, global_scale: Optional[torch.Tensor] = None, block_size: int = 16,
                         backend: Backend | str = "auto") -> torch.Tensor:
    """The values of x's FP4 quantization before the global scale is undone, as bf16 [..., K]:
    `fp4_dequantize(*nvfp4_quantize(x, global_scale), None)` (block_size 16) or
    `fp4_dequantize(*mxfp4_quantize(x), block_size=32)` bit for bit, in one pass. Each value is
    LUT(q) * block scale, exact in bf16 (docs/NUMERICS.md section 3b).

    These are the activations a W4A4 GEMM multiplies: `mm_fp4` with them as bf16 activations and
    alpha = nvfp4_alpha(global_scale, w_global_scale) (MXFP4: None) computes W4A4's product,
    without the FP4 codes and scales in between. FP4Linear's W4A4 forward runs this way.
    x: [M, K] or [E, M, K] (bf16, fp16, fp32 or fp8 e4m3; K a multiple of block_size);
    global_scale: fp32 [1] (or [E]) for NVFP4, None for MXFP4.
    """
    if eager(x, global_scale):
        return _fp4_quantized_values(x, global_scale, block_size, backend)
    C.tensors("fp4_quantized_values", x=x)
    return fp4_quantized_values_op(x, global_scale, block_size,
                                   int(Backend.parse(backend, "fp4_quantized_values: backend")))


register_problem("compute_global_scale", compute_global_scale, _global_scale_problem)
register_problem("nvfp4_quantize", nvfp4_quantize, _nvfp4_problem)
register_problem("mxfp4_quantize", mxfp4_quantize, _mxfp4_problem)
register_problem("fp4_dequantize", fp4_dequantize, _dequantize_problem)
register_problem("fp4_quantized_values", fp4_quantized_values, _values_problem)
