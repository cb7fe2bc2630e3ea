"""Triton backend: kernels plus launchers with the reference backend's signatures.

Importing this package is cheap (no triton import); launchers load on first use.
"""
from __future__ import annotations

from typing import Optional

from ... import formats as F
from ...problems import Problem
from .._common import cuda_requirement

OPS = {
    "compute_global_scale": "quantize:compute_global_scale",
    "nvfp4_quantize": "quantize:nvfp4_quantize",
    "mxfp4_quantize": "quantize:mxfp4_quantize",
    "fp4_dequantize": "quantize:fp4_dequantize",
    "fp4_quantized_values": "quantize:fp4_quantized_values",
    "mm_fp4": "mm:mm_fp4",
    "route": "moe_route:route",
    "fused_moe": "moe_fused:fused_moe",
}
TACTIC_SPACES = {"mm_fp4": "mm_tactics:MM_SPACE", "fused_moe": "moe_tactics:MOE_SPACE"}

# Experts per token the routing kernel holds in registers (moe_route.MAX_EXPERTS).
ROUTE_MAX_EXPERTS = 512


def requirement(op: str, p: Problem) -> Optional[str]:
    # fp32 -> e4m3 conversion instructions need sm_89+.
    if op == "fused_moe" and p.gpt_oss_features is not None and p.w4a4 and p.fmt is not F.MXFP4:
        # moe_gemm.GptOss: the W4A16 kernels only (FC1's NVFP4 W4A4 epilogue quantizes instead);
        # MXFP4 activations run as W4A16 on their exact values (moe_fused._mx_values)
        return (f"the triton fused_moe kernels run {p.gpt_oss_features} in W4A16, or in W4A4 with MXFP4 "
                "experts only (NVFP4 W4A4 with them: the reference and cuda backends)")
    reason = cuda_requirement(p, "triton", (8, 9))
    if reason is None and op in ("mm_fp4", "fused_moe") and p.weight_layout is not F.WeightLayout.ROW:
        return "the triton GEMMs read row-major weights only ('sm90' weights: the cuda backend on sm_90)"
    if reason is None and op == "route" and p.experts > ROUTE_MAX_EXPERTS:
        return f"the routing kernel handles at most {ROUTE_MAX_EXPERTS} experts (got {p.experts})"
    return reason
