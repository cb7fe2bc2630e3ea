"""CuTe DSL backend (`backend="cute-dsl"`): NVIDIA CuTe DSL kernels (package nvidia-cutlass-dsl)
with the reference backend's signatures, bit-identical to it.

Importing this package is cheap: cutlass is imported only when a launcher first runs.
Modules: ptx (single instructions), numerics (the contract's arithmetic on device),
quantize_block (the per-block step both quantize kernels share), quantize_vector /
quantize_tma (the two quantize kernels), dequantize, global_scale, launch (compile cache,
stream, variant choice and the op entry points). torch_fp4/bench/cute_variants.py measures the
crossover between the two quantize kernels.
"""
from __future__ import annotations

from typing import Optional

from ... import formats as F
from .._common import cuda_requirement

# Kernels index blocks, scale slots and 16-byte vectors with 32-bit integers (grid-stride
# steps included), so problems stay under 2^30 of them.
_INDEX_LIMIT = 2**30

OPS = {
    "compute_global_scale": "launch:compute_global_scale",
    "nvfp4_quantize": "launch:nvfp4_quantize",
    "mxfp4_quantize": "launch:mxfp4_quantize",
    "fp4_dequantize": "launch:fp4_dequantize",
}


def _index_count(op: str, args: tuple) -> int:
    """The largest 32-bit index the op's kernel forms for these arguments."""
    x = args[0]
    if op == "compute_global_scale":
        return x.numel() * x.element_size() // 16
    if op == "fp4_dequantize":
        return x.numel() * 2 // args[3].block_size
    block = 16 if op == "nvfp4_quantize" else 32
    batches = x.shape[0] if x.dim() == 3 else 1
    mp, kp = F.padded_scale_shape(x.shape[-2], x.shape[-1] // block, args[-1])
    return batches * mp * kp


def requirement(op: str, *args) -> Optional[str]:
    # The kernels use sm_90 instructions (max.u16x2, e4m3 conversions, TMA).
    reason = cuda_requirement(args, "cutlass", (9, 0))
    if reason is None and _index_count(op, args) >= _INDEX_LIMIT:
        reason = "the problem has 2^30 or more blocks or scale slots (32-bit indexing)"
    return reason
