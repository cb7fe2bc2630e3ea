"""Fakes for the quantize family."""
from __future__ import annotations

import torch

from .. import formats as F


def compute_global_scale(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty((1,), dtype=torch.float32)


def quantize(x: torch.Tensor, fmt: F.Fp4Format, layout: F.SfLayout) -> tuple[torch.Tensor, torch.Tensor]:
    *lead, k = x.shape
    data = x.new_empty((*lead, k // 2), dtype=torch.float4_e2m1fn_x2)
    scale = x.new_empty(F.scale_shape(tuple(x.shape), fmt.block_size, layout), dtype=fmt.scale_dtype)
    return data, scale


def fp4_dequantize(data: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    *lead, half_k = data.shape
    return data.new_empty((*lead, half_k * 2), dtype=out_dtype)


def fp4_quantized_values(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape, dtype=torch.bfloat16)
