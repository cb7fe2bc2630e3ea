"""Builds and loads the extension of torch_fp4/csrc with `torch.utils.cpp_extension.load` (ninja) on
first use, once per process and compute capability; the build is cached on disk in the default
torch extensions directory (TORCH_EXTENSIONS_DIR) and rebuilt only when a source changes.

The build is parallel (ninja, MAX_JOBS workers) and its units are kept small, since the first call
of a fresh process waits for it: the binding includes only the torch headers it uses, and each
GEMM source is compiled once per kernel variant (csrc/mm_operands.h: `-DTORCH_FP4_PART=v` keeps
variant v's kernels, `-1` only the dispatch), through two-line wrapper sources written once into
`$TORCH_FP4_CACHE_DIR/csrc_parts`."""
from __future__ import annotations

import functools
import os
import threading
from pathlib import Path

import torch

from ...tactics import cache_dir

CSRC = Path(__file__).resolve().parents[2] / "csrc"
KERNEL_SOURCES = ("quantize.cu", "dequantize.cu", "global_scale.cu", "mm_small_m.cu", "mm_wgmma.cu")
SOURCES = ("binding.cpp", *KERNEL_SOURCES)
PARTED_SOURCES = ("mm_small_m.cu", "mm_wgmma.cu")   # compiled per kernel variant
MM_VARIANTS = 6                                       # kNumMmVariants in csrc/mm_operands.h

_lock = threading.Lock()


def arch_target(capability: tuple[int, int]) -> str:
    """nvcc target of a compute capability: the arch-specific 'a' target from sm_90 on ("90a",
    "100a", "103a", "120a"), the plain one before ("89")."""
    major, minor = capability
    return f"{major}{minor}{'a' if major >= 9 else ''}"


def gencode_flag(capability: tuple[int, int]) -> str:
    target = arch_target(capability)
    return f"-gencode=arch=compute_{target},code=sm_{target}"


def part_text(source: str, part: int) -> str:
    """The wrapper source compiling `part` of a parted source (-1: its dispatch)."""
    return (f"// Part {part} of torch_fp4/csrc/{source} for the extension build "
            f"(torch_fp4/kernels/cuda/build.py).\n#define TORCH_FP4_PART {part}\n#include \"{source}\"\n")


def part_sources(folder: Path) -> list[Path]:
    """Every translation unit of the build: the plain sources of csrc, and for each parted source
    its dispatch and one unit per kernel variant as wrapper files in `folder` (written only when
    missing or different, so their times, and ninja's view of them, stay put)."""
    units = [CSRC / name for name in SOURCES if name not in PARTED_SOURCES]
    folder.mkdir(parents=True, exist_ok=True)
    for source in PARTED_SOURCES:
        stem = source.removesuffix(".cu")
        for part in range(-1, MM_VARIANTS):
            path = folder / (f"{stem}.dispatch.cu" if part < 0 else f"{stem}.part{part}.cu")
            text = part_text(source, part)
            if not path.exists() or path.read_text() != text:
                tmp = path.with_suffix(f".tmp{os.getpid()}")
                tmp.write_text(text)
                os.replace(tmp, path)
            units.append(path)
    return units


@functools.cache
def _load(capability: tuple[int, int]):
    from torch.utils.cpp_extension import load

    return load(
        name=f"torch_fp4_cuda_sm{arch_target(capability)}",
        sources=[str(p) for p in part_sources(cache_dir() / "csrc_parts")],
        extra_include_paths=[str(CSRC)],
        extra_cflags=["-O3"],
        extra_cuda_cflags=["-O3", gencode_flag(capability)],
        verbose=os.environ.get("TORCH_FP4_BUILD_VERBOSE") == "1",
    )


_BY_DEVICE: dict[int, object] = {}


def extension(device: torch.device):
    """The compiled module for `device` (built on first use; afterwards one dict lookup)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    ext = _BY_DEVICE.get(index)
    if ext is None:
        capability = torch.cuda.get_device_capability(index)
        with _lock:
            ext = _BY_DEVICE[index] = _load(capability)
    return ext
