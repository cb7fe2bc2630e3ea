"""CuTe DSL backend (`backend="cute-dsl"`): NVIDIA CuTe DSL kernels (package nvidia-cutlass-dsl)
with the reference backend's signatures, bit-identical to it.

Importing this package is cheap: cutlass is imported only when a launcher first runs.
Modules: ptx (single instructions), numerics (the contract's arithmetic on device),
quantize_block (the per-block step both quantize kernels share), quantize_vector /
quantize_tma (the two quantize kernels), dequantize, global_scale, launch (compile cache,
stream, variant choice and the op entry points); mm_blockscaled (mm_fp4); moe_blockscaled (the
grouped MoE GEMMs) and moe_fused (fused_moe, wiring them with Triton grouping, quantize and
finalize kernels). mm_fp4 and fused_moe are opt-in: torch_fp4.tuning.OP_ORDER never picks them
("auto" must not pick a backend that has not run; the tcgen05 kernels are compiled, never run).
torch_fp4/bench/cute_variants.py measures the crossover between the two quantize kernels.
"""
from __future__ import annotations

from typing import Optional

from ... import formats as F
from ...problems import MmProblem, MoeProblem, Problem
from .._common import cuda_requirement

# Kernels index blocks, scale slots and 16-byte vectors with 32-bit integers (grid-stride
# steps included), so problems stay under 2^30 of them.
_INDEX_LIMIT = 2**30

OPS = {
    "compute_global_scale": "launch:compute_global_scale",
    "nvfp4_quantize": "launch:nvfp4_quantize",
    "mxfp4_quantize": "launch:mxfp4_quantize",
    "fp4_dequantize": "launch:fp4_dequantize",
    "mm_fp4": "mm_blockscaled:mm_fp4",
    "fused_moe": "moe_fused:fused_moe",
}
# Tactic spaces (module:attribute, cheap to import: no cutlass) of the tunable ops.
TACTIC_SPACES = {"mm_fp4": "mm_tactics:MM_SPACE", "fused_moe": "moe_tactics:MOE_OP_SPACE"}
# mm_fp4 runs on native block-scaled MMA: tcgen05 (10.0, 10.3) and warp mma.sync (12.x).
_MM_CAPABILITIES = ((10, 0), (10, 3))
# fused_moe's grouped GEMMs run on tcgen05 only (moe_tactics: SM100 and SM103 tiles).
_MOE_CAPABILITIES = ((10, 0), (10, 3))


def _index_count(op: str, p: Problem) -> int:
    """The largest 32-bit index the op's kernel forms for this problem."""
    if op == "compute_global_scale":
        return p.numel * p.dtype.itemsize // 16
    if op == "fp4_dequantize":
        return (p.batch or 1) * p.rows * p.k // p.fmt.block_size
    mp, kp = F.padded_scale_shape(p.rows, p.k // p.fmt.block_size, p.sf_layout)
    return (p.batch or 1) * mp * kp


def _mm_requirement(p: MmProblem) -> Optional[str]:
    """mm_fp4's problem-level limits (the tactic space checks only each tactic's own)."""
    if not p.is_cuda:
        return f"needs CUDA tensors (got {p.device})"
    cap = p.capability
    if cap not in _MM_CAPABILITIES and cap[0] != 12:
        return (f"mm_fp4 needs compute capability 10.0, 10.3 or 12.x (block-scaled MMA); "
                f"device has {cap[0]}.{cap[1]}")
    if not p.w4a4:
        return "W4A4 only (a_scale is None: W4A16 is served by another backend)"
    if p.weight_layout is not F.WeightLayout.ROW:
        return "the cute-dsl GEMMs read row-major weights only ('sm90' weights: the cuda backend on sm_90)"
    if p.sf_layout is not F.SfLayout.LAYOUT_128x4:
        return f"the activation scales must use the 128x4 layout, got {p.sf_layout.value!r}"
    if p.k % 32:
        return f"K = {p.k} must be a multiple of 32 (TMA rows of 16 bytes)"
    if p.m == 0 or p.n == 0:
        return f"empty problem M={p.m} N={p.n} K={p.k}"
    if max(p.m, p.n) >= 2**31 or p.m * p.k // 2 >= 2**40:
        return "problem too large for 32-bit tile coordinates"
    return cuda_requirement(p, "cutlass", (10, 0))


def _moe_requirement(p: MoeProblem) -> Optional[str]:
    if not p.w4a4:
        return ("cute-dsl fused_moe needs W4A4 (a1_global_scale, or activations='fp4' with MXFP4 experts); "
                "W4A16 is served by the triton backend")
    if not p.is_cuda:
        return f"needs CUDA tensors (got {p.device})"
    cap = p.capability
    if cap not in _MOE_CAPABILITIES:
        return ("cute-dsl fused_moe needs compute capability 10.0 or 10.3 (tcgen05 block-scaled "
                f"MMA); device has {cap[0]}.{cap[1]}")
    for module in ("cutlass", "triton"):   # triton: grouping, quantize and finalize kernels
        reason = cuda_requirement(p, module, (10, 0))
        if reason is not None:
            return reason
    from .moe_fused import shape_reason    # imports triton (not cutlass)
    return shape_reason(p)


def requirement(op: str, p: Problem) -> Optional[str]:
    if op == "mm_fp4":
        return _mm_requirement(p)
    if op == "fused_moe":
        # MXFP4 experts alone run in W4A4 (MXFP4 activations, kind::mxf4); biases and the clamped
        # SwiGLU need epilogues the grouped GEMMs do not have
        if p.gpt_oss_features not in (None, "MXFP4 experts"):
            return f"the cute-dsl fused_moe kernels do not run {p.gpt_oss_features} yet (the reference backend does)"
        if p.packed:
            return "the cute-dsl grouped GEMMs read row-major experts only ('sm90' experts: the cuda backend on sm_90)"
        return _moe_requirement(p)
    # The kernels use sm_90 instructions (max.u16x2, e4m3 conversions, TMA).
    reason = cuda_requirement(p, "cutlass", (9, 0))
    if reason is None and _index_count(op, p) >= _INDEX_LIMIT:
        reason = "the problem has 2^30 or more blocks or scale slots (32-bit indexing)"
    return reason
