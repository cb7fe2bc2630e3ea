"""Launchers of the quantize family on the cuda backend (same signatures as
torch_fp4/reference/quantize.py). Inputs arrive validated by torch_fp4/ops/quantize.py; outputs
are allocated with torch_fp4.meta and passed through prepare_outputs; every kernel runs on the
current stream of the input's device (library "core", native.py), with programmatic dependent
launch when use_pdl() says so."""
from __future__ import annotations

from typing import Optional

import torch

from ... import formats as F
from ... import meta
from .._common import global_scale_workspace, prepare_outputs, use_pdl
from .native import DTYPE_CODES, library, raw_stream

# Layout codes of torch_fp4/csrc/launch.h.
_LAYOUT_CODES = {F.SfLayout.LAYOUT_128x4: 0, F.SfLayout.LAYOUT_8x4: 1, F.SfLayout.LINEAR: 2}


def gs_pointer(global_scale: Optional[torch.Tensor]) -> tuple[Optional[int], int]:
    """Pointer of the global scale(s) and the element stride between batch entries (0: one)."""
    if global_scale is None:
        return None, 0
    return global_scale.data_ptr(), 0 if global_scale.numel() == 1 else global_scale.stride(0)


def compute_global_scale(x: torch.Tensor) -> torch.Tensor:
    out = prepare_outputs(meta.compute_global_scale(x))
    if x.numel() == 0:
        return out.fill_(1.0)
    x = x.contiguous()
    i = x.get_device()
    lib = library(i, "core")
    lib.check(lib.global_scale(i, raw_stream(i), use_pdl(x.device), x.data_ptr(), x.numel(), DTYPE_CODES[x.dtype],
                               out.data_ptr(), global_scale_workspace(x.device).data_ptr()), "compute_global_scale")
    return out


def _quantize(entry: str, x: torch.Tensor, global_scale: Optional[torch.Tensor], fmt: F.Fp4Format,
              sf_layout: F.SfLayout) -> tuple[torch.Tensor, torch.Tensor]:
    data, scale = prepare_outputs(*meta.quantize(x, fmt, sf_layout))
    i = x.get_device()
    lib = library(i, "core")
    gs, gs_stride = gs_pointer(global_scale)
    lib.check(getattr(lib, entry)(i, raw_stream(i), use_pdl(x.device), x.data_ptr(), gs, gs_stride, data.data_ptr(),
                                  scale.data_ptr(), x.shape[0] if x.dim() == 3 else 1, x.shape[-2], x.shape[-1],
                                  scale.shape[-2], scale.shape[-1], _LAYOUT_CODES[sf_layout], DTYPE_CODES[x.dtype]),
              entry)
    return data, scale


def nvfp4_quantize(x: torch.Tensor, global_scale: torch.Tensor,
                   sf_layout: F.SfLayout) -> tuple[torch.Tensor, torch.Tensor]:
    return _quantize("nvfp4_quantize", x, global_scale, F.NVFP4, sf_layout)


def exact_values(x: torch.Tensor, global_scale: Optional[torch.Tensor], fmt: F.Fp4Format = F.NVFP4,
                 src_pairs: Optional[torch.Tensor] = None, top_k: int = 1,
                 out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """bf16 [..., rows, k]: the values of x's NVFP4 (with global_scale) or MXFP4 (global_scale
    None) quantization dequantized without the global scale (code * block scale, exact in bf16),
    in one launch: what fp4_dequantize(*quantize(x, ...), None) returns, bit for bit. x is
    contiguous [rows, k] or [batch, rows, k] (global_scale [1] or [batch]), k a multiple of the
    block size. src_pairs (int32 [rows'], x 2-D): gathered, row m of the [rows', k] result from
    x's row src_pairs[m] // top_k (fused_moe's rows grouped by expert; every entry in range).
    out: the result's preallocated bf16 tensor (default: a new one)."""
    shape = x.shape if src_pairs is None else (src_pairs.shape[0], x.shape[1])
    if out is None:
        out = torch.empty(shape, dtype=torch.bfloat16, device=x.device)
    if out.numel() == 0:
        return out
    i = x.get_device()
    lib = library(i, "core")
    gs, gs_stride = gs_pointer(global_scale)
    lib.check(lib.exact_values(i, raw_stream(i), use_pdl(x.device), x.data_ptr(), gs, gs_stride, out.data_ptr(),
                               x.shape[0] if x.dim() == 3 else 1, shape[-2], shape[-1], DTYPE_CODES[x.dtype],
                               fmt.block_size, None if src_pairs is None else src_pairs.data_ptr(), top_k),
              "fp4 exact values")
    return out


def fp4_quantized_values(x: torch.Tensor, global_scale: Optional[torch.Tensor], fmt: F.Fp4Format) -> torch.Tensor:
    """The public op fp4_quantized_values: exact_values with an output the tests may poison."""
    return exact_values(x, global_scale, fmt, out=prepare_outputs(meta.fp4_quantized_values(x)))


def mxfp4_quantize(x: torch.Tensor, sf_layout: F.SfLayout) -> tuple[torch.Tensor, torch.Tensor]:
    return _quantize("mxfp4_quantize", x, None, F.MXFP4, sf_layout)


def dequantize_into(out: torch.Tensor, data: torch.Tensor, scale: torch.Tensor, global_scale: Optional[torch.Tensor],
                    fmt: F.Fp4Format, sf_layout: F.SfLayout) -> torch.Tensor:
    """Dequantizes FP4 `data` [..., rows, k/2] (any 1-byte dtype) with its block scales into the
    preallocated `out` [..., rows, k]."""
    i = data.get_device()
    lib = library(i, "core")
    gs, gs_stride = gs_pointer(global_scale)
    lib.check(lib.dequantize(i, raw_stream(i), use_pdl(data.device), data.data_ptr(), scale.data_ptr(), gs, gs_stride,
                             out.data_ptr(), data.shape[0] if data.dim() == 3 else 1, data.shape[-2],
                             data.shape[-1] * 2, scale.shape[-2], scale.shape[-1], _LAYOUT_CODES[sf_layout],
                             DTYPE_CODES[out.dtype], fmt.block_size), "fp4_dequantize")
    return out


def fp4_dequantize(data: torch.Tensor, scale: torch.Tensor, global_scale: Optional[torch.Tensor],
                   fmt: F.Fp4Format, sf_layout: F.SfLayout, out_dtype: torch.dtype) -> torch.Tensor:
    out = prepare_outputs(meta.fp4_dequantize(data, out_dtype))
    return dequantize_into(out, data, scale, global_scale, fmt, sf_layout)
