"""Builds the cuda backend's kernel libraries from torch_fp4/csrc, each when a call first needs it.

A library is a shared object built by nvcc alone (no torch headers, no torch C++ ABI): "core"
(quantize, dequantize, global scale); per GEMM source, kernel variant and kernel group one
("small_m1_0", "wgmma4_1": csrc/mm_operands.h's variant index, the source compiled with
-DTORCH_FP4_PARTS=1<<index, then the group by the M it serves, -DTORCH_FP4_GROUP: small_m_library,
wgmma_library); and fused_moe's decode path per variant and group of block_m (moe_decode_library;
with fp16 activations it holds two variants: fp16 FC1, bf16 FC2). So the first call of a fresh process waits only for the units it uses, compiled in parallel, each
unit's kernels optimized on several threads (nvcc_flags). A library links its own static CUDA
runtime with its symbols kept inside (-Bsymbolic, no exported runtime), exports only its C entry
points (csrc/capi.h; called through native.py), and is cached under
`$TORCH_FP4_CACHE_DIR/cuda/sm<arch>-<hash>/`, the hash covering every csrc source, the flags and
the compiler, so an edit or another nvcc builds afresh. A file lock per library keeps concurrent
processes from building it twice.
"""
from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

from ...tactics import cache_dir

CSRC = Path(__file__).resolve().parents[2] / "csrc"
KERNEL_SOURCES = ("quantize.cu", "dequantize.cu", "global_scale.cu", "moe_swiglu.cu", "mm_small_m.cu", "mm_wgmma.cu",
                  "moe_small_m.cu")
MM_VARIANTS = 6                                       # kNumMmVariants in csrc/mm_operands.h
FP16_VARIANTS = (2, 3)                                # fp16 activations (mm_variant); bf16 is 2 less

# Every unit: IEEE fp32 (no fast math), the half/bfloat16 operator macros that keep conversions
# explicit, position-independent code whose symbols stay hidden but for the C entry points.
NVCC_FLAGS = ("-O3", "-std=c++17", "--expt-relaxed-constexpr", "-D__CUDA_NO_HALF_OPERATORS__",
              "-D__CUDA_NO_HALF_CONVERSIONS__", "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
              "-D__CUDA_NO_HALF2_OPERATORS__", "-Xcompiler", "-fPIC,-fvisibility=hidden")
LINK_FLAGS = ("-shared", "-Xlinker", "-Bsymbolic,--exclude-libs,ALL")
# nvcc >= 12.1 optimizes a unit's kernels on this many threads (--split-compile): a fixed count,
# so every machine builds the same code; 0 turns it off. On a fresh H200 machine (16 cores) it cut
# the first build of the small-M GEMM's library from 10.6 to 6.8 s, the Hopper GEMM's from 10.7 to
# 7.1 s and fused_moe's decode path's from 19.0 to 11.4 s, with the same kernel times
# (BENCHMARKS.md, cold start).
SPLIT_COMPILE = 8


@dataclass(frozen=True)
class Unit:
    """One translation unit: a csrc source, or the kernel variants `parts` of a GEMM source, of
    kernel group `group` only where one is given (csrc/mm_operands.h, group_compiled)."""
    source: str
    parts: tuple[int, ...] = ()
    group: Optional[int] = None

    @property
    def stem(self) -> str:
        base = self.source.removesuffix(".cu")
        base = base if not self.parts else f"{base}.part{'_'.join(map(str, self.parts))}"
        return base if self.group is None else f"{base}.group{self.group}"

    def defines(self) -> tuple[str, ...]:
        parts = () if not self.parts else (f"-DTORCH_FP4_PARTS={sum(1 << v for v in set(self.parts))}",)
        return parts + (() if self.group is None else (f"-DTORCH_FP4_GROUP={self.group}",))


# Kernel groups (csrc/mm_operands.h, group_compiled) by the M a call serves, so that its first call
# builds only those kernels: the small-M GEMM's group 0 holds M <= 8 (GROUP0_MAX; one
# 8-row block; 5 of its 12 kernels), the Hopper GEMM's group 0 block_m <= 64
# (6 of 18). On one H200 machine (scripts/ab_build_time.py) the small-M GEMM's group 0 built in
# 6.1 s against 7.1-8.1 s for the whole library, the Hopper GEMM's groups in 5.7-6.2 and 10.3-10.9
# s against 13.0-13.2 s; every library at once in 38.2 s against 35.8 s.
# Per library family, the largest size group 0 serves: the small-M GEMM's M, the Hopper GEMM's
# block_m, fused_moe's decode-path block_m (blocks of 8 routed rows: T up to about 4).
GROUP0_MAX = {"small_m": 8, "wgmma": 64, "moe_small_m": 8}


def _grouped(base: str, variant: int, group: int) -> str:
    return f"{base}{variant}_{group}"


def _library(base: str, variant: int, size: int) -> str:
    return _grouped(base, variant, 0 if size <= GROUP0_MAX[base] else 1)


def small_m_library(variant: int, m: int) -> str:
    """The library of the small-M GEMM's kernels of this variant for M rows."""
    return _library("small_m", variant, m)


def wgmma_library(variant: int, block_m: int) -> str:
    """The library of the Hopper GEMM's kernels of this variant at this block_m."""
    return _library("wgmma", variant, block_m)


def moe_decode_library(variant: int, block_m: int) -> str:
    """The library of fused_moe's decode path for FC1's variant at this block_m."""
    return _library("moe_small_m", variant, block_m)


LIBRARIES: dict[str, tuple[Unit, ...]] = {
    "core": (Unit("quantize.cu"), Unit("dequantize.cu"), Unit("global_scale.cu"), Unit("moe_swiglu.cu")),
    **{_grouped(base, v, g): (Unit(f"mm_{base}.cu", (v,), g),)
       for base in ("small_m", "wgmma") for v in range(MM_VARIANTS) for g in (0, 1)},
    # fused_moe's decode path by FC1's activations: bf16, or fp16 (its FC2 reads the bf16
    # intermediate: both variants), NVFP4 or MXFP4 experts, row-major or "sm90" (odd variants),
    # and kernel group (moe_decode_library)
    **{_grouped("moe_small_m", v, g): (Unit("moe_small_m.cu", (v, v - 2) if v in FP16_VARIANTS else (v,), g),)
       for v in range(MM_VARIANTS) for g in (0, 1)},
}


def mm_variant(fp16: bool, mx: bool, packed: bool) -> int:
    """csrc/mm_operands.h's variant index: (fp16 activations ? 2 : MXFP4 ? 4 : 0) + "sm90" weights."""
    return (2 if fp16 else 4 if mx else 0) + int(packed)


def arch_target(capability: tuple[int, int]) -> str:
    """nvcc target of a compute capability: the arch-specific 'a' target from sm_90 on ("90a",
    "100a", "103a", "120a"), the plain one before ("89")."""
    major, minor = capability
    return f"{major}{minor}{'a' if major >= 9 else ''}"


def gencode_flag(capability: tuple[int, int]) -> str:
    target = arch_target(capability)
    return f"-gencode=arch=compute_{target},code=sm_{target}"


@functools.cache
def nvcc() -> Optional[str]:
    """The nvcc that builds the libraries: $CUDA_HOME/bin/nvcc (or $CUDA_PATH), else nvcc on PATH,
    else /usr/local/cuda/bin/nvcc; None when there is none."""
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")):
        if home and os.path.exists(os.path.join(home, "bin", "nvcc")):
            return os.path.join(home, "bin", "nvcc")
    found = shutil.which("nvcc")
    if found is None and os.path.exists("/usr/local/cuda/bin/nvcc"):
        found = "/usr/local/cuda/bin/nvcc"
    return found


@functools.cache
def nvcc_version(compiler: Optional[str] = None) -> tuple[int, int]:
    """The release (major, minor) of `compiler` (default: nvcc()), (0, 0) when unknown."""
    try:
        text = subprocess.run([compiler or nvcc() or "nvcc", "--version"], capture_output=True, text=True,
                              timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return (0, 0)
    found = re.search(r"release (\d+)\.(\d+)", text)
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


def nvcc_flags(compiler: Optional[str] = None) -> tuple[str, ...]:
    """The flags of every unit: NVCC_FLAGS, plus --split-compile=SPLIT_COMPILE where `compiler`
    (default: nvcc()) has it."""
    split = SPLIT_COMPILE > 0 and nvcc_version(compiler) >= (12, 1)
    return (*NVCC_FLAGS, *((f"--split-compile={SPLIT_COMPILE}",) if split else ()))


def compile_command(unit: Unit, capability: tuple[int, int], obj: Path) -> list[str]:
    return [nvcc() or "nvcc", "-c", *nvcc_flags(), gencode_flag(capability), f"-I{CSRC}", *unit.defines(),
            str(CSRC / unit.source), "-o", str(obj)]


@functools.cache
def build_dir(capability: tuple[int, int]) -> Path:
    """The cache folder of this architecture's libraries: named by a hash of every csrc source,
    the flags and the compiler's path."""
    h = hashlib.sha256()
    for path in sorted(CSRC.iterdir()):
        if path.suffix in (".cu", ".cuh", ".h"):
            h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    # SPLIT_COMPILE, not nvcc_flags(): a cached library is found without running nvcc --version
    flags = (*NVCC_FLAGS, f"split-compile={SPLIT_COMPILE}", *LINK_FLAGS, gencode_flag(capability), str(nvcc()))
    h.update(" ".join(flags).encode())
    return cache_dir() / "cuda" / f"sm{arch_target(capability)}-{h.hexdigest()[:16]}"


def library_path(capability: tuple[int, int], name: str) -> Path:
    return build_dir(capability) / f"libtorch_fp4_{name}.so"


def _run(cmd: list[str]) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"torch_fp4: building the cuda kernels failed ({' '.join(cmd)}):\n"
                           f"{(done.stderr or done.stdout)[-4000:]}")


def _workers() -> int:
    return max(1, int(os.environ.get("MAX_JOBS") or os.cpu_count() or 1))


def build(capability: tuple[int, int], names: Iterable[str], progress=sys.stderr) -> dict[str, Path]:
    """Builds the libraries `names` that are not cached yet (all their units at once, in
    parallel) and returns every one's path. One line on `progress` per build."""
    names = list(dict.fromkeys(names))
    unknown = [n for n in names if n not in LIBRARIES]
    if unknown:
        raise ValueError(f"unknown kernel libraries {unknown}; known: {sorted(LIBRARIES)}")
    paths = {n: library_path(capability, n) for n in names}
    missing = [n for n in names if not paths[n].exists()]
    if not missing:
        return paths
    if nvcc() is None:
        raise RuntimeError("torch_fp4: the cuda backend needs nvcc (set CUDA_HOME) to build its kernels")
    folder = build_dir(capability)
    folder.mkdir(parents=True, exist_ok=True)
    locks = []
    try:
        for name in missing:  # sorted order (dict order of LIBRARIES): no two processes deadlock
            lock = open(folder / f"{name}.lock", "w")
            fcntl.flock(lock, fcntl.LOCK_EX)
            locks.append(lock)
        todo = [n for n in missing if not paths[n].exists()]   # another process may have built them
        if not todo:
            return paths
        start = time.perf_counter()
        if progress is not None:
            print(f"torch_fp4: compiling the cuda kernels {', '.join(todo)} for sm_{arch_target(capability)} "
                  f"(first use; cached in {folder}) ...", file=progress, flush=True)
        tag = f".tmp{os.getpid()}"
        units = {u for n in todo for u in LIBRARIES[n]}
        objs = {u: folder / f"{u.stem}{tag}.o" for u in units}
        with ThreadPoolExecutor(_workers()) as pool:
            list(pool.map(lambda u: _run(compile_command(u, capability, objs[u])), sorted(units, key=str)))
            def link(name: str) -> None:
                tmp = paths[name].with_suffix(tag)
                _run([nvcc(), *LINK_FLAGS, gencode_flag(capability), *(str(objs[u]) for u in LIBRARIES[name]),
                      "-o", str(tmp)])
                os.replace(tmp, paths[name])
            list(pool.map(link, todo))
        for obj in objs.values():
            obj.unlink(missing_ok=True)
        if progress is not None:
            print(f"torch_fp4: compiled {', '.join(todo)} in {time.perf_counter() - start:.1f} s",
                  file=progress, flush=True)
        return paths
    finally:
        for lock in locks:
            lock.close()
