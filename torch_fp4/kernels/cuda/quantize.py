"""Launchers of the quantize family on the cuda backend (same signatures as
torch_fp4/reference/quantize.py). Inputs arrive validated by torch_fp4/ops/quantize.py; outputs
are allocated with torch_fp4.meta and passed through prepare_outputs; every kernel runs on the
current stream of the input's device, with programmatic dependent launch when use_pdl() says so."""
from __future__ import annotations

from typing import Optional

import torch

from ... import formats as F
from ... import meta
from .._common import global_scale_workspace, prepare_outputs, use_pdl
from .build import extension

# Layout codes of torch_fp4/csrc/launch.h.
_LAYOUT_CODES = {F.SfLayout.LAYOUT_128x4: 0, F.SfLayout.LAYOUT_8x4: 1, F.SfLayout.LINEAR: 2}

def compute_global_scale(x: torch.Tensor) -> torch.Tensor:
    out = prepare_outputs(meta.compute_global_scale(x))
    if x.numel() == 0:
        return out.fill_(1.0)
    x = x.contiguous()
    extension(x.device).global_scale(x, out, global_scale_workspace(x.device), use_pdl(x.device))
    return out


def nvfp4_quantize(x: torch.Tensor, global_scale: torch.Tensor,
                   sf_layout: F.SfLayout) -> tuple[torch.Tensor, torch.Tensor]:
    data, scale = prepare_outputs(*meta.quantize(x, F.NVFP4, sf_layout))
    extension(x.device).nvfp4_quantize(x, global_scale, data, scale, _LAYOUT_CODES[sf_layout],
                                       use_pdl(x.device))
    return data, scale


def mxfp4_quantize(x: torch.Tensor, sf_layout: F.SfLayout) -> tuple[torch.Tensor, torch.Tensor]:
    data, scale = prepare_outputs(*meta.quantize(x, F.MXFP4, sf_layout))
    extension(x.device).mxfp4_quantize(x, data, scale, _LAYOUT_CODES[sf_layout], use_pdl(x.device))
    return data, scale


def fp4_dequantize(data: torch.Tensor, scale: torch.Tensor, global_scale: Optional[torch.Tensor],
                   fmt: F.Fp4Format, sf_layout: F.SfLayout, out_dtype: torch.dtype) -> torch.Tensor:
    out = prepare_outputs(meta.fp4_dequantize(data, out_dtype))
    extension(data.device).dequantize(data, scale, global_scale, out, fmt.block_size,
                                      _LAYOUT_CODES[sf_layout], use_pdl(data.device))
    return out
