"""Pure-PyTorch reference backend: the executable form of the numerics contract (layer 1).

Runs on CPU and CUDA tensors. Functions here assume validated inputs (see torch_fp4.ops) and are
written for clarity and exactness, not speed.
"""
from .gemm import mm_fp4
from .moe import fused_moe, route
from .quantize import (compute_global_scale, fp4_dequantize, fp4_quantized_values, mxfp4_quantize,
                       nvfp4_quantize)

__all__ = ["compute_global_scale", "nvfp4_quantize", "mxfp4_quantize", "fp4_dequantize", "fp4_quantized_values",
           "mm_fp4", "route", "fused_moe"]
