"""CPU checks of the Triton backend (no GPU needed): every kernel compiles for sm_90 and sm_100
and its PTX has the instructions the numerics contract relies on; the E2M1 encoder is checked
exhaustively under Triton's interpreter."""
import os
import re
import subprocess
import sys

import pytest

triton = pytest.importorskip("triton")
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from torch_fp4.kernels.triton import quantize as Q  # noqa: E402

DIV16 = [["tt.divisibility", 16]]
COMMON = {"M": "i32", "half_k": "i32", "n_kb": "i32", "mp": "i32", "kp": "i32", "gs_stride": "i32"}


def _ptx(fn, signature, constexprs, divisible, arch):
    signature = {**signature, "USE_GDC": "constexpr"}
    constexprs = {"USE_GDC": False, **constexprs}
    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs,
                    attrs={(i,): DIV16 for i in divisible})
    kernel = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                            options={"enable_fp_fusion": False, "num_warps": 4})
    return kernel.asm["ptx"]


def _quantize_ptx(is_mx, layout, arch):
    sig = {"x_ptr": "*i32", "gs_ptr": "*fp32", "data_ptr": "*u8", "scale_ptr": "*u8", **COMMON,
           "SRC": "constexpr", "IS_MX": "constexpr", "LAYOUT": "constexpr", "BLOCK": "constexpr",
           "BM": "constexpr", "BKB": "constexpr"}
    consts = {"SRC": 0, "IS_MX": is_mx, "LAYOUT": layout, "BLOCK": 32 if is_mx else 16, "BM": 8,
              "BKB": 16}
    return _ptx(Q._quantize_kernel, sig, consts, (0, 1, 2, 3, 5), arch)


@pytest.mark.parametrize("arch", [90, 100])
@pytest.mark.parametrize("is_mx", [False, True], ids=["nvfp4", "mxfp4"])
def test_quantize_kernel_ptx(arch, is_mx):
    ptx = _quantize_ptx(is_mx, 0, arch)
    assert re.search(r"ld\.global(\.\w+)*\.v4\.b32", ptx), "input loads are not 16 bytes wide"
    assert not re.search(r"\bfma\.", ptx), "an FMA would merge two of the contract's roundings"
    if not is_mx:
        assert "cvt.rn.satfinite.e4m3x2.f32" in ptx
        assert "div.rn.f32" in ptx and "rcp.approx" not in ptx


@pytest.mark.parametrize("layout", [1, 2], ids=["8x4", "linear"])
def test_quantize_kernel_layouts_compile(layout):
    assert ".entry" in _quantize_ptx(False, layout, 90)


@pytest.mark.parametrize("dst,ptr", [(0, "*i32"), (2, "*i64")], ids=["bf16", "fp32"])
def test_dequantize_kernel_ptx(dst, ptr):
    sig = {"data_ptr": "*u8", "scale_ptr": "*u8", "gs_ptr": "*fp32", "out_ptr": ptr, **COMMON,
           "DST": "constexpr", "IS_MX": "constexpr", "HAS_GS": "constexpr", "LAYOUT": "constexpr",
           "BLOCK": "constexpr", "BM": "constexpr", "BKB": "constexpr"}
    ptx = _ptx(Q._dequantize_kernel, sig, {"DST": dst, "IS_MX": False, "HAS_GS": True, "LAYOUT": 0,
                                           "BLOCK": 16, "BM": 8, "BKB": 16}, (0, 1, 2, 3, 5), 90)
    assert "div.rn.f32" in ptx and not re.search(r"\bfma\.", ptx)


@pytest.mark.parametrize("src,ptr,is_mx", [(0, "*i32", False), (2, "*i64", True)], ids=["bf16-nvfp4", "fp32-mxfp4"])
def test_values_kernel_ptx(src, ptr, is_mx):
    sig = {"x_ptr": ptr, "gs_ptr": "*fp32", "out_ptr": "*i32", "M": "i32", "half_k": "i32", "n_kb": "i32",
           "gs_stride": "i32", "SRC": "constexpr", "IS_MX": "constexpr", "BLOCK": "constexpr", "BM": "constexpr",
           "BKB": "constexpr"}
    ptx = _ptx(Q._values_kernel, sig, {"SRC": src, "IS_MX": is_mx, "BLOCK": 32 if is_mx else 16, "BM": 8,
                                       "BKB": 16}, (0, 1, 2, 4), 90)
    assert not re.search(r"\bfma\.", ptx), "an FMA would merge two of the contract's roundings"
    assert "rcp.approx" not in ptx
    if not is_mx:
        assert "cvt.rn.satfinite.e4m3x2.f32" in ptx and "div.rn.f32" in ptx


def test_values_kernel_is_quantize_then_dequantize_under_interpreter():
    """The one-pass values kernel gives the bits of the quantize kernel followed by the dequantize
    kernel without the global scale (every input dtype, both formats, 2-D and 3-D with a scale
    per entry, NaN / Inf / huge inputs), run by Triton's interpreter on the CPU. (The GPU tests
    compare both with the reference.)"""
    env = dict(os.environ, TRITON_INTERPRET="1")
    code = """
import torch
from torch_fp4 import formats as F
from torch_fp4.kernels.triton import quantize as Q
bad = 0
for dtype in (torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn):
    for fmt in (F.NVFP4, F.MXFP4):
        for shape in ((5, 64), (3, 7, 96)):
            x = torch.randn(*shape, generator=torch.Generator().manual_seed(len(shape))) * 10
            x.view(-1)[3], x.view(-1)[40], x.view(-1)[17] = float("inf"), float("nan"), 1e-3
            if dtype != torch.float8_e4m3fn:
                x.view(-1)[50] = 6e4 if dtype == torch.float16 else 3e38
            x = x.to(dtype)
            gs = None
            if fmt is F.NVFP4 and len(shape) == 2:
                gs = torch.tensor([37.5])
            elif fmt is F.NVFP4:
                gs = torch.rand(3, generator=torch.Generator().manual_seed(1)) * 50 + 0.5
            lay = F.SfLayout.LINEAR
            two = Q.fp4_dequantize(*Q._quantize(x, gs, fmt, lay), None, fmt, lay, torch.bfloat16)
            bad += not torch.equal(Q.fp4_quantized_values(x, gs, fmt).view(torch.int16), two.view(torch.int16))
print("values ok" if bad == 0 else f"{bad} mismatches")
"""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    res = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True,
                         timeout=900)
    assert res.returncode == 0 and "values ok" in res.stdout, (res.stdout[-2000:], res.stderr[-3000:])


def test_global_scale_kernel_ptx():
    sig = {"x_ptr": "*bf16", "n": "i32", "ws_ptr": "*i32", "out_ptr": "*fp32", "BLOCK": "constexpr"}
    ptx = _ptx(Q._global_scale_kernel, sig, {"BLOCK": 4096}, (0,), 90)
    assert "atom.global" in ptx and "div.rn.f32" in ptx


def test_encoder_under_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    code = ("import tests.test_gpu_triton_numerics as t; t.test_encoder_matches_formats(); "
            "print('encoder ok')")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    res = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0 and "encoder ok" in res.stdout, res.stderr[-3000:]


def test_pdl_variant_waits_on_the_previous_grid():
    sig = {"x_ptr": "*i32", "gs_ptr": "*fp32", "data_ptr": "*u8", "scale_ptr": "*u8", **COMMON,
           "SRC": "constexpr", "IS_MX": "constexpr", "LAYOUT": "constexpr", "BLOCK": "constexpr",
           "BM": "constexpr", "BKB": "constexpr"}
    consts = {"SRC": 0, "IS_MX": False, "LAYOUT": 0, "BLOCK": 16, "BM": 8, "BKB": 16, "USE_GDC": True}
    ptx = _ptx(Q._quantize_kernel, sig, consts, (0, 1, 2, 3, 5), 90)
    assert "griddepcontrol.wait" in ptx and "griddepcontrol.launch_dependents" in ptx
    assert ptx.index("griddepcontrol.wait") < ptx.index("ld.global")
    assert "griddepcontrol" not in _quantize_ptx(False, 0, 90)


def _mm_kernel(arch, a_fp4=False, mx=False, swap=True, bm=16, bn=64, bk=256, half="bf16", warps=4):
    from torch_fp4.kernels.triton import mm as MM
    import triton.language as tl
    dt = {"bf16": tl.bfloat16, "f16": tl.float16}[half]
    sig = {"a_ptr": "*u8" if a_fp4 else {"bf16": "*bf16", "f16": "*fp16"}[half], "as_ptr": "*u8", "b_ptr": "*u8", "bs_ptr": "*u8",
           "alpha_ptr": "*fp32", "out_ptr": "*bf16", "ws_ptr": "*fp32", "M": "i32", "N": "i32",
           "K": "i32", "KH": "i32", "a_kp": "i32", "b_kp": "i32", "kh_per_split": "i32"}
    consts = dict(A_FP4=a_fp4, A_LAYOUT=0, MX=mx, BLOCK=32 if mx else 16, HAS_ALPHA=True, SPLIT=1,
                  SWAP=swap, DOT=dt, HALF=dt, OUT=tl.bfloat16, BM=bm, BN=bn, BK=bk, GROUP_M=8, EVEN_K=True,
                  USE_GDC=False)
    sig.update({k: "constexpr" for k in consts})
    src = ASTSource(fn=MM._mm_kernel, signature=sig, constexprs=consts,
                    attrs={(i,): DIV16 for i in (0, 1, 2, 3, 5, 6)})
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": warps})


@pytest.mark.parametrize("cfg", [dict(), dict(a_fp4=True), dict(mx=True), dict(half="f16"),
                                 dict(swap=False, bm=128, bn=128, bk=64, warps=8)])
def test_mm_kernel_decodes_in_registers_and_uses_wgmma(cfg):
    """sm_90: the E2M1 decode is the inline asm (byte spread, exact 16-bit multiplies) and the
    products run on wgmma."""
    ptx = _mm_kernel(90, **cfg).asm["ptx"]
    half = cfg.get("half", "bf16")
    assert "prmt.b32" in ptx and f"fma.rn.{half}x2" in ptx
    assert "wgmma.mma_async" in ptx


def test_mm_kernel_compiles_for_sm100():
    assert "prmt.b32" in _mm_kernel(100).asm["ptx"]
