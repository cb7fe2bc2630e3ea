"""FP4Linear and quantize_model: same numbers as the ops they wrap, close to the dense layer,
robust storage (dtype casts, state_dict), torch.compile(fullgraph=True)."""
import re
import warnings

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import torch_fp4 as t4
from torch_fp4.nn import FP4Linear, QuantConfig, quantize_model


def _linear(k=64, n=48, bias=True, dtype=torch.bfloat16, seed=0):
    torch.manual_seed(seed)
    lin = torch.nn.Linear(k, n, bias=bias).to(dtype)
    return lin


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("activations", ["bf16", "fp4"])
def test_from_linear_matches_ops_and_dense(fmt, activations):
    lin = _linear()
    mod = FP4Linear.from_linear(lin, fmt, activations)
    x = torch.randn(2, 5, 64, dtype=torch.bfloat16)
    y = mod(x)
    assert y.shape == (2, 5, 48) and y.dtype == torch.bfloat16
    # the same computation spelled out with the ops
    w = lin.weight.detach()
    a = x.reshape(-1, 64)
    if fmt == "nvfp4":
        gw = t4.compute_global_scale(w)
        wq, ws = t4.nvfp4_quantize(w, gw)
        if activations == "bf16":
            ref = t4.mm_fp4(a, wq.T, None, ws.T, t4.nvfp4_alpha(None, gw), out_dtype=torch.float32)
        else:
            ga = t4.compute_global_scale(a)
            aq, as_ = t4.nvfp4_quantize(a, ga)
            ref = t4.mm_fp4(aq, wq.T, as_, ws.T, t4.nvfp4_alpha(ga, gw), out_dtype=torch.float32)
    else:
        wq, ws = t4.mxfp4_quantize(w)
        if activations == "bf16":
            ref = t4.mm_fp4(a, wq.T, None, ws.T, block_size=32, out_dtype=torch.float32)
        else:
            aq, as_ = t4.mxfp4_quantize(a)
            ref = t4.mm_fp4(aq, wq.T, as_, ws.T, block_size=32, out_dtype=torch.float32)
    # the bias in fp32 before the one rounding (mm_fp4's bias; spec section 5)
    ref = (ref + lin.bias.detach().float()).to(torch.bfloat16).reshape(2, 5, 48)
    assert torch.equal(y, ref)
    assert _rel(y, lin(x)) < (0.2 if activations == "bf16" else 0.3)


def test_storage_survives_dtype_casts_and_state_dict():
    mod = FP4Linear.from_linear(_linear(), "nvfp4")
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    before = mod(x)
    gs = mod.weight_global_scale.clone()
    mod.half()
    mod.to(torch.bfloat16)
    assert torch.equal(mod.weight_global_scale, gs) and mod.weight.dtype == torch.uint8
    assert torch.equal(mod(x), before)
    fresh = FP4Linear(64, 48, bias=True, fmt="nvfp4")
    fresh.load_state_dict(mod.state_dict())
    assert torch.equal(fresh(x), before)


def test_fp32_input_returns_fp32():
    mod = FP4Linear.from_linear(_linear(), "nvfp4")
    y = mod(torch.randn(4, 64))
    assert y.dtype == torch.float32


def test_static_input_scale_w4a4():
    lin = _linear()
    mod = FP4Linear.from_linear(lin, "nvfp4", "fp4")
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    gs_a = torch.tensor([2688.0 / 3.0])
    mod.set_quantized(mod.weight, mod.weight_scale, mod.weight_global_scale.clone(), gs_a)
    aq, as_ = t4.nvfp4_quantize(x, gs_a)
    want = (t4.mm_fp4(aq, mod.weight.T, as_, mod.weight_scale.T, t4.nvfp4_alpha(gs_a, mod.weight_global_scale),
                      out_dtype=torch.float32) + lin.bias.detach().float()).to(torch.bfloat16)
    assert torch.equal(mod(x), want)


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match=r"in_features: expected a positive multiple of 16 \(the NVFP4 block size\), got 40"):
        FP4Linear(40, 8)
    with pytest.raises(ValueError, match="activations"):
        FP4Linear(32, 8, activations="int4")
    mod = FP4Linear(32, 8)
    with pytest.raises(ValueError, match=r"x: expected at least 1-D with last dimension 32 \(in_features\)"):
        mod(torch.randn(2, 16, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="scale: expected a 1-byte tensor of shape"):
        mod.set_quantized(mod.weight, torch.zeros(8, 2, dtype=torch.uint8))


@pytest.mark.parametrize("activations", ["bf16", "fp4"])
def test_output_has_the_input_dtype(activations):
    # fp64 is computed as fp32 is (x rounded to compute_dtype, fp32 GEMM output) and widened
    mod = FP4Linear.from_linear(_linear(), "nvfp4", activations)
    x = torch.randn(2, 3, 64, dtype=torch.float64)
    y = mod(x)
    assert y.dtype == torch.float64 and y.shape == (2, 3, 48)
    assert torch.equal(y, mod(x.to(torch.bfloat16).float()).double())
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        assert mod(x.to(dtype)).dtype == dtype


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.bool,
                                   torch.float8_e4m3fn, torch.complex64])
def test_inputs_of_other_dtypes_are_refused(dtype):
    mod = FP4Linear(32, 8)
    x = torch.ones(2, 32).to(dtype)
    with pytest.raises(TypeError, match=r"^FP4Linear: x: expected dtype bfloat16, float16, float32 "
                                        r"or float64, got " + re.escape(str(dtype)) + "$"):
        mod(x)
    with pytest.raises(TypeError, match=r"^FP4Linear: x: expected a torch.Tensor, got list$"):
        mod([[1.0] * 32])


def test_zero_dimensional_input_is_refused():
    mod = FP4Linear(32, 8)
    with pytest.raises(ValueError, match=r"^FP4Linear: x: expected at least 1-D with last dimension "
                                         r"32 \(in_features\), got shape \(\)$"):
        mod(torch.tensor(1.0))
    with pytest.raises(ValueError, match=r"^FP4Linear: x: expected at least 1-D with last dimension "
                                         r"32 \(in_features\), got shape \(2, 16\)$"):
        mod(torch.randn(2, 16))


@pytest.mark.parametrize("args,exc,message", [
    ((0, 8), ValueError, "in_features: expected a positive multiple of 16 (the NVFP4 block size), got 0"),
    ((-16, 8), ValueError, "in_features: expected a positive multiple of 16 (the NVFP4 block size), got -16"),
    ((32, 0), ValueError, "out_features: expected a positive int, got 0"),
    ((32, -8), ValueError, "out_features: expected a positive int, got -8"),
    ((32.0, 8), TypeError, "in_features: expected an int, got 32.0"),
    ((32, "8"), TypeError, "out_features: expected an int, got '8'"),
    ((32, True), TypeError, "out_features: expected an int, got True"),
])
def test_bad_sizes_name_themselves(args, exc, message):
    with pytest.raises(exc, match="^" + re.escape("FP4Linear: " + message) + "$"):
        FP4Linear(*args)
    with pytest.raises(ValueError, match=r"^FP4Linear: in_features: expected a positive multiple of "
                                         r"32 \(the MXFP4 block size\), got 48$"):
        FP4Linear(48, 8, fmt="mxfp4")

class _MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(64, 128)
        self.odd = torch.nn.Linear(40, 40)       # in_features not a multiple of 16
        self.down = torch.nn.Linear(128, 40)
        self.head = torch.nn.Linear(40, 8)

    def forward(self, x):
        return self.head(self.down(torch.relu(self.up(x))) + self.odd(torch.ones_like(x[..., :40])))


def test_quantize_model_swaps_and_reports_skips():
    model = _MLP().to(torch.bfloat16)
    with pytest.warns(UserWarning, match=r"odd \(in_features=40\).*head \(in_features=40\)"):
        quantize_model(model)
    assert isinstance(model.up, FP4Linear) and isinstance(model.down, FP4Linear)
    assert isinstance(model.odd, torch.nn.Linear) and not isinstance(model.odd, FP4Linear)
    assert model(torch.randn(2, 64, dtype=torch.bfloat16)).shape == (2, 8)


def test_quantize_model_filters():
    model = _MLP().to(torch.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        quantize_model(model, QuantConfig(include="up"))
    assert isinstance(model.up, FP4Linear) and not isinstance(model.down, FP4Linear)
    model = _MLP().to(torch.bfloat16)
    quantize_model(model, QuantConfig(fmt="mxfp4", include=lambda n, m: m.in_features % 32 == 0,
                                      exclude="down"))
    assert isinstance(model.up, FP4Linear) and model.up.fmt is t4.MXFP4
    assert not isinstance(model.down, FP4Linear)


def test_quantize_model_checks_its_arguments():
    with pytest.raises(TypeError, match=r"^quantize_model: model: expected an nn.Module, got str$"):
        quantize_model("str")
    for config, got in (({"fmt": "nvfp4"}, "dict"), ("nvfp4", "str"), (None, "NoneType")):
        with pytest.raises(TypeError, match=rf"^quantize_model: config: expected a QuantConfig, got {got}$"):
            quantize_model(_MLP(), config)
    with pytest.raises(ValueError, match=r"^QuantConfig: fmt: expected 'nvfp4' or 'mxfp4', got 'int4'$"):
        QuantConfig(fmt="int4")
    with pytest.raises(ValueError, match=r"^QuantConfig: activations: expected 'bf16' \(W4A16\) or "
                                         r"'fp4' \(W4A4\), got 'int4'$"):
        QuantConfig(activations="int4")
    with pytest.raises(TypeError, match=r"^QuantConfig: exclude: expected None, a glob string or a "
                                        r"predicate \(name, module\) -> bool, got int$"):
        QuantConfig(exclude=3)

@pytest.mark.slow
@pytest.mark.parametrize("activations", ["bf16", "fp4"])
def test_quantized_model_compiles_fullgraph(activations):
    # ReLU is exact in any form, so compiled and eager results must agree bit for bit
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64))
    model = quantize_model(model.to(torch.bfloat16), QuantConfig(activations=activations))
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    eager = model(x)
    torch._dynamo.reset()
    assert torch.equal(torch.compile(model, fullgraph=True)(x), eager)


def test_from_checkpoint_uses_the_stored_weight():
    from torch_fp4 import checkpoint as ckpt
    lin = _linear(k=96, n=40)
    ref_mod = FP4Linear.from_linear(lin, "nvfp4")
    tensors = {
        "layer.weight_packed": ref_mod.weight.clone(),
        "layer.weight_scale": t4.formats.unswizzle(ref_mod.weight_scale, 40, 6, "128x4").view(torch.float8_e4m3fn).clone(),
        "layer.weight_global_scale": ref_mod.weight_global_scale.clone(),
    }
    w = ckpt.load_nvfp4(tensors, "layer", "compressed-tensors")
    mod = FP4Linear.from_checkpoint(w, bias=lin.bias)
    x = torch.randn(7, 96, dtype=torch.bfloat16)
    assert torch.equal(mod(x), ref_mod(x))


# -- FP4MoE ------------------------------------------------------------------------------------
_VIEWS = {"reshape", "view", "numpy_T", "t", "permute", "detach", "alias", "expand", "_unsafe_view"}


class _OpRecorder(TorchDispatchMode):
    """The ops a call dispatches at the top level (an op's own implementation is not entered)."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.overloadpacket.__name__ if func.namespace == "aten" else f"{func.namespace}.{func._opname}")
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("activations,bias", [("bf16", False), ("fp4", False), ("bf16", True)])
def test_forward_is_one_mm_fp4_call(activations, bias):
    """FP4Linear's forward computes nothing beside the one mm_fp4 call: mm_fp4 forms alpha from
    the global scales and adds the bias, so no torch op (one launch each on the GPU) does."""
    lin = FP4Linear.from_linear(torch.nn.Linear(64, 32, bias=bias).to(torch.bfloat16), activations=activations)
    if activations == "fp4":
        lin.calibrate(torch.randn(4, 64))
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    with torch.inference_mode(), _OpRecorder() as rec:
        lin(x)
    work = [op for op in rec.ops if op not in _VIEWS and op != "to"]   # bias.to(bf16): no copy
    assert work == ["torch_fp4.mm_fp4"], rec.ops


from torch_fp4.nn import FP4MoE  # noqa: E402

H, I, E = 64, 32, 4


def _experts(seed=0):
    g = torch.Generator().manual_seed(seed)
    router = torch.nn.Linear(H, E, bias=False).to(torch.bfloat16)
    router.weight.data.copy_(torch.randn(E, H, generator=g) / H ** 0.5)
    w1 = (torch.randn(E, 2 * I, H, generator=g) / H ** 0.5).to(torch.bfloat16)
    w2 = (torch.randn(E, H, I, generator=g) / I ** 0.5).to(torch.bfloat16)
    return router, w1, w2


def _moe_by_ops(x, router, w1, w2, top_k, method, a1=None, a2=None, **route_kw):
    a = x.reshape(-1, H)
    gs1 = torch.cat([t4.compute_global_scale(w) for w in w1])
    gs2 = torch.cat([t4.compute_global_scale(w) for w in w2])
    w1q, w1s = t4.nvfp4_quantize(w1, gs1)
    w2q, w2s = t4.nvfp4_quantize(w2, gs2)
    ids, wts = t4.route(router(a), top_k, method, **route_kw)
    out = t4.fused_moe(a, w1q, w1s, gs1, w2q, w2s, gs2, ids, wts, a1_global_scale=a1, a2_global_scale=a2)
    return out.reshape(x.shape)


def _moe_dense(x, router, w1, w2, top_k, method):
    a = x.reshape(-1, H).float()
    ids, wts = t4.route(router(x.reshape(-1, H)), top_k, method)
    out = torch.zeros_like(a)
    for j in range(top_k):
        e = ids[:, j].long()
        h = torch.einsum("th,tnh->tn", a, w1[e].float())
        act = torch.nn.functional.silu(h[:, :I]) * h[:, I:]
        out += wts[:, j:j + 1] * torch.einsum("ti,thi->th", act, w2[e].float())
    return out.reshape(x.shape)


def test_fp4moe_w4a16_matches_ops_and_dense():
    router, w1, w2 = _experts()
    mod = FP4MoE.from_experts(router, w1, w2, top_k=2, method="renormalize")
    x = torch.randn(3, 5, H, dtype=torch.bfloat16)
    y = mod(x)
    assert y.shape == x.shape and y.dtype == torch.bfloat16
    assert torch.equal(y, _moe_by_ops(x, router, w1, w2, 2, "renormalize"))
    assert _rel(y, _moe_dense(x, router, w1, w2, 2, "renormalize")) < 0.25
    assert mod.router is not router and not mod.router.weight.requires_grad
    assert mod(x.float()).dtype == torch.float32


def test_fp4moe_accepts_per_expert_linears():
    router, w1, w2 = _experts()
    want = FP4MoE.from_experts(router, w1, w2, top_k=2)
    linear = []
    for e in range(E):
        gate, up, down = (torch.nn.Linear(k, n, bias=False).to(torch.bfloat16)
                          for k, n in ((H, I), (H, I), (I, H)))
        gate.weight.data.copy_(w1[e, :I])
        up.weight.data.copy_(w1[e, I:])
        down.weight.data.copy_(w2[e])
        linear.append((gate, up, down))
    for got in (FP4MoE.from_experts(router, [(g, u) for g, u, _ in linear], [d for *_, d in linear], top_k=2),
                FP4MoE.from_experts(router, list(w1), list(w2), top_k=2)):
        for name, buf in want.named_buffers():
            assert torch.equal(buf, got.get_buffer(name)), name


def test_fp4moe_w4a4_calibrated_and_given():
    router, w1, w2 = _experts()
    calib = torch.randn(64, H, dtype=torch.bfloat16)
    mod = FP4MoE.from_experts(router, w1, w2, top_k=2, activations="fp4", calibration=calib)
    assert torch.equal(mod.a1_global_scale, t4.compute_global_scale(calib))
    assert mod.a2_global_scale.shape == (E,) and bool((mod.a2_global_scale > 0).all())
    x = torch.randn(7, H, dtype=torch.bfloat16)
    want = _moe_by_ops(x, router, w1, w2, 2, "softmax", mod.a1_global_scale, mod.a2_global_scale)
    assert torch.equal(mod(x), want)
    assert _rel(mod(x), _moe_dense(x, router, w1, w2, 2, "softmax")) < 0.35
    # the same scales given, from checkpoint-style tensors (linear-layout block scales)
    gs1 = torch.cat([t4.compute_global_scale(w) for w in w1])
    gs2 = torch.cat([t4.compute_global_scale(w) for w in w2])
    w1q, w1s = t4.nvfp4_quantize(w1, gs1, "linear")
    w2q, w2s = t4.nvfp4_quantize(w2, gs2, "linear")
    given = FP4MoE.from_quantized(router, w1q, w1s, gs1, w2q, w2s, gs2, top_k=2, activations="fp4",
                                  a1_global_scale=mod.a1_global_scale.clone(),
                                  a2_global_scale=mod.a2_global_scale.clone(), sf_layout="linear")
    assert torch.equal(given(x), want)


def test_fp4moe_deepseek_v3_routing():
    router, w1, w2 = _experts()
    bias = torch.randn(E) * 0.1
    kw = dict(top_k=2, method="deepseek_v3", n_group=2, topk_group=1, routed_scaling_factor=2.5)
    mod = FP4MoE.from_experts(router, w1, w2, routing_bias=bias, **kw)
    x = torch.randn(6, H, dtype=torch.bfloat16)
    want = _moe_by_ops(x, router, w1, w2, kw.pop("top_k"), kw.pop("method"), bias=bias, **kw)
    assert torch.equal(mod(x), want)


def test_fp4moe_storage_survives_casts_and_state_dict():
    router, w1, w2 = _experts()
    mod = FP4MoE.from_experts(router, w1, w2, top_k=2, activations="fp4",
                              calibration=torch.randn(16, H, dtype=torch.bfloat16))
    x = torch.randn(4, H, dtype=torch.bfloat16)
    before, buffers = mod(x), {n: b.clone() for n, b in mod.named_buffers()}
    mod.half().to(torch.bfloat16)
    assert all(torch.equal(b, buffers[n]) for n, b in mod.named_buffers())
    assert torch.equal(mod(x), before)
    fresh = FP4MoE(H, I, E, top_k=2, activations="fp4")
    fresh.load_state_dict(mod.state_dict())
    assert torch.equal(fresh(x), before)


class _MoEModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(H, H, bias=False)
        self.moe = FP4MoE.from_experts(*_experts(), top_k=2)

    def forward(self, x):
        return self.moe(self.proj(x))


def test_quantize_model_leaves_fp4moe_alone():
    model = _MoEModel().to(torch.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        quantize_model(model)
    assert isinstance(model.proj, FP4Linear)
    assert type(model.moe.router) is torch.nn.Linear
    alone = FP4MoE.from_experts(*_experts(), top_k=2)
    assert quantize_model(alone) is alone and type(alone.router) is torch.nn.Linear
    assert model(torch.randn(2, H, dtype=torch.bfloat16)).shape == (2, H)


def test_fp4moe_bad_arguments_name_themselves():
    router, w1, w2 = _experts()
    with pytest.raises(ValueError, match="activations: expected 'bf16'"):
        FP4MoE(H, I, E, top_k=2, activations="int4")
    with pytest.raises(ValueError, match="hidden_size: expected a positive multiple of 16.*got 40"):
        FP4MoE(40, I, E, top_k=2)
    with pytest.raises(ValueError, match=r"top_k: expected 1 <= top_k <= 4"):
        FP4MoE(H, I, E, top_k=5)
    with pytest.raises(ValueError, match="calibration: expected sample inputs"):
        FP4MoE.from_experts(router, w1, w2, top_k=2, activations="fp4")
    with pytest.raises(TypeError, match="router: expected an nn.Linear"):
        FP4MoE.from_experts(w1, w1, w2, top_k=2)
    with pytest.raises(ValueError, match="routing_bias: expected a \\[E\\] correction-bias"):
        FP4MoE.from_experts(router, w1, w2, top_k=2, method="deepseek_v3")
    with_bias = [torch.nn.Linear(H, 2 * I) for _ in range(E)]
    with pytest.raises(ValueError, match=r"w1\[0\]: expected an nn.Linear without bias"):
        FP4MoE.from_experts(router, with_bias, w2, top_k=2)
    with pytest.raises(ValueError, match=r"w2: expected shape \(4, 64, 32\)"):
        FP4MoE.from_experts(router, w1, w2[:, :, :16], top_k=2)
    with pytest.raises(ValueError, match="a2_global_scale: expected an fp32 tensor of shape"):
        FP4MoE.from_experts(router, w1, w2, top_k=2).set_activation_scales(
            torch.ones(1), torch.ones(3))
    mod = FP4MoE.from_experts(router, w1, w2, top_k=2)
    with pytest.raises(ValueError, match=r"x: expected at least 1-D with last dimension 64 \(hidden_size\)"):
        mod(torch.randn(2, 32, dtype=torch.bfloat16))


@pytest.mark.parametrize("activations", ["bf16", "fp4"])
def test_fp4moe_output_has_the_input_dtype(activations):
    router, w1, w2 = _experts()
    x = torch.randn(3, 5, H, dtype=torch.float64)
    mod = FP4MoE.from_experts(router, w1, w2, top_k=2, activations=activations,
                              calibration=x.to(torch.bfloat16))
    y = mod(x)
    assert y.dtype == torch.float64 and y.shape == x.shape
    assert torch.equal(y, mod(x.to(torch.bfloat16).float()).double())
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        assert mod(x.to(dtype)).dtype == dtype


def test_fp4moe_refuses_bad_inputs():
    mod = FP4MoE.from_experts(*_experts(), top_k=2)
    for where, call in (("forward", mod), ("calibrate", mod.calibrate)):
        for dtype in (torch.int64, torch.bool, torch.float8_e4m3fn):
            with pytest.raises(TypeError, match=rf"^FP4MoE.{where}: x: expected dtype bfloat16, "
                                                rf"float16, float32 or float64, got {dtype}$"):
                call(torch.ones(2, H).to(dtype))
        with pytest.raises(ValueError, match=rf"^FP4MoE.{where}: x: expected at least 1-D with last "
                                             rf"dimension {H} \(hidden_size\), got shape \(\)$"):
            call(torch.tensor(1.0))


@pytest.mark.parametrize("kwargs,exc,message", [
    (dict(hidden_size=64.0), TypeError, "hidden_size: expected an int, got 64.0"),
    (dict(intermediate_size="32"), TypeError, "intermediate_size: expected an int, got '32'"),
    (dict(num_experts=4.0), TypeError, "num_experts: expected an int, got 4.0"),
    (dict(num_experts=True), TypeError, "num_experts: expected an int, got True"),
    (dict(hidden_size=0), ValueError, "hidden_size: expected a positive multiple of 16 (the NVFP4 block size), got 0"),
    (dict(intermediate_size=-16), ValueError, "intermediate_size: expected a positive multiple of 16 (the NVFP4 block size), got -16"),
    (dict(num_experts=0), ValueError, "num_experts: expected a positive int, got 0"),
    (dict(num_experts=-1), ValueError, "num_experts: expected a positive int, got -1"),
])
def test_fp4moe_bad_sizes_name_themselves(kwargs, exc, message):
    args = dict(hidden_size=H, intermediate_size=I, num_experts=E, top_k=1)
    with pytest.raises(exc, match="^" + re.escape("FP4MoE: " + message) + "$"):
        FP4MoE(**{**args, **kwargs})

@pytest.mark.slow
@pytest.mark.parametrize("activations", ["bf16", "fp4"])
def test_fp4moe_compiles_fullgraph(activations):
    router, w1, w2 = _experts()
    x = torch.randn(2, 5, H, dtype=torch.bfloat16)
    mod = FP4MoE.from_experts(router, w1, w2, top_k=2, method="renormalize",
                              activations=activations, calibration=x)
    eager = mod(x)
    torch._dynamo.reset()
    assert torch.equal(torch.compile(mod, fullgraph=True)(x), eager)


def test_fp4moe_from_quantized_checks_scale_layout():
    router, w1, w2 = _experts()
    gs1 = torch.cat([t4.compute_global_scale(w) for w in w1])
    gs2 = torch.cat([t4.compute_global_scale(w) for w in w2])
    w1q, w1s = t4.nvfp4_quantize(w1, gs1, "linear")
    w2q, w2s = t4.nvfp4_quantize(w2, gs2, "linear")
    with pytest.raises(ValueError, match="sf_layout: expected '128x4' or 'linear', got '8x4'"):
        FP4MoE.from_quantized(router, w1q, w1s, gs1, w2q, w2s, gs2, top_k=2, sf_layout="8x4")
    with pytest.raises(ValueError, match=r"w1_scale: expected a 1-byte tensor of shape \(4, 64, 4\)"):
        FP4MoE.from_quantized(router, w1q, w1s[:, :32], gs1, w2q, w2s, gs2, top_k=2, sf_layout="linear")
    with pytest.raises(ValueError, match=r"w1_scale: expected a 1-byte tensor of shape \(4, 128, 4\)"):
        FP4MoE.from_quantized(router, w1q, w1s, gs1, w2q, w2s, gs2, top_k=2)   # linear as 128x4
    with pytest.raises(ValueError, match="a1_global_scale: expected a1_global_scale and a2_global_scale"):
        FP4MoE.from_quantized(router, w1q, w1s, gs1, w2q, w2s, gs2, top_k=2, sf_layout="linear",
                              activations="fp4")


# -- batch invariance of W4A4 ------------------------------------------------------------------
def _batches(tok, k, seed=1):
    """(batch, row of tok) pairs: random neighbours, zero padding rows, a huge-magnitude row,
    and a 3-D padded batch."""
    g = torch.Generator().manual_seed(seed)
    others = torch.randn(7, k, generator=g).to(tok.dtype)
    zeros = torch.zeros(4, k, dtype=tok.dtype)
    huge = (3e4 * torch.randn(1, k, generator=g)).to(tok.dtype)
    tiny = (1e-3 * torch.randn(2, k, generator=g)).to(tok.dtype)
    yield torch.cat([tok, others]), 0
    yield torch.cat([others[:3], tok, others[3:]]), 3
    yield torch.cat([others, tok, zeros]), 7
    yield torch.cat([zeros[:1], tok, huge]), 1
    yield torch.cat([huge, tiny, tok]), 3
    padded = torch.cat([others[:2], tok, zeros[:1], others[2:5], zeros[:1]]).reshape(2, 4, k)
    yield padded, (0, 2)


def _assert_batch_invariant(mod, k, seed=1):
    g = torch.Generator().manual_seed(seed + 100)
    for _ in range(2):
        tok = torch.randn(1, k, generator=g).to(torch.bfloat16)
        alone = mod(tok)[0]
        for batch, row in _batches(tok, k, seed):
            assert torch.equal(mod(batch)[row], alone), row


def test_w4a4_nvfp4_dynamic_scale_depends_on_the_batch():
    # Documented behaviour: the per-call global scale spans the whole batch.
    mod = FP4Linear.from_linear(_linear(), "nvfp4", "fp4")
    assert not mod.static_input_scale
    tok = torch.randn(1, 64, dtype=torch.bfloat16)
    alone = mod(tok)[0]
    big = torch.cat([tok, (1e3 * torch.randn(1, 64)).to(torch.bfloat16)])
    assert not torch.equal(mod(big)[0], alone)


def test_w4a4_mxfp4_is_batch_invariant_without_calibration():
    mod = FP4Linear.from_linear(_linear(), "mxfp4", "fp4")
    _assert_batch_invariant(mod, 64)


def test_w4a16_is_batch_invariant():
    mod = FP4Linear.from_linear(_linear(), "nvfp4", "bf16")
    _assert_batch_invariant(mod, 64)


def test_calibrate_fixes_the_input_scale():
    mod = FP4Linear.from_linear(_linear(), "nvfp4", "fp4")
    x = torch.randn(3, 5, 64) * 4                       # fp32: the scale is that of x in bf16
    mod.calibrate(x)
    assert mod.static_input_scale
    assert torch.equal(mod.input_global_scale, t4.compute_global_scale(x.to(torch.bfloat16)))
    _assert_batch_invariant(mod, 64)
    # the fixed scale is the one the dynamic mode computes on the whole calibration input
    dyn = FP4Linear.from_linear(_linear(), "nvfp4", "fp4")
    assert torch.equal(mod(x), dyn(x))


def test_calibrate_refuses_layers_without_an_input_scale():
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"^FP4Linear.calibrate: fmt: expected 'nvfp4' \(MXFP4 has "
                                         r"no global scale.*got 'mxfp4'$"):
        FP4Linear.from_linear(_linear(), "mxfp4", "fp4").calibrate(x)
    with pytest.raises(ValueError, match=r"^FP4Linear.calibrate: activations: expected 'fp4' .*got 'bf16'$"):
        FP4Linear.from_linear(_linear(), "nvfp4", "bf16").calibrate(x)
    mod = FP4Linear.from_linear(_linear(), "nvfp4", "fp4")
    with pytest.raises(ValueError, match=r"^FP4Linear.calibrate: x: expected at least one token, got shape \(0, 64\)$"):
        mod.calibrate(x[:0])
    with pytest.raises(ValueError, match=r"FP4Linear.calibrate: x: expected at least 1-D with last dimension 64"):
        mod.calibrate(x[:, :32])
    assert not mod.static_input_scale


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(64, 128)
        self.down = torch.nn.Linear(128, 64)
        self.unused = torch.nn.Linear(64, 32)

    def forward(self, x, gain=1.0):
        return self.down(torch.relu(self.up(x * gain)))


def _net():
    torch.manual_seed(0)
    return _Net().to(torch.bfloat16)


def test_quantize_model_calibration_fixes_each_input_scale():
    x = torch.randn(6, 64, dtype=torch.bfloat16)
    with pytest.warns(UserWarning, match=r"calibration: 1 layer\(s\) saw no input .*: unused$"):
        model = quantize_model(_net(), QuantConfig(activations="fp4"), calibration=x)
    assert model.up.static_input_scale and model.down.static_input_scale
    assert not model.unused.static_input_scale and model.up.activations == "fp4"
    # each layer's scale is that of the inputs it sees with FP4 weights and unquantized inputs
    dense = _net()
    up16 = FP4Linear.from_linear(dense.up, "nvfp4", "bf16")
    assert torch.equal(model.up.input_global_scale, t4.compute_global_scale(x))
    assert torch.equal(model.down.input_global_scale, t4.compute_global_scale(torch.relu(up16(x))))
    for name in ("up", "down"):
        _assert_batch_invariant(getattr(model, name), getattr(model, name).in_features)
    # the whole model too: one token alone and inside batches
    tok = torch.randn(1, 64, dtype=torch.bfloat16)
    alone = model(tok)[0]
    for batch, row in _batches(tok, 64):
        assert torch.equal(model(batch)[row], alone)


def test_quantize_model_calibration_forms_and_accumulation():
    x = torch.randn(2, 3, 64, dtype=torch.bfloat16)
    scales = []
    for calibration in (x, (x,), {"x": x}, (x, 2.0), {"x": x, "gain": 2.0}):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            m = quantize_model(_net(), QuantConfig(activations="fp4", exclude="unused"),
                               calibration=calibration)
        scales.append((m.up.input_global_scale.clone(), m.down.input_global_scale.clone()))
    for s in scales[1:3]:
        assert torch.equal(s[0], scales[0][0]) and torch.equal(s[1], scales[0][1])
    for s in scales[3:]:
        assert torch.equal(s[0], t4.compute_global_scale(x * 2.0))

    class _Twice(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(64, 64)

        def forward(self, a, b):
            return self.lin(a), self.lin(b)

    a = torch.randn(3, 64, dtype=torch.bfloat16)
    b = 5 * torch.randn(4, 64, dtype=torch.bfloat16)
    m = quantize_model(_Twice().to(torch.bfloat16), QuantConfig(activations="fp4"), calibration=(a, b))
    assert torch.equal(m.lin.input_global_scale, t4.compute_global_scale(torch.cat([a, b])))


def test_quantize_model_calibration_checks_its_argument():
    x = torch.randn(2, 64, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match=r"^quantize_model: calibration: expected None, a tensor, a "
                                        r"tuple of positional arguments or a dict of keyword "
                                        r"arguments, got list$"):
        quantize_model(_net(), QuantConfig(activations="fp4"), calibration=[x])
    for config in (QuantConfig(), QuantConfig(fmt="mxfp4", activations="fp4")):
        model = _net()
        with pytest.raises(ValueError, match=r"^quantize_model: calibration: expected None unless "
                                             r"fmt='nvfp4' and activations='fp4'"):
            quantize_model(model, config, calibration=x)
        assert not isinstance(model.up, FP4Linear)      # refused before anything is converted


def test_checkpoint_input_scale_makes_w4a4_batch_invariant():
    from torch_fp4 import checkpoint as ckpt
    lin = _linear(k=96, n=40)
    ref_mod = FP4Linear.from_linear(lin, "nvfp4")
    gs_in = t4.compute_global_scale(torch.randn(16, 96, dtype=torch.bfloat16))
    for fmt in ("compressed-tensors", "modelopt"):
        w = ckpt.NVFP4Weight(ref_mod.weight.clone(), ref_mod.weight_scale.clone(),
                             ref_mod.weight_global_scale.clone(), gs_in)
        loaded = ckpt.load_nvfp4(ckpt.save_nvfp4(w, "layer", fmt), "layer", fmt)
        assert loaded.input_global_scale is not None
        mod = FP4Linear.from_checkpoint(loaded, bias=lin.bias, activations="fp4")
        assert mod.static_input_scale
        assert torch.equal(mod.input_global_scale, loaded.input_global_scale)
        _assert_batch_invariant(mod, 96)


def _fresh_like(mod: FP4Linear) -> FP4Linear:
    return FP4Linear(mod.in_features, mod.out_features, bias=mod.bias is not None, fmt=mod.fmt,
                     activations=mod.activations, weight_layout=mod.weight_layout_choice)


@pytest.mark.parametrize("static", [True, False])
def test_state_dict_keeps_whether_the_input_scale_is_fixed(tmp_path, static):
    mod = FP4Linear.from_linear(_linear(), "nvfp4", "fp4")
    if static:
        mod.calibrate(torch.randn(8, 64) * 3)
    sd = mod.state_dict()
    assert sd["_extra_state"].dtype == torch.uint8 and all(isinstance(v, torch.Tensor) for v in sd.values())
    back = _fresh_like(mod)
    back.load_state_dict(sd)
    assert back.static_input_scale is static
    x = torch.randn(5, 64, dtype=torch.bfloat16)
    assert torch.equal(back(x), mod(x))
    if static:
        _assert_batch_invariant(back, 64)
    safetensors = pytest.importorskip("safetensors.torch")     # a state_dict of tensors only
    safetensors.save_file(sd, tmp_path / "m.safetensors")
    again = _fresh_like(mod)
    again.load_state_dict(safetensors.load_file(tmp_path / "m.safetensors"))
    assert again.static_input_scale is static


def test_a_state_dict_without_the_flag_infers_it_from_the_scale():
    mod = FP4Linear.from_linear(_linear(), "nvfp4", "fp4")
    sd = {k: v for k, v in mod.state_dict().items() if k != "_extra_state"}
    back = _fresh_like(mod)
    back.load_state_dict(sd)                         # a per-call layer: its scale is still 1.0
    assert not back.static_input_scale
    mod.calibrate(torch.randn(8, 64) * 3)
    sd = {k: v for k, v in mod.state_dict().items() if k != "_extra_state"}
    back.load_state_dict(sd)
    assert back.static_input_scale


def test_a_bad_flag_in_a_state_dict_is_an_error():
    mod = FP4Linear.from_linear(_linear(), "nvfp4", "fp4")
    sd = mod.state_dict()
    sd["_extra_state"] = torch.tensor([7], dtype=torch.uint8)
    with pytest.raises(ValueError, match="FP4Linear.load_state_dict: _extra_state: expected a one-element"):
        mod.load_state_dict(sd)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), float("nan"), 1e-45])
def test_setters_refuse_global_scales_that_are_not_positive_and_finite(bad):
    mod = FP4Linear.from_linear(_linear(), "nvfp4", "fp4")
    before = {k: v.clone() for k, v in mod.state_dict().items()}
    w = mod.weight.clone()
    for kw in ({"global_scale": torch.tensor([bad])}, {"global_scale": torch.ones(1),
                                                        "input_global_scale": torch.tensor([bad])}):
        with pytest.raises(ValueError, match=r"FP4Linear.set_quantized: \w*global_scale: expected "
                                             "positive finite global scales"):
            mod.set_quantized(torch.zeros_like(w), mod.weight_scale.clone(), **kw)
        assert all(torch.equal(v, before[k]) for k, v in mod.state_dict().items())   # nothing changed
    moe = FP4MoE(64, 32, 4, 2, activations="fp4")
    with pytest.raises(ValueError, match="FP4MoE: a2_global_scale: expected positive finite"):
        moe.set_activation_scales(torch.ones(1), torch.tensor([1.0, bad, 1.0, 1.0]))


def test_fp4moe_routing_errors_name_fp4moe():
    with pytest.raises(TypeError, match="^FP4MoE: top_k: expected an int, got 2.0"):
        FP4MoE(64, 32, 4, 2.0)
    with pytest.raises(ValueError, match="^FP4MoE: top_k: expected 1 <= top_k <= 4"):
        FP4MoE(64, 32, 4, 5)


def test_quantize_model_of_a_bare_linear_says_what_to_use():
    lin = torch.nn.Linear(128, 64)
    with pytest.raises(TypeError, match=r"quantize_model: model: .*FP4Linear.from_linear.*got an nn.Linear"):
        quantize_model(lin)
    assert dict(lin.named_children()) == {} and set(lin.state_dict()) == {"weight", "bias"}


def test_one_inf_weight_or_activation_stays_in_its_block():
    """Regression (docs/NUMERICS.md section 2: global scales ignore Inf and NaN): one Inf weight
    made every output NaN through FP4Linear.from_linear, and one Inf activation every token of a
    W4A4 batch NaN (its per-call global scale was 0)."""
    g = torch.Generator().manual_seed(3)
    lin = torch.nn.Linear(64, 32, dtype=torch.bfloat16)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(32, 64, generator=g) * 0.1)
        lin.weight[3, 5] = float("inf")
    x = torch.randn(4, 64, generator=g).to(torch.bfloat16)
    assert torch.isfinite(FP4Linear.from_linear(lin)(x)).all()
    with torch.no_grad():
        lin.weight[3, 5] = 0.1
    w4a4 = FP4Linear.from_linear(lin, activations="fp4")
    clean = w4a4(x)
    x[2, 7] = float("inf")
    got = w4a4(x)
    assert torch.isfinite(got).all()
    assert torch.equal(got[[0, 1, 3]], clean[[0, 1, 3]])   # the same global scale: the Inf is ignored
