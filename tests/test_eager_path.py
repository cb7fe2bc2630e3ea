"""The eager path (ops._registry.eager): in plain eager mode a public function calls its op's
implementation itself, skipping PyTorch's dispatcher, with results equal bit for bit to the op;
every other context (tracing, fake tensors, dispatch and function modes, the profiler, autograd
recording, tensor subclasses, meta tensors) goes through the op. Validation checks the scalar
arguments the schema would have checked."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

import torch_fp4 as t4
from torch_fp4 import testing as T
from torch_fp4.ops import _registry, gemm, moe, quantize

SAMPLES = T.op_samples()
_as_list, _bits = T.as_list, T.bits

# op -> (module holding the public function and its `<op>_op`)
_MODULES = {"compute_global_scale": quantize, "nvfp4_quantize": quantize, "mxfp4_quantize": quantize,
            "fp4_dequantize": quantize, "mm_fp4": gemm, "route": moe, "fused_moe": moe}
_MOE_KEYWORDS = ("a1_global_scale", "a2_global_scale", "local_expert_offset", "num_local_experts",
                 "out_dtype", "backend", "block_size", "w1_bias", "w2_bias", "activation", "swiglu_alpha",
                 "swiglu_limit", "activations", "weight_layout")


def _public_call(name, args):
    fn = getattr(t4, name)
    if name == "fused_moe":
        return fn(*args[:9], **dict(zip(_MOE_KEYWORDS, args[9:])))
    return fn(*args)


class _Log(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def _refuse(*args, **kwargs):
    raise AssertionError("the dispatcher was used in plain eager mode")


@pytest.mark.parametrize("sid,name,args", [s for s in SAMPLES if s[1] in _MODULES], ids=lambda v: v
                         if isinstance(v, str) else "")
def test_plain_eager_skips_the_dispatcher_with_equal_bits(monkeypatch, sid, name, args):
    through_op = _as_list(getattr(torch.ops.torch_fp4, name).default(*args))
    monkeypatch.setattr(_MODULES[name], f"{name}_op", _refuse)
    direct = _as_list(_public_call(name, args))
    assert len(direct) == len(through_op)
    for d, o in zip(direct, through_op):
        assert (d.dtype, d.shape, d.stride()) == (o.dtype, o.shape, o.stride())
        assert torch.equal(_bits(d), _bits(o))


def test_other_contexts_go_through_the_op():
    x = torch.randn(4, 64)
    with _Log() as log:
        t4.compute_global_scale(x)
    assert "torch_fp4.compute_global_scale.default" in log.ops
    with FakeTensorMode() as mode:
        gs = t4.compute_global_scale(mode.from_tensor(x))
    assert gs.shape == (1,)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        t4.compute_global_scale(x)
    assert any(e.name == "torch_fp4::compute_global_scale" for e in prof.events())


def test_eager_is_refused_where_the_dispatcher_matters():
    x = torch.randn(4, 64)
    assert _registry.eager(x, None)
    assert not _registry.eager(x.as_subclass(type("Sub", (torch.Tensor,), {})))
    assert not _registry.eager(torch.empty(4, 64, device="meta"))
    with torch.device("cpu"):                       # a torch-function mode
        assert not _registry.eager(x)
    with _Log():
        assert not _registry.eager(x)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        assert not _registry.eager(x)
    w = torch.randn(4, 64, requires_grad=True)
    assert not _registry.eager(w)                   # autograd would record the call
    with torch.no_grad():
        assert _registry.eager(w)
    seen = []
    torch.func.vmap(lambda r: seen.append(_registry.eager(r)) or r)(torch.randn(2, 3))
    assert seen == [False]                          # under a functorch transform


def test_an_input_that_requires_grad_runs_the_op_and_refuses_backward():
    wq, ws, _ = T.quantized_weight(128, 64)
    x = torch.randn(2, 64, dtype=torch.bfloat16, requires_grad=True)
    out = t4.mm_fp4(x, wq.T, None, ws.T)
    assert out.requires_grad
    with pytest.raises(RuntimeError, match="inference-only"):
        out.sum().backward()


@pytest.mark.parametrize("call,message", [
    (lambda: t4.route(torch.randn(6, 4), 2.0), "route: top_k: expected an int, got 2.0"),
    (lambda: t4.route(torch.randn(6, 4), 2, renormalize=1), "route: renormalize: expected a bool, got 1"),
    (lambda: t4.mm_fp4(torch.randn(2, 64, dtype=torch.bfloat16), *_weight(), block_size=16.0),
     "mm_fp4: block_size: expected 16 .NVFP4. or 32 .MXFP4., got 16.0"),
    (lambda: t4.fp4_dequantize(*t4.nvfp4_quantize(torch.randn(2, 64), torch.ones(1)), block_size=True),
     "fp4_dequantize: block_size: expected 16 .NVFP4. or 32 .MXFP4., got True"),
    (lambda: t4.fused_moe(**T.moe_problem(w4a4=False), local_expert_offset=0.0),
     "fused_moe: local_expert_offset: expected an int, got 0.0"),
])
def test_scalar_arguments_of_the_wrong_type_raise_naming_them(call, message):
    for _ in range(2):     # also once a plan for the int value exists
        with pytest.raises(TypeError, match=message):
            call()


def _weight():
    wq, ws, _ = T.quantized_weight(128, 64)
    return wq.T, None, ws.T


def test_a_plan_is_never_reused_for_an_equal_value_of_another_type():
    logits = torch.randn(6, 4)
    t4.route(logits, 2)
    with pytest.raises(TypeError, match="top_k"):
        t4.route(logits, 2.0)
    t4.route(logits, 1)
    for same in (1.0, True):
        with pytest.raises(TypeError, match="top_k"):
            t4.route(logits, same)
