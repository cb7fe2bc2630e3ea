"""Backend preference for backend="auto" (layer 2): a small table measured with
`python -m torch_fp4 bench quantize` (see BENCHMARKS.md), read with plain dict lookups so it
is safe during CUDA-graph capture and costs nothing on the hot path.

Keys: (op family, GPU architecture major, size band). Values: backends fastest first. Backends
missing from a row, or that cannot run the inputs, fall back to the default order.
"""
from __future__ import annotations

from .backends import Backend
from .problems import MmProblem, MoeProblem, Problem

DEFAULT_ORDER = (Backend.CUDA, Backend.CUTE_DSL, Backend.TRITON, Backend.REFERENCE)
_QUANTIZE_OPS = ("compute_global_scale", "nvfp4_quantize", "mxfp4_quantize", "fp4_dequantize",
                 "fp4_quantized_values")

# Size bands by element count of the op's first tensor argument (the problem's numel).
SMALL, MEDIUM, LARGE = 0, 1, 2
_BAND_EDGES = (1 << 20, 1 << 25)

# Measured on H100 (sm_90) with `python -m torch_fp4 bench quantize` (BENCHMARKS.md): on the GPU
# cute-dsl is fastest in 97 of 99 shapes, cuda within 1-5% of it (99% against 100% of copy for
# M*K >= 2^25, 2.35 against 2.21 us at 128x4096 in a graph), triton about 15% behind. cuda goes
# first: its launch costs about 100 us less host time per call than CuTe DSL's (`bench overhead`),
# and its kernels are built once and cached, where CuTe DSL compiles again in every process.
_HOPPER = (Backend.CUDA, Backend.CUTE_DSL, Backend.TRITON)
PREFERENCE: dict[tuple[str, int, int], tuple[Backend, ...]] = {
    ("quantize", 9, SMALL): _HOPPER,
    ("quantize", 9, MEDIUM): _HOPPER,
    ("quantize", 9, LARGE): _HOPPER,
}


def _band(numel: int) -> int:
    return SMALL if numel < _BAND_EDGES[0] else MEDIUM if numel < _BAND_EDGES[1] else LARGE


# mm_fp4: "auto" tries the cuda backend first up to M = CUDA_MM_MAX_M (the small-M GEMM,
# csrc/mm_small_m.cu; measured on H100: 2.6-3.0x bf16 at M <= 16 against Triton's 2.0-2.1x, but
# 0.85x at M = 64 where Triton reaches 1.6x) and, on sm_90, for HOPPER_MM_MS (the wgmma GEMM,
# csrc/mm_wgmma.cu, measured faster than Triton at every M from 32: BENCHMARKS.md). Then the
# Triton GEMM. The CuTe DSL Blackwell kernels are compiled and SASS-checked in CI but have never
# run on a GPU, so they are opt-in (backend="cute-dsl") rather than chosen silently. route and fused_moe: the Triton kernels on CUDA tensors (the
# cute-dsl fused_moe is opt-in, never run; fused_moe on sm_90: the cuda backend), the reference
# elsewhere.
CUDA_MM_MAX_M = 16
HOPPER_MM = (9, 0)            # where the cuda backend has the wgmma GEMM
HOPPER_MM_MS = (17, 1 << 62)  # M range where it beat Triton on H100 (every M above 16)
OP_ORDER: dict[str, tuple[Backend, ...]] = {
    "mm_fp4": (Backend.CUDA, Backend.TRITON, Backend.REFERENCE),
    "route": (Backend.TRITON, Backend.REFERENCE),
    "fused_moe": (Backend.TRITON, Backend.REFERENCE),
}


# fused_moe on sm_90: the cuda backend at every batch (kernels/cuda/moe.py: grouped small-M GEMMs
# below 16 routed rows per expert, grouped Hopper GEMMs from there), faster than the Triton kernels
# in every H100 `bench moe` row of W4A16 (us cuda / triton: Mixtral-8x7B T = 1 100 / 155, T = 16
# 309 / 482, T = 1024 1937 / 3601; Qwen3-30B-A3B T = 1 28.4 / 37.0, T = 64 163 / 228; DeepSeek-V3
# T = 16 914 / 1475, T = 256 2655 / 3681; BENCHMARKS.md; W4A4 on Qwen3 from T = 256 is the
# exception: 375 / 352 us).
_HOPPER_MOE = (Backend.CUDA, Backend.TRITON, Backend.REFERENCE)


def _hopper_moe(p: MoeProblem) -> bool:
    return p.is_cuda and p.capability == HOPPER_MM


def _hopper_wgmma(p: MmProblem) -> bool:
    lo, hi = HOPPER_MM_MS
    return lo <= p.m <= hi and p.is_cuda and p.capability == HOPPER_MM


def auto_order(op: str, p: Problem) -> tuple[Backend, ...]:
    """Backends to try for `op` on problem `p`, fastest first (the reference always last)."""
    if op == "mm_fp4" and p.m > CUDA_MM_MAX_M and not _hopper_wgmma(p):
        return tuple(b for b in OP_ORDER[op] if b != Backend.CUDA)
    if op == "fused_moe" and _hopper_moe(p):
        return _HOPPER_MOE
    if op in OP_ORDER:
        return OP_ORDER[op]
    if not p.is_cuda or op not in _QUANTIZE_OPS:
        return DEFAULT_ORDER
    preferred = PREFERENCE.get(("quantize", p.capability[0], _band(p.numel)), ())
    return preferred + tuple(b for b in DEFAULT_ORDER if b not in preferred)
