"""Builds and loads the extension of torch_fp4/csrc with `torch.utils.cpp_extension.load` (ninja) on
first use, once per process and compute capability; the build is cached on disk in the default
torch extensions directory (TORCH_EXTENSIONS_DIR) and rebuilt only when a source changes."""
from __future__ import annotations

import functools
import os
import threading
from pathlib import Path

import torch

CSRC = Path(__file__).resolve().parents[2] / "csrc"
KERNEL_SOURCES = ("quantize.cu", "dequantize.cu", "global_scale.cu", "mm_small_m.cu", "mm_wgmma.cu")
SOURCES = ("binding.cpp", *KERNEL_SOURCES)

_lock = threading.Lock()


def arch_target(capability: tuple[int, int]) -> str:
    """nvcc target of a compute capability: the arch-specific 'a' target from sm_90 on ("90a",
    "100a", "103a", "120a"), the plain one before ("89")."""
    major, minor = capability
    return f"{major}{minor}{'a' if major >= 9 else ''}"


def gencode_flag(capability: tuple[int, int]) -> str:
    target = arch_target(capability)
    return f"-gencode=arch=compute_{target},code=sm_{target}"


@functools.cache
def _load(capability: tuple[int, int]):
    from torch.utils.cpp_extension import load

    return load(
        name=f"torch_fp4_cuda_sm{arch_target(capability)}",
        sources=[str(CSRC / name) for name in SOURCES],
        extra_include_paths=[str(CSRC)],
        extra_cflags=["-O3"],
        extra_cuda_cflags=["-O3", gencode_flag(capability)],
        verbose=os.environ.get("TORCH_FP4_BUILD_VERBOSE") == "1",
    )


def extension(device: torch.device):
    """The compiled module for `device` (built on first use)."""
    capability = torch.cuda.get_device_capability(device)
    with _lock:
        return _load(capability)
