"""Every GPU backend of the quantize family against the reference, bit for bit.

Outputs are poisoned (0xFF bytes / NaN) at allocation, so an unwritten element or padding byte
shows as a mismatch. A backend that is not installed or cannot run on this device is skipped with
its reason (`pytest -rs` lists them).
"""
import pytest
import torch
from hypothesis import given, settings, strategies as st

import torch_fp4 as t4
from torch_fp4.backends import Backend
from torch_fp4.kernels import _common

pytestmark = pytest.mark.gpu
BACKENDS = ("triton", "cute-dsl", "cuda")
LAYOUTS = ("128x4", "8x4", "linear")
IN_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn)

# The quick tier (tests/conftest.py): every backend in every scale layout on an edge-value 2-D
# shape with partial tiles, batched 3-D in the swizzled layout and many rows in the linear one;
# every backend and output dtype of dequantize in both block sizes; the tests not named here run
# whole. The other cases run with --full.
_QUANTIZE_QUICK = ({f"127x160-{layout}-{b}" for layout in LAYOUTS for b in BACKENDS}
                   | {f"3x40x128-128x4-{b}" for b in BACKENDS} | {f"100000x64-linear-{b}" for b in BACKENDS})
QUICK = {
    "test_nvfp4_quantize_bitexact": _QUANTIZE_QUICK,
    "test_mxfp4_quantize_bitexact": _QUANTIZE_QUICK,
    "test_dequantize_bitexact_on_random_bytes": {
        f"{dtype}-{block}-{layout}-{b}" for b in BACKENDS
        for dtype, block, layout in (("torch.bfloat16", 16, "128x4"), ("torch.float32", 32, "linear"),
                                     ("torch.float16", 32, "8x4"), ("torch.bfloat16", 32, "128x4"))},
    "test_cuda_exact_values_are_quantize_then_dequantize": {
        f"{shape}-{dtype}-{block}" for block in (16, 32) for shape, dtype in (
            ("127x160", "torch.bfloat16"), ("127x160", "torch.float16"), ("127x160", "torch.float32"),
            ("3x40x128", "torch.bfloat16"), ("2x300x512", "torch.float32"))},
}


@pytest.fixture(autouse=True)
def _poison():
    _common.POISON_OUTPUTS = True
    yield
    _common.POISON_OUTPUTS = False


def _need(op, backend, *args):
    reason = t4.unsupported_reason(op, Backend.parse(backend), *args)
    if reason is not None:
        pytest.skip(f"{backend}: {reason}")


_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32}


def _bits(t):
    """Bit patterns; for wide floats every NaN maps to one pattern (NaN payloads are not part of
    the contract, every other bit is)."""
    if t.element_size() == 1 or not t.is_floating_point():
        return t.view(torch.uint8) if t.element_size() == 1 else t
    return torch.where(torch.isnan(t), torch.full_like(t, float("nan")), t).view(_INT_VIEW[t.element_size()])


def _assert_same(got, want, what):
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape and g.dtype == w.dtype, (what, i, g.shape, w.shape, g.dtype, w.dtype)
        gb, wb = _bits(g), _bits(w)
        if not torch.equal(gb, wb):
            bad = (gb != wb).nonzero()
            raise AssertionError(f"{what}: output {i}: {bad.shape[0]} of {gb.numel()} elements differ; "
                                 f"first at {bad[0].tolist()}: got {gb[tuple(bad[0])].item()}, "
                                 f"want {wb[tuple(bad[0])].item()}")


def edge_input(shape, dtype, seed=0):
    """Values over 80 binades with zeros, ties, NaN, +-Inf, denormals, saturating blocks and
    blocks near fp32's largest value (MXFP4's clamped products)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    rows = shape[-2] * (shape[0] if len(shape) == 3 else 1)
    k = shape[-1]
    x = torch.randn(rows, k, device="cuda", generator=g)
    x *= torch.exp2(torch.randint(-40, 40, (rows, 1), device="cuda", generator=g).float())
    if dtype == torch.float8_e4m3fn:
        x = x.clamp(-448, 448)
    grid = torch.tensor([0.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, -0.25, -2.5, -5.0, 0.5, 1.0,
                         3.0, 4.0], device="cuda")
    special = [(0, lambda r: r.zero_()), (1, lambda r: r[: min(k, 16)].copy_(grid[: min(k, 16)])),
               (2, lambda r: r.__setitem__(3, float("nan"))), (3, lambda r: r.__setitem__(0, float("inf"))),
               (4, lambda r: r.__setitem__(1, -float("inf"))), (5, lambda r: r.fill_(1e-40)),
               (6, lambda r: r.mul_(1e30)),
               # near fp32's (and bf16's) largest finite value: MXFP4 e = 253, products clamped to 3
               (7, lambda r: r.copy_(torch.linspace(-3.38e38, 3.38e38, k, device=r.device))),
               # Inf beside huge finite values: MXFP4 e = 254, products clamped to 1.5
               (8, lambda r: (r.mul_(1e37), r.__setitem__(k - 1, float("inf"))))]
    for row, fn in special:
        if row < rows:
            fn(x[row])
    if dtype == torch.float8_e4m3fn:
        x = torch.where(torch.isinf(x), torch.full_like(x, 448.0), x)
    return x.reshape(shape).to(dtype)


SHAPES = [(1, 64), (127, 160), (129, 96), (3, 40, 128), (256, 4096), (2, 300, 512), (100000, 64)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_nvfp4_quantize_bitexact(backend, layout, shape):
    x = edge_input(shape, torch.bfloat16, seed=len(shape) * 1000 + shape[-1])
    gs = torch.rand(shape[0] if len(shape) == 3 else 1, device="cuda") * 1000 + 0.5
    _need("nvfp4_quantize", backend, x, gs, t4.SfLayout.parse(layout))
    want = t4.nvfp4_quantize(x, gs, layout, backend="reference")
    _assert_same(t4.nvfp4_quantize(x, gs, layout, backend=backend), want, f"{backend} nvfp4 {layout}")


@pytest.mark.parametrize("block", (16, 32))
@pytest.mark.parametrize("dtype", IN_DTYPES[:3], ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_cuda_exact_values_are_quantize_then_dequantize(shape, dtype, block):
    """The cuda backend's one-launch exact values (fused_moe's W4A4 activations) are the reference's
    quantize (NVFP4 with its global scale, or MXFP4) followed by fp4_dequantize without the global
    scale, bit for bit (NaN, Inf, subnormal and saturating blocks included), 2-D and batched with a
    scale per entry, and gathered: rows src_pairs // top_k of a 2-D x in one launch."""
    from torch_fp4.kernels.cuda.quantize import exact_values
    if shape[-1] % block:
        pytest.skip(f"K {shape[-1]} is not a multiple of {block}")
    fmt = t4.formats.NVFP4 if block == 16 else t4.formats.MXFP4
    x = edge_input(shape, dtype, seed=7 * shape[-1] + len(shape) + block)
    gs = torch.rand(shape[0] if len(shape) == 3 else 1, device="cuda") * 1000 + 0.5 if block == 16 else None
    _need("nvfp4_quantize" if block == 16 else "mxfp4_quantize", "cuda", x,
          *((gs,) if block == 16 else ()), t4.SfLayout.LINEAR)

    def reference(x):
        q, s = (t4.nvfp4_quantize(x, gs, "linear", backend="reference") if block == 16
                else t4.mxfp4_quantize(x, "linear", backend="reference"))
        return t4.fp4_dequantize(q, s, None, sf_layout="linear", block_size=block, out_dtype=torch.bfloat16,
                                 backend="reference")
    _assert_same((exact_values(x, gs, fmt),), (reference(x),), f"exact values {dtype} block {block}")
    if x.dim() == 2:
        top_k = 3
        g = torch.Generator(device="cuda").manual_seed(shape[0])
        pairs = torch.randint(0, x.shape[0] * top_k, (2 * x.shape[0] + 5,), device="cuda", dtype=torch.int32,
                              generator=g)
        want = reference(x).index_select(0, pairs.long() // top_k)
        _assert_same((exact_values(x, gs, fmt, pairs, top_k),), (want,), f"gathered exact values {dtype} {block}")


@pytest.mark.parametrize("backend", ("cuda", "triton"))
@pytest.mark.parametrize("block", (16, 32))
@pytest.mark.parametrize("dtype", IN_DTYPES, ids=str)
def test_quantized_values_op_bitexact(dtype, block, backend):
    """The public fp4_quantized_values on each GPU backend that has it against the reference, bit
    for bit, 2-D with partial blocks of rows and 3-D with a scale per entry, poisoned outputs;
    the op's call inside a CUDA graph gives the same bits."""
    for shape in ((129, 96) if block == 32 else (129, 80), (3, 40, 128)):
        x = edge_input(shape, dtype, seed=block + len(shape))
        gs = (torch.rand(shape[0] if len(shape) == 3 else 1, device="cuda") * 1000 + 0.5) if block == 16 else None
        _need("fp4_quantized_values", backend, x, gs, block)
        want = t4.fp4_quantized_values(x, gs, block, backend="reference")
        got = t4.fp4_quantized_values(x, gs, block, backend=backend)
        _assert_same((got,), (want,), f"{backend} values {shape} {dtype} {block}")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = t4.fp4_quantized_values(x, gs, block, backend=backend)
    graph.replay()
    _assert_same((got,), (want,), f"values in a graph {dtype} {block}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_mxfp4_quantize_bitexact(backend, layout, shape):
    x = edge_input(shape, torch.bfloat16, seed=shape[-2])
    _need("mxfp4_quantize", backend, x, t4.SfLayout.parse(layout))
    want = t4.mxfp4_quantize(x, layout, backend="reference")
    _assert_same(t4.mxfp4_quantize(x, layout, backend=backend), want, f"{backend} mxfp4 {layout}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", IN_DTYPES, ids=str)
def test_quantize_input_dtypes(backend, dtype):
    x = edge_input((130, 256), dtype, seed=7)
    gs = torch.full((1,), 37.0, device="cuda")
    _need("nvfp4_quantize", backend, x, gs, t4.SfLayout.LAYOUT_128x4)
    _assert_same(t4.nvfp4_quantize(x, gs, backend=backend),
                 t4.nvfp4_quantize(x, gs, backend="reference"), f"{backend} nvfp4 {dtype}")
    _assert_same(t4.mxfp4_quantize(x, backend=backend),
                 t4.mxfp4_quantize(x, backend="reference"), f"{backend} mxfp4 {dtype}")


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=25, deadline=None)
@given(m=st.integers(1, 700), kb=st.integers(1, 40), batch=st.sampled_from([0, 1, 3]),
       layout=st.sampled_from(LAYOUTS), mx=st.booleans(), scale_exp=st.integers(-60, 60),
       seed=st.integers(0, 2**31 - 1))
def test_quantize_hypothesis(backend, m, kb, batch, layout, mx, scale_exp, seed):
    block = 32 if mx else 16
    shape = (m, kb * block) if batch == 0 else (batch, m, kb * block)
    x = (edge_input(shape, torch.float32, seed) * 2.0 ** scale_exp).to(torch.float16 if seed % 2 else torch.bfloat16)
    if mx:
        _need("mxfp4_quantize", backend, x, t4.SfLayout.parse(layout))
        _assert_same(t4.mxfp4_quantize(x, layout, backend=backend),
                     t4.mxfp4_quantize(x, layout, backend="reference"), f"{backend} mxfp4 {shape}")
    else:
        gs = t4.compute_global_scale(x, backend="reference")
        _need("nvfp4_quantize", backend, x, gs, t4.SfLayout.parse(layout))
        _assert_same(t4.nvfp4_quantize(x, gs, layout, backend=backend),
                     t4.nvfp4_quantize(x, gs, layout, backend="reference"), f"{backend} nvfp4 {shape}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("block", [16, 32])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_dequantize_bitexact_on_random_bytes(backend, layout, block, out_dtype):
    g = torch.Generator(device="cuda").manual_seed(block + len(layout))
    for shape in ((1, 32), (129, 256), (3, 70, 64)):
        data = torch.randint(0, 256, shape, dtype=torch.uint8, device="cuda", generator=g)
        rows_k = (*shape[:-1], shape[-1] * 2)
        scale_shape = t4.formats.scale_shape(rows_k, block, layout)
        scale = torch.randint(0, 256, scale_shape, dtype=torch.uint8, device="cuda", generator=g)
        gs = None
        if block == 16:
            gs = torch.rand(shape[0] if len(shape) == 3 else 1, device="cuda") * 500 + 0.1
        args = (data, scale, gs, block, layout, out_dtype)
        fmt = t4.formats.format_for_block_size(block)
        _need("fp4_dequantize", backend, data, scale, gs, fmt.block_size, layout, out_dtype)
        want = t4.fp4_dequantize(*args, backend="reference")
        got = t4.fp4_dequantize(*args, backend=backend)
        _assert_same([got], [want], f"{backend} dequantize {shape} {layout} block={block}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", ["random", "zero", "inf", "nan", "tiny", "large", "fp8"])
def test_compute_global_scale_bitexact(backend, case):
    n = (1 << 25) + 12345 if case == "large" else 70000
    x = torch.randn(n, device="cuda", dtype=torch.bfloat16).view(-1, 5 if n % 5 == 0 else 1)
    if case == "zero":
        x.zero_()
    elif case == "inf":
        x[-1, -1] = float("inf")
    elif case == "nan":
        x[17, 0] = float("nan")
    elif case == "tiny":
        x = (x.float() * 1e-42)
    elif case == "fp8":
        x = x.to(torch.float8_e4m3fn)
    _need("compute_global_scale", backend, x)
    got = t4.compute_global_scale(x, backend=backend)
    want = t4.compute_global_scale(x, backend="reference")
    _assert_same([got], [want], f"{backend} global scale {case}")
    again = t4.compute_global_scale(x, backend=backend)
    _assert_same([again], [want], f"{backend} global scale {case} (second call)")


@pytest.mark.parametrize("backend", BACKENDS)
def test_cuda_graph_capture_replay(backend):
    x = torch.randn(512, 2048, device="cuda", dtype=torch.bfloat16)
    _need("compute_global_scale", backend, x)

    def step():
        gs = t4.compute_global_scale(x, backend=backend)
        d, s = t4.nvfp4_quantize(x, gs, backend=backend)
        dm, sm = t4.mxfp4_quantize(x, "8x4", backend=backend)
        return gs, d, s, dm, sm, t4.fp4_dequantize(d, s, gs, backend=backend)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    for scale in (3.0, 1e-3):
        x.copy_(torch.randn_like(x) * scale)
        graph.replay()
        torch.cuda.synchronize()
        _common.POISON_OUTPUTS = False
        eager = step()
        _assert_same(captured, eager, f"{backend} graph replay")
        ref = (t4.compute_global_scale(x, backend="reference"),)
        _assert_same(captured[:1], ref, f"{backend} graph replay global scale")


@pytest.mark.parametrize("backend", BACKENDS)
def test_quantize_on_side_stream(backend):
    x = torch.randn(300, 1024, device="cuda", dtype=torch.bfloat16)
    _need("compute_global_scale", backend, x)
    want = t4.nvfp4_quantize(x, t4.compute_global_scale(x, backend="reference"), backend="reference")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got = t4.nvfp4_quantize(x, t4.compute_global_scale(x, backend=backend), backend=backend)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    _assert_same(got, want, f"{backend} side stream")


def test_auto_picks_a_gpu_backend_and_captures():
    x = torch.randn(256, 1024, device="cuda", dtype=torch.bfloat16)
    order = t4.supported_backends("nvfp4_quantize", x, torch.ones(1, device="cuda"), "128x4")
    assert order[0] is not Backend.REFERENCE and order[-1] is Backend.REFERENCE
    t4.nvfp4_quantize(x, t4.compute_global_scale(x))  # warm-up: compiles outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gs = t4.compute_global_scale(x)
        got = t4.nvfp4_quantize(x, gs)
    x.copy_(torch.randn_like(x) * 7)
    graph.replay()
    torch.cuda.synchronize()
    _common.POISON_OUTPUTS = False
    want_gs = t4.compute_global_scale(x, backend="reference")
    _assert_same([gs], [want_gs], "auto global scale in a graph")
    _assert_same(got, t4.nvfp4_quantize(x, want_gs, backend="reference"), "auto quantize in a graph")


@pytest.mark.parametrize("backend", BACKENDS)
def test_pdl_chain_bitexact_eager_and_graph(backend):
    """With programmatic dependent launch on, back-to-back kernels (global scale -> quantize ->
    dequantize, each reading the previous one's output) still match the reference."""
    x = torch.randn(1024, 2048, device="cuda", dtype=torch.bfloat16)
    _need("compute_global_scale", backend, x)

    def chain():
        gs = t4.compute_global_scale(x, backend=backend)
        d, s = t4.nvfp4_quantize(x, gs, backend=backend)
        return gs, d, s, t4.fp4_dequantize(d, s, gs, backend=backend)

    x_first = x.clone()
    t4.set_pdl(True)
    try:
        eager = chain()
        chain()  # warm-up outside capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = chain()
        x.mul_(3.0)
        graph.replay()
        torch.cuda.synchronize()
    finally:
        t4.set_pdl(False)
    _common.POISON_OUTPUTS = False
    for got, xr in ((eager, x_first), (captured, x)):
        gs = t4.compute_global_scale(xr, backend="reference")
        d, s = t4.nvfp4_quantize(xr, gs, backend="reference")
        _assert_same(got, (gs, d, s, t4.fp4_dequantize(d, s, gs, backend="reference")), f"{backend} pdl")
