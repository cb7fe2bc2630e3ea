"""Fake (meta) implementations: output shapes, dtypes and strides only (layer 1).

They allocate with `new_empty` on the input's device, so they serve FakeTensor tracing
(torch.compile, torch.export) and equal the real outputs exactly, padded scale shapes included.
"""
from .gemm import mm_fp4
from .moe import fused_moe, route
from .quantize import compute_global_scale, fp4_dequantize, fp4_quantized_values, quantize

__all__ = ["compute_global_scale", "quantize", "fp4_dequantize", "fp4_quantized_values", "mm_fp4", "route", "fused_moe"]
