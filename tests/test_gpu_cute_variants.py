"""Both CuTe DSL quantize kernels (vector loads, TMA producer/consumer), each forced in turn,
bit for bit against the reference; `auto` picks between them by size."""
import pytest
import torch

import torch_fp4 as t4
from torch_fp4.backends import Backend

pytestmark = pytest.mark.gpu
SHAPES = [(1, 64), (129, 96), (3, 40, 128), (1000, 4096), (77, 8192)]


@pytest.fixture
def launch():
    x = torch.zeros(1, 32, device="cuda") if torch.cuda.is_available() else torch.zeros(1, 32)
    reason = t4.unsupported_reason("mxfp4_quantize", Backend.CUTE_DSL, x, t4.SfLayout.LAYOUT_128x4)
    if reason is not None:
        pytest.skip(f"cute-dsl: {reason}")
    from torch_fp4.kernels.cute import launch as L
    yield L
    L.FORCE_VARIANT = None


@pytest.mark.parametrize("variant", ["vector", "tma"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn], ids=str)
@pytest.mark.parametrize("layout", ["128x4", "8x4", "linear"])
def test_variant_bitexact(launch, variant, dtype, layout):
    launch.FORCE_VARIANT = variant
    for i, shape in enumerate(SHAPES):
        g = torch.Generator(device="cuda").manual_seed(i)
        x = torch.randn(shape, device="cuda", generator=g)
        x = x * torch.exp2(torch.randint(-30, 30, shape[:-1] + (1,), device="cuda", generator=g).float())
        x.view(-1, shape[-1])[0, 5] = float("nan")
        x = x.clamp(-448, 448).to(dtype) if dtype == torch.float8_e4m3fn else x.to(dtype)
        gs = torch.rand(shape[0] if len(shape) == 3 else 1, device="cuda") * 300 + 1
        for got, want in ((t4.nvfp4_quantize(x, gs, layout, backend="cute-dsl"),
                           t4.nvfp4_quantize(x, gs, layout, backend="reference")),
                          (t4.mxfp4_quantize(x, layout, backend="cute-dsl"),
                           t4.mxfp4_quantize(x, layout, backend="reference"))):
            for g_, w_ in zip(got, want):
                assert torch.equal(g_.view(torch.uint8), w_.view(torch.uint8)), (variant, dtype, layout, shape)


def test_auto_variant_choice(launch):
    assert launch.quantize_variant(1 << 24, "mxfp4", "f32") in ("vector", "tma")
    assert launch.quantize_variant(1 << 10, "nvfp4", "bf16") == "vector"
