"""Op registration: torch.library.opcheck, fake == real metadata, torch.compile(fullgraph=True)
with results equal to eager, and the inference-only rule."""
import pytest
import torch
from hypothesis import given, strategies as st
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_fp4 as t4
from torch_fp4 import testing as T
from torch_fp4.backends import Backend

OPS = ("compute_global_scale", "nvfp4_quantize", "mxfp4_quantize", "fp4_dequantize", "fp4_quantized_values", "mm_fp4",
       "route", "fused_moe", "prepack_weight", "unprepack_weight")
ONE_BYTE_FLOATS = (torch.float4_e2m1fn_x2, torch.float8_e4m3fn, torch.float8_e8m0fnu)
SAMPLES = T.op_samples()
_as_list, _bits = T.as_list, T.bits


def test_every_op_is_registered():
    for name in OPS:
        packet = getattr(torch.ops.torch_fp4, name)
        assert packet.default._schema.name == f"torch_fp4::{name}"


@pytest.mark.parametrize("sid,name,args", SAMPLES, ids=[s[0] for s in SAMPLES])
def test_opcheck(sid, name, args):
    # opcheck's schema checker copies and compares inputs with kernels PyTorch lacks for the
    # 1-byte float dtypes (copy_ for float4_e2m1fn_x2, mul for float8); FP4 data and block
    # scales go in as uint8 views, which every op accepts by contract.
    args = tuple(_bits(a) if isinstance(a, torch.Tensor) and a.dtype in ONE_BYTE_FLOATS else a
                 for a in args)
    torch.library.opcheck(getattr(torch.ops.torch_fp4, name).default, args)


@pytest.mark.parametrize("sid,name,args", SAMPLES, ids=[s[0] for s in SAMPLES])
def test_fake_matches_real(sid, name, args):
    op = getattr(torch.ops.torch_fp4, name).default
    real = _as_list(op(*args))
    with FakeTensorMode() as mode:
        fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        fake = _as_list(op(*fake_args))
    assert len(real) == len(fake)
    for r, f in zip(real, fake):
        assert (tuple(f.shape), f.dtype, f.stride()) == (tuple(r.shape), r.dtype, r.stride())


@given(m=st.integers(1, 300), kb=st.integers(1, 12), batch=st.sampled_from([None, 1, 3]),
       layout=st.sampled_from(["128x4", "8x4", "linear"]), mx=st.booleans())
def test_fake_shapes_random(m, kb, batch, layout, mx):
    fmt = t4.MXFP4 if mx else t4.NVFP4
    shape = (m, kb * fmt.block_size) if batch is None else (batch, m, kb * fmt.block_size)
    x = torch.randn(shape)
    if mx:
        call = lambda x: t4.mxfp4_quantize(x, layout)  # noqa: E731
    else:
        call = lambda x: t4.nvfp4_quantize(x, torch.ones(1, device=x.device), layout)  # noqa: E731
    real = call(x)
    with FakeTensorMode() as mode:
        fake = call(mode.from_tensor(x))
    for r, f in zip(real, fake):
        assert (tuple(f.shape), f.dtype, f.stride()) == (tuple(r.shape), r.dtype, r.stride())
    deq = t4.fp4_dequantize(*real, block_size=fmt.block_size, sf_layout=layout)
    assert deq.shape == x.shape


@pytest.mark.slow
@pytest.mark.parametrize("sid,name,args", SAMPLES, ids=[s[0] for s in SAMPLES])
def test_compile_fullgraph_equals_eager(sid, name, args):
    op = getattr(torch.ops.torch_fp4, name).default
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: op(*a), fullgraph=True)
    for e, c in zip(_as_list(op(*args)), _as_list(compiled(*args))):
        assert e.dtype == c.dtype and e.shape == c.shape
        assert torch.equal(_bits(e), _bits(c))


class TinyFP4Block(torch.nn.Module):
    """Attention-free block: NVFP4 W4A4 projection, then an FP4 MoE, then an MXFP4 W4A16 head."""

    def __init__(self):
        super().__init__()
        wq, ws, wgs = T.quantized_weight(64, 64)
        self.register_buffer("wq", wq)
        self.register_buffer("ws", ws)
        self.register_buffer("wgs", wgs)
        moe = T.moe_problem(hidden=64)
        self.moe = {k: v for k, v in moe.items() if k not in ("x", "topk_ids", "topk_weights")}
        self.router = torch.randn(64, 4, dtype=torch.bfloat16)
        hq, hs, _ = T.quantized_weight(40, 64, t4.MXFP4)
        self.register_buffer("hq", hq)
        self.register_buffer("hs", hs)

    def forward(self, x):
        gs = t4.compute_global_scale(x)
        xq, xs = t4.nvfp4_quantize(x, gs)
        h = t4.mm_fp4(xq, self.wq.T, xs, self.ws.T, t4.nvfp4_alpha(gs, self.wgs))
        ids, w = t4.route(h @ self.router, 2, method="renormalize")
        h = h + t4.fused_moe(h, topk_ids=ids, topk_weights=w, **self.moe)
        return t4.mm_fp4(h, self.hq.T, None, self.hs.T, block_size=32, out_dtype=torch.float32)


@pytest.mark.slow
def test_compile_small_model_no_graph_breaks():
    model = TinyFP4Block()
    x = torch.randn(5, 64, dtype=torch.bfloat16)
    eager = model(x)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    assert torch.equal(compiled(x), eager)
    explanation = torch._dynamo.explain(model)(x)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1


def test_backward_raises_inference_only():
    wq, ws, wgs = T.quantized_weight(16, 32)
    a = torch.randn(4, 32, dtype=torch.bfloat16, requires_grad=True)
    out = t4.mm_fp4(a, wq.T, None, ws.T)
    with pytest.raises(RuntimeError, match="inference-only"):
        out.float().sum().backward()


def test_backward_through_quantize_and_moe_raises():
    x = torch.randn(8, 32, requires_grad=True)
    _, scale = t4.nvfp4_quantize(x, torch.ones(1))
    with pytest.raises(RuntimeError, match="inference-only"):
        scale.float().sum().backward()
    kw = T.moe_problem(w4a4=False)
    kw["x"] = kw["x"].detach().requires_grad_()
    with pytest.raises(RuntimeError, match="inference-only"):
        t4.fused_moe(**kw).float().sum().backward()


def test_inference_mode_runs():
    with torch.inference_mode():
        d, s = t4.nvfp4_quantize(torch.randn(4, 16), torch.ones(1))
    assert d.shape == (4, 8) and s.shape == (128, 4)


@pytest.mark.parametrize("backend", ["auto", "reference", Backend.REFERENCE, 1])
def test_backend_names(backend):
    x = torch.randn(3, 32)
    assert torch.equal(_bits(t4.mxfp4_quantize(x, backend=backend)[0]),
                       _bits(t4.mxfp4_quantize(x, backend="reference")[0]))


def test_reference_is_supported_everywhere():
    x = torch.randn(3, 32)
    assert Backend.REFERENCE in t4.supported_backends("mxfp4_quantize", x, t4.SfLayout.parse("128x4"))
