"""The 32-bit index guards at the sizes where they trigger (GPU, several GiB; the full sweep).

Backends that index with 32-bit offsets refuse operands past 2^31 elements (their requirement
says so) and `auto` takes another; every backend that accepts such a problem must address all
of it. Each check runs every supported backend on a tensor past 2^31 elements and compares
slices at its start, across the 2^31-element boundary and at its end with the reference backend
on the same slices: quantization bit for bit, the GEMM exactly (grid-exact operands).
"""
import pytest
import torch

import torch_fp4 as t4
from torch_fp4 import formats as F

pytestmark = [pytest.mark.gpu, pytest.mark.full]
DEV = "cuda"
BF16 = torch.bfloat16
K = 4096
ROWS = 2**31 // K + 256          # 2^31 + 2^20 elements of x
SLICE = 128


def _need_gib(gib: float) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    free = torch.cuda.mem_get_info()[0] / 2**30
    if free < gib:
        pytest.skip(f"needs {gib} GiB of free GPU memory, has {free:.1f}")


def _starts(rows: int, row_elems: int) -> tuple[int, ...]:
    """Slice starts: the first rows, the rows across element 2^31, the last rows."""
    across = 2**31 // row_elems - SLICE // 2
    return 0, across, rows - SLICE


@pytest.fixture(scope="module")
def big_x():
    _need_gib(40)
    g = torch.Generator(device=DEV).manual_seed(7)
    x = torch.randn(ROWS, K, dtype=BF16, device=DEV, generator=g)
    yield x
    del x
    torch.cuda.empty_cache()


def test_global_scale_past_2_31_elements(big_x):
    want = t4.compute_global_scale(big_x, backend="reference")
    backends = t4.supported_backends("compute_global_scale", big_x)
    assert backends
    for b in backends:
        assert torch.equal(t4.compute_global_scale(big_x, backend=b), want), b


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("layout", ["128x4", "linear"])
def test_quantize_and_dequantize_past_2_31_elements(big_x, fmt, layout):
    f = F.NVFP4 if fmt == "nvfp4" else F.MXFP4
    gs = t4.compute_global_scale(big_x) if fmt == "nvfp4" else None

    def quantize(x, sf_layout, backend):
        if fmt == "nvfp4":
            return t4.nvfp4_quantize(x, gs, sf_layout=sf_layout, backend=backend)
        return t4.mxfp4_quantize(x, sf_layout=sf_layout, backend=backend)

    args = (big_x, gs) if fmt == "nvfp4" else (big_x,)
    backends = t4.supported_backends(f"{fmt}_quantize", *args, sf_layout=layout)
    assert backends
    kb = K // f.block_size
    for b in backends:
        data, scale = quantize(big_x, layout, b)
        lin = F.unswizzle(scale, ROWS, kb, layout) if layout != "linear" else scale
        for r0 in _starts(ROWS, K):
            d_ref, s_ref = quantize(big_x[r0:r0 + SLICE], "linear", "reference")
            assert torch.equal(F.as_uint8(data[r0:r0 + SLICE]), F.as_uint8(d_ref)), (b, r0)
            assert torch.equal(F.as_uint8(lin[r0:r0 + SLICE]), F.as_uint8(s_ref)), (b, r0)
        if layout == "128x4":
            deq_args = (data, scale, gs, f.block_size)
            for db in t4.supported_backends("fp4_dequantize", *deq_args, out_dtype=BF16):
                out = t4.fp4_dequantize(*deq_args, out_dtype=BF16, backend=db)
                for r0 in _starts(ROWS, K):
                    s_rows = F.swizzle(lin[r0:r0 + SLICE].contiguous(), "128x4")
                    want = t4.fp4_dequantize(data[r0:r0 + SLICE], s_rows, gs, f.block_size, out_dtype=BF16,
                                             backend="reference")
                    assert torch.equal(out[r0:r0 + SLICE], want), (b, db, r0)
                del out
        del data, scale, lin
        torch.cuda.empty_cache()


def test_mm_weight_past_2_31_bytes_every_backend():
    """W [N, K/2] of 2^31 + 4 MiB bytes: grid-exact codes and power-of-two block scales, activations
    in {0, +-0.5, +-1}, so every sum is exact in fp32 and every backend must equal the reference."""
    _need_gib(12)
    n, k = 2**16 + 128, 2**16
    g = torch.Generator(device=DEV).manual_seed(11)
    w = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=DEV, generator=g)
    exps = torch.randint(-2, 3, (n, k // 16), device=DEV, generator=g).float()
    lin = F.e4m3_rn_satfinite(torch.exp2(exps)).view(torch.float8_e4m3fn)
    del exps
    scale = F.swizzle(lin, "128x4")
    data = w.view(torch.float4_e2m1fn_x2)
    for m in (1, 33):
        a = (torch.randint(-2, 3, (m, k), device=DEV, generator=g).float() / 2).to(BF16)
        args = (a, data.T, None, scale.T)
        backends = t4.supported_backends("mm_fp4", *args)
        assert backends
        for b in backends:
            out = t4.mm_fp4(*args, backend=b)
            for n0 in _starts(n, k // 2):
                rows = slice(n0, n0 + SLICE)
                s_rows = F.swizzle(lin[rows].contiguous(), "128x4")
                want = t4.mm_fp4(a, data[rows].T, None, s_rows.T, backend="reference")
                assert torch.equal(out[:, rows], want), (m, b, n0)
            del out
