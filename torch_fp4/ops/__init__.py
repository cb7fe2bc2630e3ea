"""torch.library ops in the torch_fp4 namespace and their public Python functions (layer 3).

Importing this package registers torch.ops.torch_fp4.{compute_global_scale, nvfp4_quantize,
mxfp4_quantize, fp4_dequantize, fp4_quantized_values, mm_fp4, route, fused_moe, prepack_weight, unprepack_weight}.
"""
from .gemm import mm_fp4, mm_fp4_tactics
from .moe import ROUTING_METHODS, fused_moe, fused_moe_tactics, route, swap_gate_up
from .quantize import (compute_global_scale, expert_global_scales, fp4_dequantize, fp4_quantized_values,
                       mxfp4_quantize, nvfp4_quantize)
from .weight_layout import preferred_weight_layout, prepack_weight, unprepack_weight
from ._registry import register_backend_package, supported_backends, unsupported_reason
from ..backends import Backend

for _backend, _package in ((Backend.TRITON, "torch_fp4.kernels.triton"),
                           (Backend.CUTE_DSL, "torch_fp4.kernels.cute"),
                           (Backend.CUDA, "torch_fp4.kernels.cuda")):
    register_backend_package(_backend, _package)

__all__ = ["compute_global_scale", "expert_global_scales", "nvfp4_quantize", "mxfp4_quantize", "fp4_dequantize", "fp4_quantized_values", "mm_fp4",
           "mm_fp4_tactics", "prepack_weight", "unprepack_weight", "preferred_weight_layout", "route", "fused_moe", "fused_moe_tactics", "swap_gate_up", "ROUTING_METHODS", "supported_backends",
           "unsupported_reason"]
