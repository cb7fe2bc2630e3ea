"""The cuda backend's kernel libraries (torch_fp4/kernels/cuda/build.py, native.py, csrc/capi.h):
the variant table shared by Python and C++, the ctypes signatures against the C declarations of
every entry point, and (with nvcc and nm) that a variant library holds only its variant's kernels
and exports only its C entry points, and that a built library is reused from the cache."""
import re
import shutil
import subprocess

import pytest

from test_cuda_sources_compile import NVCC
from torch_fp4.kernels.cuda import build, native


def test_variant_table_matches_the_csrc_table():
    text = (build.CSRC / "mm_operands.h").read_text()
    table = re.search(r"kMmVariants\[\] = \{(.*?)\};", text, re.S).group(1)
    rows = re.findall(r"\{(true|false), (true|false), (true|false)\}", table)
    assert len(rows) == build.MM_VARIANTS
    for index, row in enumerate(rows):
        fp16, mx, packed = (v == "true" for v in row)
        assert build.mm_variant(fp16, mx, packed) == index


def test_every_kernel_source_is_in_a_library():
    units = [u for lib in build.LIBRARIES.values() for u in lib]
    assert {u.source for u in units} == set(build.KERNEL_SOURCES)
    assert len(set(units)) == len(units)                       # no unit in two libraries
    for v in range(build.MM_VARIANTS):
        for g in (0, 1):   # kernel groups by the M a call serves (csrc/mm_operands.h, group_compiled)
            assert build.LIBRARIES[f"small_m{v}_{g}"] == (build.Unit("mm_small_m.cu", (v,), g),)
            assert build.LIBRARIES[f"wgmma{v}_{g}"] == (build.Unit("mm_wgmma.cu", (v,), g),)
        assert (build.small_m_library(v, 8), build.small_m_library(v, 9)) == (f"small_m{v}_0", f"small_m{v}_1")
        assert (build.wgmma_library(v, 64), build.wgmma_library(v, 128)) == (f"wgmma{v}_0", f"wgmma{v}_1")
    # fused_moe's decode path, row-major experts (even variants) and "sm90" ones (odd): bf16 x, or
    # fp16 x (fp16 FC1, bf16 FC2); MXFP4 experts (gpt-oss): bf16 activations only; group 0 for
    # blocks of 8 routed rows, group 1 for 16-64
    for packed in (0, 1):
        for g in (0, 1):
            lib = build.LIBRARIES
            assert lib[f"moe_small_m{packed}_{g}"] == (build.Unit("moe_small_m.cu", (packed,), g),)
            assert lib[f"moe_small_m{2 + packed}_{g}"] == (build.Unit("moe_small_m.cu", (2 + packed, packed), g),)
            assert lib[f"moe_small_m{4 + packed}_{g}"] == (build.Unit("moe_small_m.cu", (4 + packed,), g),)
    assert sorted(n for n in build.LIBRARIES if n.startswith("moe_small_m")) == [
        f"moe_small_m{v}_{g}" for v in range(6) for g in (0, 1)]
    assert [build.moe_decode_library(2, bm) for bm in (8, 16, 64)] == ["moe_small_m2_0", "moe_small_m2_1",
                                                                       "moe_small_m2_1"]
    assert build.Unit("mm_wgmma.cu", (3,)).defines() == ("-DTORCH_FP4_PARTS=8",)
    assert build.Unit("mm_wgmma.cu", (3,), 1).defines() == ("-DTORCH_FP4_PARTS=8", "-DTORCH_FP4_GROUP=1")
    assert build.Unit("mm_wgmma.cu", (3,), 1).stem == "mm_wgmma.part3.group1"
    assert build.Unit("moe_small_m.cu", (2, 0)).defines() == ("-DTORCH_FP4_PARTS=5",)
    assert build.Unit("moe_small_m.cu", (2, 0)).stem == "moe_small_m.part2_0"
    assert build.Unit("quantize.cu").defines() == ()


_C_TYPES = {"int": native._I, "int64_t": native._L, "const char*": native.ctypes.c_char_p}


def _c_type(decl: str):
    decl = re.sub(r"\s+\w+$", "", decl.strip())                 # drop the parameter name
    return native._P if decl.endswith("*") and decl != "const char*" else _C_TYPES[decl]


def test_ctypes_signatures_match_the_c_declarations():
    declared = {}
    for path in sorted(build.CSRC.glob("*.[ch]*")):
        text = path.read_text()
        for ret, name, args in re.findall(r"TORCH_FP4_CAPI (?:__attribute__\(\(weak\)\) )?([\w ]+?\*?) "
                                          r"torch_fp4_(\w+)\(([^)]*)\)", text):
            assert name not in declared or name == "error_string", f"{name} declared twice"
            declared[name] = (_c_type(ret + " r"), tuple(_c_type(a) for a in args.split(",")))
    assert set(declared) == set(native.SIGNATURES)
    for name, (ret, args) in declared.items():
        assert native.SIGNATURES[name] == (ret, args), name


def _tools():
    nm = shutil.which("nm")
    if NVCC is None or nm is None:
        pytest.skip("nvcc or nm not found")
    return nm


def test_a_variant_unit_holds_only_its_kernels(tmp_path):
    nm = _tools()
    obj = tmp_path / "part.o"
    unit = build.Unit("mm_small_m.cu", (5,), 0)              # bf16, MXFP4, "sm90" weights; M <= 8
    subprocess.run(build.compile_command(unit, (9, 0), obj), check=True, capture_output=True, timeout=600)
    text = subprocess.run([nm, "-C", str(obj)], check=True, capture_output=True, text=True).stdout
    config = r"Config<[^>]*?(true|false), (true|false), (true|false), (true|false)>"
    kernels = re.findall(r"small_m_mm_kernel<torch_fp4::small_m::" + config, text)
    assert kernels and set(kernels) == {("false", "true", "true", "false")}   # fp16, MXFP4, sm90, grouped
    nbs = re.findall(r"small_m_mm_kernel<torch_fp4::small_m::Config<(\d+),", text)
    assert set(nbs) == {"1"}                                   # group 0: one 8-row block
    assert re.search(r" T torch_fp4_mm_small_m\b", text)
    # The Hopper GEMM's group 0: block_m 32 and 64 only
    subprocess.run(build.compile_command(build.Unit("mm_wgmma.cu", (1,), 0), (9, 0), obj), check=True,
                   capture_output=True, timeout=600)
    text = subprocess.run([nm, "-C", str(obj)], check=True, capture_output=True, text=True).stdout
    block_ms = re.findall(r"wgmma_mm_kernel<torch_fp4::wgmma_mm::Config<(\d+),", text)
    assert block_ms and set(block_ms) == {"32", "64"}, set(block_ms)
    # fused_moe's fp16 decode unit: grouped kernels of the fp16 and the bf16 row-major NVFP4
    # variants (FC1 reads fp16 x, FC2 the bf16 intermediate), and the routing kernels
    moe = build.Unit("moe_small_m.cu", (2, 0))
    subprocess.run(build.compile_command(moe, (9, 0), obj), check=True, capture_output=True, timeout=600)
    text = subprocess.run([nm, "-C", str(obj)], check=True, capture_output=True, text=True).stdout
    kernels = re.findall(r"small_m_moe_kernel<torch_fp4::small_m::" + config, text)
    assert set(kernels) == {("true", "false", "false", "true"), ("false", "false", "false", "true")}
    assert re.search(r"moe_route::align_kernel", text) and re.search(r"moe_route::topk_sum_kernel<float>", text)
    assert re.search(r" T torch_fp4_moe_decode\b", text)


def test_built_library_exports_only_its_entry_points_and_is_reused(tmp_path, monkeypatch):
    nm = _tools()
    monkeypatch.setenv("TORCH_FP4_CACHE_DIR", str(tmp_path))
    build.build_dir.cache_clear()
    try:
        paths = build.build((9, 0), ["core"], progress=None)
        exported = subprocess.run([nm, "-D", "--defined-only", str(paths["core"])], check=True,
                                  capture_output=True, text=True).stdout
        names = set(re.findall(r" [TW] (\w+)", exported))
        assert names == {"torch_fp4_nvfp4_quantize", "torch_fp4_mxfp4_quantize", "torch_fp4_exact_values",
                         "torch_fp4_dequantize", "torch_fp4_global_scale", "torch_fp4_moe_swiglu", "torch_fp4_error_string"}
        lib = native.Library("core", paths["core"])
        assert lib.error_string(-1) == b"no kernel of this library matches the arguments"

        def no_compiler(cmd):
            raise AssertionError(f"rebuilt a cached library: {cmd}")
        monkeypatch.setattr(build, "_run", no_compiler)
        assert build.build((9, 0), ["core"], progress=None) == paths
    finally:
        build.build_dir.cache_clear()


def test_units_optimize_on_a_fixed_thread_count_where_nvcc_can(monkeypatch):
    """nvcc >= 12.1 gets --split-compile=SPLIT_COMPILE (the same count on every machine, so the same
    code), an older or unknown nvcc does not; SPLIT_COMPILE is part of the cache folder's hash."""
    unit = build.Unit("mm_small_m.cu", (1,))
    for version, split in (((13, 0), True), ((12, 1), True), ((12, 0), False), ((0, 0), False)):
        monkeypatch.setattr(build, "nvcc_version", lambda compiler=None, v=version: v)
        flags = build.nvcc_flags()
        assert flags[:len(build.NVCC_FLAGS)] == build.NVCC_FLAGS
        assert (f"--split-compile={build.SPLIT_COMPILE}" in flags) == split, version
        command = build.compile_command(unit, (9, 0), build.CSRC / "x.o")
        assert [f for f in command if f.startswith("--split-compile")] == [f for f in flags if f.startswith("--split")]
    assert build.SPLIT_COMPILE == 8
    monkeypatch.setattr(build, "nvcc_version", lambda compiler=None: (13, 0))
    build.build_dir.cache_clear()
    try:
        with_split = build.build_dir((9, 0))
        monkeypatch.setattr(build, "SPLIT_COMPILE", 0)
        assert "--split-compile=8" not in " ".join(build.nvcc_flags())
        build.build_dir.cache_clear()
        assert build.build_dir((9, 0)) != with_split
    finally:
        build.build_dir.cache_clear()


def test_nvcc_version_reads_the_release_or_gives_zero(tmp_path):
    fake = tmp_path / "nvcc"
    fake.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.4, V12.4.131'\n")
    fake.chmod(0o755)
    assert build.nvcc_version(str(fake)) == (12, 4)
    assert build.nvcc_version(str(tmp_path / "missing")) == (0, 0)


def test_unknown_library_is_refused():
    with pytest.raises(ValueError, match="unknown kernel libraries"):
        build.build((9, 0), ["wgmma9"], progress=None)


def test_decode_plan_fields_match_the_c_struct():
    text = (build.CSRC / "moe_decode.h").read_text()
    body = re.search(r"struct MoeDecodePlan \{(.*?)\};", text, re.S).group(1)
    body = re.sub(r"//[^\n]*", "", body)
    names = [n for decl in re.findall(r"int64_t ([^;]+);", body) for n in re.findall(r"\w+", decl)]
    assert [name for name, _ in native.MoeDecodePlan._fields_] == names
    assert all(t is native._L for _, t in native.MoeDecodePlan._fields_)


def test_decode_workspace_layout_matches_the_c_header(tmp_path):
    """kernels/cuda/moe.workspace_layout (the views the GPU tests read) against csrc/moe_decode.h's
    moe_decode_workspace, compiled by the host C++ compiler."""
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    from test_cuda_moe_glue import _problem
    from torch_fp4.kernels.cuda import moe as CM
    cases = [(1, 8, 2, 4096, 14336, 8), (5, 8, 3, 64, 128, 16), (300, 256, 8, 7168, 2048, 64), (4, 2048, 6, 16, 16, 32)]
    src = tmp_path / "layout.cc"
    src.write_text('#include <cstdio>\n#include "moe_decode.h"\nint main() {\n' + "".join(
        f"  {{ torch_fp4::MoeDecodePlan p{{}}; p.tokens = {t}; p.experts = {e}; p.top_k = {k}; p.hidden = {h}; "
        f"p.inter = {i}; p.block_m = {bm}; auto w = torch_fp4::moe_decode_workspace(p); "
        'std::printf("%lld %lld %lld %lld %lld %lld\\n", (long long)w.sorted_pairs, (long long)w.block_expert, '
        '(long long)w.expert_end, (long long)w.h, (long long)w.y, (long long)w.bytes); }\n'
        for t, e, k, h, i, bm in cases) + "}\n")
    exe = tmp_path / "layout"
    subprocess.run([cxx, "-std=c++17", f"-I{build.CSRC}", str(src), "-o", str(exe)], check=True, capture_output=True)
    lines = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split("\n")
    for (t, e, k, h, i, bm), line in zip(cases, lines):
        layout, total = CM.workspace_layout(_problem(t, e, k, hidden=h, inter=i), bm)
        assert [int(v) for v in line.split()] == [off for off, _, _ in layout.values()] + [total], (t, e, k, bm)
