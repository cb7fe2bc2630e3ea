"""torch_fp4: NVFP4 and MXFP4 as first-class PyTorch ops.

Quantize, dequantize, FP4 GEMM (W4A4 and W4A16), routing and FP4 fused MoE, each a
torch.library op in the torch_fp4 namespace (torch.ops.torch_fp4.*) with a fake implementation,
so torch.compile(fullgraph=True) traces them and CUDA graphs capture them. The numerics follow
the contract in docs/NUMERICS.md; the reference backend is its executable form.
"""
from . import formats
from .backends import Backend
from .formats import MXFP4, NVFP4, Fp4Format, SfLayout, WeightLayout, nvfp4_alpha
from .ops import (ROUTING_METHODS, compute_global_scale, expert_global_scales, fp4_dequantize,
                  fp4_quantized_values, fused_moe, fused_moe_tactics, mm_fp4,
                  mm_fp4_tactics, mxfp4_quantize, nvfp4_quantize, preferred_weight_layout,
                  prepack_weight, route, supported_backends, swap_gate_up, unprepack_weight,
                  unsupported_reason)
from . import checkpoint, nn
from .tactics import Tactic, autotune, use_tactic
from .nn import FP4Linear, FP4MoE, QuantConfig, from_pretrained, quantize_model, save_pretrained

__version__ = "0.1.0"


def set_pdl(enabled: bool = True) -> None:
    """Launch GPU kernels with programmatic dependent launch (sm_90+): a kernel may start while the
    previous kernel on its stream finishes, hiding launch latency between back-to-back ops. Each
    kernel waits for the previous kernel's memory before reading any. Off by default."""
    from .kernels import _common
    _common.PDL = bool(enabled)

__all__ = ["formats", "Backend", "Fp4Format", "NVFP4", "MXFP4", "SfLayout", "WeightLayout", "nvfp4_alpha",
           "compute_global_scale", "expert_global_scales", "nvfp4_quantize", "mxfp4_quantize", "fp4_dequantize", "fp4_quantized_values", "mm_fp4",
           "mm_fp4_tactics", "prepack_weight", "unprepack_weight", "preferred_weight_layout", "Tactic", "autotune", "use_tactic", "route", "fused_moe", "fused_moe_tactics", "swap_gate_up", "ROUTING_METHODS",
           "supported_backends", "unsupported_reason", "set_pdl", "checkpoint", "nn", "FP4Linear", "FP4MoE", "QuantConfig", "quantize_model",
           "from_pretrained", "save_pretrained",
           "__version__"]
