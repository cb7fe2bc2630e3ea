"""The Hopper wgmma GEMM (torch_fp4/csrc/mm_wgmma.cu) compiles for sm_90a without a GPU, with
HGMMA reading both operands from shared memory (the decoded weight tile and the TMA activation
tile), for every wgmma N and both 16-bit types, no register spills, and no ptxas serialization of
the wgmmas (warning C7513). It compiles to a stub for sm_100a (wgmma is Hopper-only). Skipped
without nvcc or a disassembler."""
import re
import subprocess

import pytest

from sass_tools import disassemble, have_disassembler
from test_cuda_sources_compile import NVCC
from torch_fp4.kernels.cuda import build


def _compile(tmp_path, cap):
    if NVCC is None:
        pytest.skip("nvcc not found (PATH, CUDA_HOME or /usr/local/cuda)")
    from torch.utils.cpp_extension import COMMON_NVCC_FLAGS

    out = tmp_path / f"mm_wgmma_{build.arch_target(cap)}.cubin"
    cmd = [NVCC, "-cubin", "-O3", *COMMON_NVCC_FLAGS, build.gencode_flag(cap), "-Xptxas", "-v",
           "-o", str(out), str(build.CSRC / "mm_wgmma.cu")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out.read_bytes(), proc.stderr


def test_sm90a_shared_memory_hgmma_no_spills_no_serialization(tmp_path):
    if not have_disassembler():
        pytest.skip("no nvdisasm / cuobjdump")
    cubin, log = _compile(tmp_path, (9, 0))
    assert "C7513" not in log, "ptxas serialized the wgmmas"
    assert re.findall(r"(\d+) bytes spill stores", log) and all(
        v == "0" for v in re.findall(r"(\d+) bytes spill stores", log)), log
    sass = disassemble(cubin)
    # fp16 inputs print without a type suffix (HGMMA.64xNx16.F32), bf16 as .F32.BF16.
    hgmma = re.findall(r"HGMMA\.64x(\d+)x16\.F32(\.BF16)? R\d+, (\S+), ", sass)
    assert {(n, t) for n, t, _ in hgmma} == {(n, t) for n in ("64", "128", "256") for t in (".BF16", "")}
    assert all(a.startswith("gdesc[") for _, _, a in hgmma), "A operand must come from shared memory"
    assert "UTMALDG" in sass and "UBLKCP" in sass   # TMA tiles and the bulk scale copy


def test_sm100a_compiles_to_a_stub(tmp_path):
    cubin, _ = _compile(tmp_path, (10, 0))
    if have_disassembler():
        assert "HGMMA" not in disassemble(cubin)
