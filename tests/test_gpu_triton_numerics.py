"""The Triton E2M1 encoder against formats.e2m1_encode on fp32 bit patterns: random patterns over
the whole fp32 range plus every rounding threshold and its fp32 neighbours."""
import pytest
import torch

from torch_fp4 import formats as F

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")
from torch_fp4.kernels.triton.numerics import e2m1_encode_doubled  # noqa: E402

pytestmark = pytest.mark.gpu


@triton.jit
def _encode_kernel(y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    y = tl.load(y_ptr + offs, mask=offs < n, other=0.0)
    tl.store(out_ptr + offs, e2m1_encode_doubled(y * 2.0, 16.0).to(tl.uint8), mask=offs < n)


def _encode(y: torch.Tensor) -> torch.Tensor:
    out = torch.empty(y.shape, dtype=torch.uint8, device=y.device)
    _encode_kernel[(triton.cdiv(y.numel(), 1024),)](y, out, y.numel(), BLOCK=1024,
                                                    enable_fp_fusion=False)
    return out


def test_encoder_matches_formats():
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(0)
    bits = torch.randint(-(2**31), 2**31 - 1, (1 << 20,), generator=g, dtype=torch.int64).to(torch.int32)
    y = bits.view(torch.float32)
    y = y[~torch.isnan(y)]  # NaN is handled per block by the kernels, not by the encoder
    edges = torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0,
                          6.0, 7.0, 8.0, 1e30, float("inf"), 1e-40, 2.0 ** -126])
    near = torch.cat([edges, torch.nextafter(edges, torch.full_like(edges, float("inf"))),
                      torch.nextafter(edges, torch.zeros_like(edges))])
    small = torch.linspace(0, 8, 1 << 16)
    y = torch.cat([y, near, -near, small, -small])
    got = _encode(y.to(dev)).cpu()
    want = F.e2m1_encode(y)
    bad = (got != want).nonzero()
    assert bad.numel() == 0, f"{bad.numel()} mismatches; first y={y[bad[0]].item()!r} got {got[bad[0]].item()} want {want[bad[0]].item()}"
