"""The cuda backend's kernel sources compile for Hopper and Blackwell without a GPU.

Each kernel .cu in torch_fp4/csrc (raw pointers, no torch headers) is compiled by nvcc to a cubin
for sm_90a and sm_100a with the flags of the library build (build.nvcc_flags), keeping the PTX. The hardware E2M1
conversion must appear in the sm_100a PTX and nowhere in the sm_90a PTX, and no approximate
reciprocal/division or flush-to-zero may appear anywhere (the numerics contract needs RN).
Every kernel must execute griddepcontrol.wait (programmatic dependent launch, sm_90+).
Skipped when nvcc is not found.
"""
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from torch_fp4.kernels.cuda import build

E2M1_CVT = "cvt.rn.satfinite.e2m1x2.f32"
ARCHES = ((9, 0), (10, 0))


def _nvcc():
    found = shutil.which("nvcc")
    if found is None:
        home = os.environ.get("CUDA_HOME") or "/usr/local/cuda"
        candidate = os.path.join(home, "bin", "nvcc")
        found = candidate if os.path.exists(candidate) else None
    return found


NVCC = _nvcc()


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """{(source, arch target): PTX text}, every source compiled for every arch in parallel."""
    if NVCC is None:
        pytest.skip("nvcc not found (PATH, CUDA_HOME or /usr/local/cuda)")

    root = tmp_path_factory.mktemp("cuda_build")
    jobs = [(src, cap) for cap in ARCHES for src in build.KERNEL_SOURCES]

    def compile_one(job):
        src, cap = job
        target = build.arch_target(cap)
        keep = root / f"{Path(src).stem}_{target}"
        keep.mkdir()
        cmd = [NVCC, "-cubin", *build.nvcc_flags(NVCC), build.gencode_flag(cap), "--keep",
               "--keep-dir", str(keep), "-o", str(keep / "out.cubin"), str(build.CSRC / src)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"nvcc failed for {src} sm_{target}:\n{proc.stderr[-4000:]}"
        ptx = list(keep.glob("*.ptx"))
        assert len(ptx) == 1, (src, target, ptx)
        return (src, target), ptx[0].read_text()

    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        return dict(pool.map(compile_one, jobs))


def test_arch_targets():
    assert build.arch_target((8, 9)) == "89"
    assert build.arch_target((9, 0)) == "90a"
    assert build.arch_target((10, 0)) == "100a"
    assert build.arch_target((10, 3)) == "103a"
    assert build.arch_target((12, 0)) == "120a"
    assert build.gencode_flag((9, 0)) == "-gencode=arch=compute_90a,code=sm_90a"


def test_every_kernel_source_compiles(compiled):
    assert sorted(compiled) == sorted((s, build.arch_target(c)) for c in ARCHES for s in build.KERNEL_SOURCES)


def test_hardware_e2m1_conversion_only_on_sm100(compiled):
    assert E2M1_CVT in compiled[("quantize.cu", "100a")]
    for (src, target), ptx in compiled.items():
        if target == "90a":
            assert E2M1_CVT not in ptx, src


def test_only_correctly_rounded_arithmetic(compiled):
    for (src, target), ptx in compiled.items():
        if src in ("moe_small_m.cu", "moe_swiglu.cu"):
            # the SwiGLU's expf (CUDA's, as PyTorch's exp and libdevice's __nv_expf): its range
            # reduction ends in ex2.approx.ftz, the only approximate instruction allowed
            assert "ex2.approx.ftz.f32" in ptx
            ptx = ptx.replace("ex2.approx.ftz.f32", "")
        for bad in ("rcp.approx", "div.approx", "div.full", ".ftz"):
            assert bad not in ptx, (src, target, bad)
        if src == "quantize.cu":
            assert "rcp.rn.f32" in ptx
        if src == "global_scale.cu":
            assert "div.rn.f32" in ptx


def test_every_kernel_waits_for_the_previous_grid_on_sm90(compiled):
    """Programmatic dependent launch: every kernel entry of the sm_90a (and sm_100a) PTX executes
    griddepcontrol.wait (before its first global-memory access, see torch_fp4/csrc/pdl.cuh)."""
    for (src, target), ptx in compiled.items():
        assert "griddepcontrol.wait" in ptx, (src, target)
        entries = ptx.count(".entry ")
        assert entries > 0, (src, target)
        # One wait per kernel entry (each is a separate PTX function; the wait is inlined once).
        assert ptx.count("griddepcontrol.wait") >= entries, (src, target)
