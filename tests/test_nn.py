"""FP4Linear and quantize_model: same numbers as the ops they wrap, close to the dense layer,
robust storage (dtype casts, state_dict), torch.compile(fullgraph=True)."""
import warnings

import pytest
import torch

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
            ref = t4.mm_fp4(a, wq.T, None, ws.T, t4.nvfp4_alpha(None, gw))
        else:
            ga = t4.compute_global_scale(a)
            aq, as_ = t4.nvfp4_quantize(a, ga)
            ref = t4.mm_fp4(aq, wq.T, as_, ws.T, t4.nvfp4_alpha(ga, gw))
    else:
        wq, ws = t4.mxfp4_quantize(w)
        if activations == "bf16":
            ref = t4.mm_fp4(a, wq.T, None, ws.T, block_size=32)
        else:
            aq, as_ = t4.mxfp4_quantize(a)
            ref = t4.mm_fp4(aq, wq.T, as_, ws.T, block_size=32)
    ref = (ref + lin.bias.detach()).reshape(2, 5, 48)
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
    want = t4.mm_fp4(aq, mod.weight.T, as_, mod.weight_scale.T,
                     t4.nvfp4_alpha(gs_a, mod.weight_global_scale)) + lin.bias.detach()
    assert torch.equal(mod(x), want)


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match=r"in_features: expected a multiple of 16 \(the NVFP4 block size\), got 40"):
        FP4Linear(40, 8)
    with pytest.raises(ValueError, match="activations"):
        FP4Linear(32, 8, activations="int4")
    mod = FP4Linear(32, 8)
    with pytest.raises(ValueError, match="x: expected last dimension 32"):
        mod(torch.randn(2, 16, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="scale: expected a 1-byte tensor of shape"):
        mod.set_quantized(mod.weight, torch.zeros(8, 2, dtype=torch.uint8))


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
