"""The extension build compiles each GEMM source once per kernel variant (torch_fp4/kernels/cuda/build.py,
csrc/mm_operands.h), so that a parallel build's longest unit is short: the wrapper sources, the
variant count shared by Python and C++, and (with nvcc and nm) that the dispatch unit of each GEMM
holds no kernel and calls every variant, which exactly one part defines."""
import re
import shutil
import subprocess

import pytest

from test_cuda_sources_compile import NVCC
from torch_fp4.kernels.cuda import build


def test_variant_count_matches_the_csrc_table():
    text = (build.CSRC / "mm_operands.h").read_text()
    table = re.search(r"kMmVariants\[\] = \{(.*?)\};", text, re.S).group(1)
    assert len(re.findall(r"\{(?:true|false), (?:true|false), (?:true|false)\}", table)) == build.MM_VARIANTS


def test_part_sources_are_written_once(tmp_path):
    units = build.part_sources(tmp_path)
    plain = [u for u in units if u.parent == build.CSRC]
    parts = [u for u in units if u.parent == tmp_path]
    assert sorted(u.name for u in plain) == sorted(s for s in build.SOURCES if s not in build.PARTED_SOURCES)
    assert len(parts) == len(build.PARTED_SOURCES) * (build.MM_VARIANTS + 1)
    assert len({u.name for u in units}) == len(units)      # object files are named after the unit
    for source in build.PARTED_SOURCES:
        stem = source.removesuffix(".cu")
        text = (tmp_path / f"{stem}.part3.cu").read_text()
        assert "#define TORCH_FP4_PART 3\n" in text and f'#include "{source}"' in text
        assert "#define TORCH_FP4_PART -1\n" in (tmp_path / f"{stem}.dispatch.cu").read_text()
    times = {p: p.stat().st_mtime_ns for p in parts}
    stale = tmp_path / "mm_wgmma.part0.cu"
    stale.write_text("// stale\n")
    build.part_sources(tmp_path)
    assert stale.read_text() == build.part_text("mm_wgmma.cu", 0)
    assert all(p.stat().st_mtime_ns == t for p, t in times.items() if p != stale)   # untouched


@pytest.mark.parametrize("source,part", [("mm_small_m.cu", 5), ("mm_wgmma.cu", 1)])
def test_dispatch_calls_every_variant_and_a_part_defines_one(tmp_path, source, part):
    nm = shutil.which("nm")
    if NVCC is None or nm is None:
        pytest.skip("nvcc or nm not found")

    def symbols(p):
        obj = tmp_path / f"part{p}.o"
        subprocess.run([NVCC, "-c", "-O3", "-std=c++17", build.gencode_flag((9, 0)), f"-I{build.CSRC}",
                        f"-DTORCH_FP4_PART={p}", "-o", str(obj), str(build.CSRC / source)],
                       check=True, capture_output=True, timeout=300)
        out = subprocess.run([nm, "-C", str(obj)], check=True, capture_output=True, text=True).stdout
        return {(kind, int(v)) for kind, v in re.findall(r" ([UWT]) bool torch_fp4::\w+::launch_variant<(\d+)>", out)}, out

    dispatch, text = symbols(-1)
    assert dispatch == {("U", v) for v in range(build.MM_VARIANTS)}
    assert re.search(r" T torch_fp4::launch_(small_m|wgmma)_mm\(", text)
    assert "_kernel" not in text                                    # no kernel in the dispatch unit
    defined, text = symbols(part)
    assert {v for kind, v in defined if kind in "WT"} == {part}
    assert not re.search(r" T torch_fp4::launch_(small_m|wgmma)_mm\(", text)
