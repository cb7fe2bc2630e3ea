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
        assert build.LIBRARIES[f"small_m{v}"] == (build.Unit("mm_small_m.cu", v),)
        assert build.LIBRARIES[f"wgmma{v}"] == (build.Unit("mm_wgmma.cu", v),)
        # fused_moe's grouped small-M GEMMs read row-major weights: no "sm90" variant
        assert build.LIBRARIES.get(f"moe_small_m{v}") == (None if v % 2 else (build.Unit("moe_small_m.cu", v),))
    assert build.Unit("mm_wgmma.cu", 3).defines() == ("-DTORCH_FP4_PART=3",)
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
    unit = build.Unit("mm_small_m.cu", 5)                    # bf16, MXFP4, "sm90" weights
    subprocess.run(build.compile_command(unit, (9, 0), obj), check=True, capture_output=True, timeout=600)
    text = subprocess.run([nm, "-C", str(obj)], check=True, capture_output=True, text=True).stdout
    config = r"Config<[^>]*?(true|false), (true|false), (true|false), (true|false)>"
    kernels = re.findall(r"small_m_mm_kernel<torch_fp4::small_m::" + config, text)
    assert kernels and set(kernels) == {("false", "true", "true", "false")}   # fp16, MXFP4, sm90, grouped
    assert re.search(r" T torch_fp4_mm_small_m\b", text)
    # the grouped (fused_moe) unit of the same variant family: row-major MXFP4 weights, grouped
    moe = build.Unit("moe_small_m.cu", 4)
    subprocess.run(build.compile_command(moe, (9, 0), obj), check=True, capture_output=True, timeout=600)
    text = subprocess.run([nm, "-C", str(obj)], check=True, capture_output=True, text=True).stdout
    kernels = re.findall(r"small_m_moe_kernel<torch_fp4::small_m::" + config, text)
    assert kernels and set(kernels) == {("false", "true", "false", "true")}
    assert re.search(r" T torch_fp4_moe_small_m\b", text)


def test_built_library_exports_only_its_entry_points_and_is_reused(tmp_path, monkeypatch):
    nm = _tools()
    monkeypatch.setenv("TORCH_FP4_CACHE_DIR", str(tmp_path))
    build.build_dir.cache_clear()
    try:
        paths = build.build((9, 0), ["core"], progress=None)
        exported = subprocess.run([nm, "-D", "--defined-only", str(paths["core"])], check=True,
                                  capture_output=True, text=True).stdout
        names = set(re.findall(r" [TW] (\w+)", exported))
        assert names == {"torch_fp4_nvfp4_quantize", "torch_fp4_mxfp4_quantize", "torch_fp4_nvfp4_exact_values",
                         "torch_fp4_dequantize", "torch_fp4_global_scale", "torch_fp4_error_string"}
        lib = native.Library("core", paths["core"])
        assert lib.error_string(-1) == b"no kernel of this library matches the arguments"

        def no_compiler(cmd):
            raise AssertionError(f"rebuilt a cached library: {cmd}")
        monkeypatch.setattr(build, "_run", no_compiler)
        assert build.build((9, 0), ["core"], progress=None) == paths
    finally:
        build.build_dir.cache_clear()


def test_unknown_library_is_refused():
    with pytest.raises(ValueError, match="unknown kernel libraries"):
        build.build((9, 0), ["wgmma9"], progress=None)
