"""The small-M FP4 GEMM (torch_fp4/csrc/mm_small_m.cu) compiled for sm_90a without a GPU: no
register spills; every kernel for "sm90"-layout weights reads its activations with ldmatrix
(LDSM) and no other kernel does; with "sm90" weights the kernels the heuristic picks at M <= 8 and
M <= 16 are at least 8% shorter in SASS. Skipped without nvcc or cuobjdump."""
import re
import subprocess

import pytest
import torch

import sass_tools
from test_cuda_sources_compile import NVCC
from torch_fp4 import formats as F
from torch_fp4.kernels.cuda import build
from torch_fp4.kernels.cuda import mm_tactics as MT
from torch_fp4.problems import MmProblem


@pytest.fixture(scope="module")
def sass(tmp_path_factory):
    cuobjdump = sass_tools._tool("cuobjdump")
    if NVCC is None or cuobjdump is None:
        pytest.skip("nvcc or cuobjdump not found")

    out = tmp_path_factory.mktemp("small_m_sass") / "mm_small_m.cubin"
    cmd = [NVCC, "-cubin", *build.nvcc_flags(NVCC), build.gencode_flag((9, 0)), "-Xptxas", "-v",
           "-o", str(out), str(build.CSRC / "mm_small_m.cu")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    spills = re.findall(r"(\d+) bytes spill stores", proc.stderr)
    assert spills and set(spills) == {"0"}, proc.stderr[-2000:]
    text = subprocess.run([cuobjdump, "-sass", str(out)], check=True, capture_output=True, text=True).stdout
    kernels = {}
    for func in re.split(r"\n\s*Function : ", text)[1:]:
        cfg = re.search(r"ConfigILi(\d+)ELi(\d+)ELi(\d+)ELi(\d+)ELb(\d)ELb(\d)ELb(\d)E", func.split("\n")[0])
        if cfg is not None:   # (nb, warps, tiles, block_k, fp16, mx, packed) -> instructions
            kernels[tuple(int(v) for v in cfg.groups())] = re.findall(r"/\*[0-9a-f]{4,}\*/\s*([^\n;]*);", func)
    return kernels


def test_sm90_kernels_read_activations_by_ldmatrix(sass):
    packed = {k[:6] for k in sass if k[6]}
    assert packed == {k[:6] for k in sass if not k[6] and MT.packed_compiled(k[0], k[1], k[2])}
    assert {k[0] for k in packed} == {1, 2, 4}
    for key, ins in sass.items():
        assert any(i.startswith("LDSM") for i in ins) == bool(key[6]), key


@pytest.mark.parametrize("m", [8, 16])
def test_sm90_weights_shorten_the_heuristic_kernels(sass, m):
    t = MT.default(_args(m))
    nb = MT.n_blocks(m)
    row = len(sass[(nb, t.warps, t.tiles_per_warp, t.block_k, 0, 0, 0)])
    sm90 = len(sass[(nb, t.warps, t.tiles_per_warp, t.block_k, 0, 0, 1)])
    assert sm90 <= 0.92 * row, (t.label(), row, sm90)


def _args(m):
    a = torch.empty(m, 28672, dtype=torch.bfloat16)
    b = torch.empty(8192, 14336, dtype=torch.uint8).T
    return MmProblem.of(a, b, None, torch.empty(1, dtype=torch.uint8), None, torch.bfloat16, F.NVFP4,
                        F.SfLayout.LAYOUT_128x4, F.WeightLayout.SM90)
