"""CUDA C++ backend: kernels in torch_fp4/csrc, built by nvcc into small libraries when a call
first needs one (build.py) and called through their C entry points (native.py), plus launchers
with the reference backend's signatures.

Importing this package is cheap: nothing is compiled or loaded until an op runs on this backend.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch

from ... import formats as F
from ...problems import MmProblem, Problem
from .._common import cuda_requirement

OPS = {
    "compute_global_scale": "quantize:compute_global_scale",
    "nvfp4_quantize": "quantize:nvfp4_quantize",
    "mxfp4_quantize": "quantize:mxfp4_quantize",
    "fp4_dequantize": "quantize:fp4_dequantize",
    "fp4_quantized_values": "quantize:fp4_quantized_values",
    "mm_fp4": "mm:mm_fp4",
    "fused_moe": "moe:fused_moe",
}
# Tactic spaces (module:attribute, cheap to import: no toolchain) of the tunable ops.
TACTIC_SPACES = {"mm_fp4": "mm_space:MM_SPACE", "fused_moe": "moe_tactics:MOE_SPACE"}

# The kernels index one matrix (per batch entry) with 32-bit arithmetic: quantize has one thread
# per padded scale entry, dequantize one per 8 elements.
MAX_THREADS_PER_MATRIX = 2**31 - 1


@functools.cache
def toolchain_reason() -> Optional[str]:
    """None when the kernels can be built here (a CUDA build of PyTorch and nvcc), else why not."""
    if torch.version.cuda is None:
        return "needs a CUDA build of PyTorch"
    from .build import nvcc

    if nvcc() is None:
        return "needs nvcc (set CUDA_HOME) to build its kernels"
    return None


def _scale_blocks(rows: int, k: int, block: int, layout: F.SfLayout) -> int:
    mp, kp = F.padded_scale_shape(rows, k // block, layout)
    return mp * kp


def _size_reason(op: str, p: Problem) -> Optional[str]:
    if op in ("nvfp4_quantize", "mxfp4_quantize"):
        threads = _scale_blocks(p.rows, p.k, p.fmt.block_size, p.sf_layout)
    elif op == "fp4_quantized_values":   # one thread per block of one matrix
        threads = p.rows * (p.k // p.fmt.block_size)
    elif op == "fp4_dequantize":
        threads = max(p.rows * p.k // 8, _scale_blocks(p.rows, p.k, p.fmt.block_size, p.sf_layout))
    else:
        return None
    if threads > MAX_THREADS_PER_MATRIX:
        return (f"one matrix needs {threads} threads, more than its 32-bit indexing allows "
                f"({MAX_THREADS_PER_MATRIX})")
    return None


def _mm_reason(p: MmProblem) -> Optional[str]:
    """Why neither cuda GEMM (csrc/mm_small_m.cu for M <= 64, csrc/mm_wgmma.cu on sm_90) can run
    this mm_fp4 problem, or None."""
    from .mm_space import small_m_reason
    from .mm_wgmma_tactics import problem_reason

    small = small_m_reason(p)
    if small is None:
        return None
    hopper = problem_reason(p)
    return None if hopper is None else f"{small}; {hopper}"


def _moe_reason(p: Problem) -> Optional[str]:
    """Why the grouped GEMMs (kernels/cuda/moe.py: small-M at decode sizes, the Hopper GEMM from
    there) cannot run this fused_moe problem, or None: the heuristic's tactic must run it."""
    from .moe_tactics import default, why_not

    return why_not(default(p), p)


def requirement(op: str, p: Problem) -> Optional[str]:
    if op == "fused_moe":
        # The grouping, SwiGLU and finalize around the GEMMs are Triton kernels.
        reason = cuda_requirement(p, "triton", (9, 0))
        if reason is None:
            reason = toolchain_reason()
        return reason if reason is not None else _moe_reason(p)
    if op == "mm_fp4":
        # Thread-block clusters (the split-K reduction) and griddepcontrol need sm_90+.
        reason = cuda_requirement(p, "torch.utils.cpp_extension", (9, 0))
        if reason is None:
            reason = toolchain_reason()
        return reason if reason is not None else _mm_reason(p)
    # fp32 -> e4m3 conversion instructions need sm_89+.
    reason = cuda_requirement(p, "torch.utils.cpp_extension", (8, 9))
    if reason is None:
        reason = toolchain_reason()
    if reason is None:
        reason = _size_reason(op, p)
    return reason
