"""CUDA C++ backend: kernels in torch_fp4/csrc, built with ninja on first use, plus launchers with
the reference backend's signatures.

Importing this package is cheap: nothing is compiled or loaded until an op runs on this backend.
"""
from __future__ import annotations

import functools
import os
import shutil
from typing import Optional

import torch

from ... import formats as F
from .._common import cuda_requirement

OPS = {
    "compute_global_scale": "quantize:compute_global_scale",
    "nvfp4_quantize": "quantize:nvfp4_quantize",
    "mxfp4_quantize": "quantize:mxfp4_quantize",
    "fp4_dequantize": "quantize:fp4_dequantize",
    "mm_fp4": "mm:mm_fp4",
}
# Tactic spaces (module:attribute, cheap to import: no toolchain) of the tunable ops.
TACTIC_SPACES = {"mm_fp4": "mm_tactics:MM_SPACE"}

# The kernels index one matrix (per batch entry) with 32-bit arithmetic: quantize has one thread
# per padded scale entry, dequantize one per 8 elements.
MAX_THREADS_PER_MATRIX = 2**31 - 1


@functools.cache
def toolchain_reason() -> Optional[str]:
    """None when this PyTorch can build the extension (CUDA build, nvcc, ninja), else why not."""
    if torch.version.cuda is None:
        return "needs a CUDA build of PyTorch"
    from torch.utils.cpp_extension import CUDA_HOME

    nvcc = os.path.join(CUDA_HOME, "bin", "nvcc") if CUDA_HOME else None
    if nvcc is None or not os.path.exists(nvcc):
        return "needs nvcc (set CUDA_HOME) to build its kernels"
    if shutil.which("ninja") is None:
        return "needs ninja on PATH to build its kernels"
    return None


def _scale_blocks(rows: int, k: int, block: int, layout: F.SfLayout) -> int:
    mp, kp = F.padded_scale_shape(rows, k // block, layout)
    return mp * kp


def _size_reason(op: str, args: tuple) -> Optional[str]:
    if op in ("nvfp4_quantize", "mxfp4_quantize"):
        x, layout = args[0], args[-1]
        block = 16 if op == "nvfp4_quantize" else 32
        threads = _scale_blocks(x.shape[-2], x.shape[-1], block, layout)
    elif op == "fp4_dequantize":
        data, fmt, layout = args[0], args[3], args[4]
        rows, k = data.shape[-2], data.shape[-1] * 2
        threads = max(rows * k // 8, _scale_blocks(rows, k, fmt.block_size, layout))
    else:
        return None
    if threads > MAX_THREADS_PER_MATRIX:
        return (f"one matrix needs {threads} threads, more than its 32-bit indexing allows "
                f"({MAX_THREADS_PER_MATRIX})")
    return None


# The small-M GEMM indexes its operands with 32-bit offsets.
MAX_MM_OPERAND = 2**31 - 1


def _mm_reason(args: tuple) -> Optional[str]:
    """Why the small-M GEMM (csrc/mm_small_m.cu) cannot run these mm_fp4 arguments, or None."""
    from .mm_tactics import MAX_M

    a, b, a_scale, b_scale, fmt = args[0], args[1], args[2], args[3], args[6]
    m, n, k = a.shape[0], b.shape[1], 2 * b.shape[0]
    if m > MAX_M:
        return f"the cuda mm_fp4 kernel is for M <= {MAX_M} (decode); larger M uses triton"
    if a_scale is None and a.dtype == torch.float16 and fmt is F.MXFP4:
        return ("fp16 activations with MXFP4 weights: the cuda mm_fp4 kernel multiplies in fp16 "
                "for fp16 activations, which cannot hold every MXFP4 value (triton handles them)")
    if n * (k // 2) > MAX_MM_OPERAND or m * k > MAX_MM_OPERAND:
        return f"operands beyond 2^31 elements (M={m}, N={n}, K={k}) need 64-bit offsets"
    if a_scale is None and a.data_ptr() % 16:
        return "the activations a must be 16-byte aligned"
    if b.data_ptr() % 8 or b_scale.data_ptr() % 4:
        return "b must be 8-byte and b_scale 4-byte aligned"
    return None


def requirement(op: str, *args) -> Optional[str]:
    if op == "mm_fp4":
        # Thread-block clusters (the split-K reduction) and griddepcontrol need sm_90+.
        reason = cuda_requirement(args, "torch.utils.cpp_extension", (9, 0))
        if reason is None:
            reason = toolchain_reason()
        return reason if reason is not None else _mm_reason(args)
    # fp32 -> e4m3 conversion instructions need sm_89+.
    reason = cuda_requirement(args, "torch.utils.cpp_extension", (8, 9))
    if reason is None:
        reason = toolchain_reason()
    if reason is None:
        reason = _size_reason(op, args)
    return reason
