"""torch_fp4: NVFP4 and MXFP4 as first-class PyTorch ops.

Quantize, dequantize, FP4 GEMM (W4A4 and W4A16), routing and FP4 fused MoE, each a
torch.library op in the torch_fp4 namespace (torch.ops.torch_fp4.*) with a fake implementation,
so torch.compile(fullgraph=True) traces them and CUDA graphs capture them. The numerics follow
the contract in docs/NUMERICS.md; the reference backend is its executable form.
"""
from . import formats
from .backends import Backend
from .formats import MXFP4, NVFP4, Fp4Format, SfLayout, nvfp4_alpha
from .ops import (ROUTING_METHODS, compute_global_scale, fp4_dequantize, fused_moe, mm_fp4,
                  mxfp4_quantize, nvfp4_quantize, route, supported_backends, swap_gate_up,
                  unsupported_reason)

__version__ = "0.1.0"

__all__ = ["formats", "Backend", "Fp4Format", "NVFP4", "MXFP4", "SfLayout", "nvfp4_alpha",
           "compute_global_scale", "nvfp4_quantize", "mxfp4_quantize", "fp4_dequantize", "mm_fp4",
           "route", "fused_moe", "swap_gate_up", "ROUTING_METHODS", "supported_backends",
           "unsupported_reason", "__version__"]
