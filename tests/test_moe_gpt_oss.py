"""fused_moe with gpt-oss's features on the reference backend: MXFP4 experts (block_size 32, no
global scales), expert biases on FC1 and FC2, the clamped SwiGLU (docs/NUMERICS.md section 6),
against a straightforward PyTorch implementation of a gpt-oss MoE layer from its checkpoint
tensors (interleaved gate/up, gpt-oss's own decode), and against transformers' GptOssExperts."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

import torch_fp4 as t4
from torch_fp4 import testing as T
from torch_fp4.gpt_oss_checkpoint import load_gpt_oss_experts

BF16 = torch.bfloat16
ALPHA, LIMIT = 1.702, 7.0
PREFIX = "model.layers.0.mlp.experts"


def _checkpoint(e, h, i, seed=0, bias_dtype=BF16, scale_range=(122, 129)):
    """gpt-oss expert tensors; scales 2^(s - 127) over few binades, so that every product sum of
    the layer is exact in fp64 (any summation order gives the same bits)."""
    return T.gpt_oss_expert_tensors(e, h, i, seed, PREFIX, bias_dtype, scale_range)


def _mx_values(v: torch.Tensor) -> torch.Tensor:
    """The values of v's MXFP4 quantization (W4A4's activations), fp32."""
    return t4.fp4_dequantize(*t4.mxfp4_quantize(v, backend="reference"), None, 32, out_dtype=torch.float32,
                             backend="reference")


def _straightforward(t: dict, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, bias: bool = True,
                     clamped: bool = True, w4a4: bool = False) -> torch.Tensor:
    """A gpt-oss MoE layer written out with the spec's rounding points: per routed (token, slot),
    h = RN_bf16(RN_fp32(x . W1^T) + b1) over the interleaved [gate, up] columns, the clamped
    SwiGLU in fp32 rounded to bf16, y = RN_bf16(RN_fp32(a . W2^T) + b2), out = RN_bf16 of the fp32
    sum of the weighted y in slot order. w4a4: x and a replaced by their MXFP4 values first."""
    if w4a4:
        x = _mx_values(x)
    w1 = T.gpt_oss_decode(t[f"{PREFIX}.gate_up_proj_blocks"], t[f"{PREFIX}.gate_up_proj_scales"])   # [E, 2I, H]
    w2 = T.gpt_oss_decode(t[f"{PREFIX}.down_proj_blocks"], t[f"{PREFIX}.down_proj_scales"])         # [E, H, I]
    b1, b2 = t[f"{PREFIX}.gate_up_proj_bias"].float(), t[f"{PREFIX}.down_proj_bias"].float()
    out = torch.zeros(x.shape, dtype=torch.float32)
    for tok in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[tok, j])
            h = (x[tok].double() @ w1[e].T).float()
            if bias:
                h = h + b1[e]
            h = h.to(BF16).float()
            gate, up = h[0::2], h[1::2]
            if clamped:
                g = torch.clamp(gate, max=LIMIT)
                u = torch.clamp(up, min=-LIMIT, max=LIMIT)
                a = ((u + 1.0) * (g * (1.0 / (1.0 + torch.exp(-(ALPHA * g)))))).to(BF16)
            else:
                a = (gate / (1.0 + torch.exp(-gate)) * up).to(BF16)
            if w4a4:
                a = _mx_values(a[None])[0]
            y = (a.double() @ w2[e].T).float()
            if bias:
                y = y + b2[e]
            out[tok] = out[tok] + weights[tok, j] * y.to(BF16).float()
    return out.to(BF16)


def _run(experts, x, ids, weights, bias=True, clamped=True, backend="auto", w4a4=False):
    return t4.fused_moe(x, experts.w1.view(torch.float4_e2m1fn_x2), experts.w1_scale.view(torch.float8_e8m0fnu),
                        None, experts.w2.view(torch.float4_e2m1fn_x2), experts.w2_scale.view(torch.float8_e8m0fnu),
                        None, ids, weights, block_size=32, w1_bias=experts.w1_bias if bias else None,
                        w2_bias=experts.w2_bias if bias else None,
                        activation="clamped_swiglu" if clamped else "swiglu", swiglu_alpha=ALPHA,
                        swiglu_limit=LIMIT, backend=backend, activations="fp4" if w4a4 else None)


def _routing(tokens, e, k, seed):
    g = torch.Generator().manual_seed(seed)
    return t4.route(torch.randn(tokens, e, generator=g), k, "renormalize")


@pytest.mark.parametrize("h,bias_dtype", [(96, BF16), (2880, torch.float32)])
def test_gpt_oss_layer_equals_the_straightforward_layer(h, bias_dtype):
    e, i, tokens, k = 4, 64, 5, 2
    t = _checkpoint(e, h, i, bias_dtype=bias_dtype)
    experts = load_gpt_oss_experts(t, PREFIX)
    x = torch.randn(tokens, h, generator=torch.Generator().manual_seed(1)).to(BF16)
    ids, weights = _routing(tokens, e, k, 2)
    got = _run(experts, x, ids, weights)
    assert torch.equal(got, _straightforward(t, x, ids, weights))


@settings(max_examples=20, deadline=None)
@given(e=st.integers(1, 4), hb=st.integers(1, 4), ib=st.integers(1, 3), tokens=st.integers(1, 6),
       k=st.integers(1, 4), bias=st.booleans(), clamped=st.booleans(), w4a4=st.booleans(), seed=st.integers(0, 2**16))
def test_any_shape_top_k_bias_and_activation(e, hb, ib, tokens, k, bias, clamped, w4a4, seed):
    """W4A16 and W4A4 (MXFP4 activations: x and the intermediate replaced by their MXFP4 values)."""
    k = min(k, e)
    h, i = 32 * hb, 32 * ib
    t = _checkpoint(e, h, i, seed=seed)
    experts = load_gpt_oss_experts(t, PREFIX)
    x = torch.randn(tokens, h, generator=torch.Generator().manual_seed(seed + 1)).to(BF16)
    ids, weights = _routing(tokens, e, k, seed + 2)
    got = _run(experts, x, ids, weights, bias, clamped, w4a4=w4a4)
    assert torch.equal(got, _straightforward(t, x, ids, weights, bias, clamped, w4a4))


def test_mxfp4_activations_change_the_result():
    """W4A4 with MXFP4 activations is not W4A16 (the activations are quantized), and equals the
    straightforward layer on its quantized activations."""
    e, h, i, tokens, k = 3, 96, 64, 5, 2
    t = _checkpoint(e, h, i, seed=3)
    experts = load_gpt_oss_experts(t, PREFIX)
    x = torch.randn(tokens, h, generator=torch.Generator().manual_seed(4)).to(BF16)
    ids, weights = _routing(tokens, e, k, 5)
    w4a4, w4a16 = _run(experts, x, ids, weights, w4a4=True), _run(experts, x, ids, weights)
    assert not torch.equal(w4a4, w4a16)
    assert torch.equal(w4a4, _straightforward(t, x, ids, weights, w4a4=True))


def test_clamps_reach_the_output():
    """Gates above the limit and ups beyond +-limit are clamped (not only large values passed)."""
    from torch_fp4.reference.moe import clamped_swiglu
    h = torch.tensor([[-20.0, 3.0, 7.5, 100.0, -9.0, 0.5, 20.0, -30.0]], dtype=BF16)
    got = clamped_swiglu(h, ALPHA, LIMIT).float()
    gate = torch.tensor([-20.0, 3.0, 7.0, 7.0])
    up = torch.tensor([-7.0, 0.5, 7.0, -7.0])
    want = ((up + 1) * (gate * (1 / (1 + torch.exp(-(ALPHA * gate)))))).to(BF16).float()
    assert torch.equal(got, want.unsqueeze(0))


def test_matches_transformers_gpt_oss_experts():
    """Within bf16 rounding of transformers' own GptOssExperts (fp32 weights = the decoded MXFP4
    values, interleaved gate/up) on the same routing."""
    modeling = pytest.importorskip("transformers.models.gpt_oss.modeling_gpt_oss")
    cfg_mod = pytest.importorskip("transformers.models.gpt_oss.configuration_gpt_oss")
    e, h, i, tokens, k = 4, 96, 64, 7, 2
    t = _checkpoint(e, h, i, scale_range=(120, 131))
    config = cfg_mod.GptOssConfig(hidden_size=h, intermediate_size=i, num_local_experts=e,
                                  num_experts_per_tok=k)
    ref = modeling.GptOssExperts(config).float().eval()
    with torch.no_grad():
        w1 = T.gpt_oss_decode(t[f"{PREFIX}.gate_up_proj_blocks"], t[f"{PREFIX}.gate_up_proj_scales"])
        ref.gate_up_proj.copy_(w1.transpose(1, 2).float())
        ref.gate_up_proj_bias.copy_(t[f"{PREFIX}.gate_up_proj_bias"].float())
        w2 = T.gpt_oss_decode(t[f"{PREFIX}.down_proj_blocks"], t[f"{PREFIX}.down_proj_scales"])
        ref.down_proj.copy_(w2.transpose(1, 2).float())
        ref.down_proj_bias.copy_(t[f"{PREFIX}.down_proj_bias"].float())
    x = torch.randn(tokens, h, generator=torch.Generator().manual_seed(3)).to(BF16)
    ids, weights = _routing(tokens, e, k, 4)
    dense = torch.zeros(tokens, e).scatter_(1, ids.long(), weights)
    with torch.no_grad():
        want = ref(x.float().unsqueeze(0), router_indices=ids.long(), routing_weights=dense).reshape(tokens, h)
    got = _run(load_gpt_oss_experts(t, PREFIX), x, ids, weights).float()
    err = torch.linalg.norm(got - want) / torch.linalg.norm(want)
    assert err < 2e-2, float(err)


def test_nvfp4_experts_with_biases_and_clamped_swiglu():
    """The features are not tied to MXFP4. Zero biases change no value; NVFP4 experts with biases
    and the clamped SwiGLU agree with the layer written out on the dequantized weights (fp32
    products, bf16 intermediates) to bf16 rounding."""
    from torch_fp4.reference.moe import clamped_swiglu
    kw = T.moe_problem(w4a4=False)
    e_, two_i, hidden = kw["w1"].shape[0], kw["w1"].shape[1], kw["x"].shape[1]
    zeros = dict(w1_bias=torch.zeros(e_, two_i), w2_bias=torch.zeros(e_, hidden, dtype=BF16))
    assert torch.equal(t4.fused_moe(**kw, **zeros), t4.fused_moe(**kw))
    b1, b2 = torch.randn(e_, two_i), torch.randn(e_, hidden).to(BF16)
    got = t4.fused_moe(**kw, w1_bias=b1, w2_bias=b2, activation="clamped_swiglu").float()
    want = torch.zeros(kw["x"].shape)
    for tok in range(kw["x"].shape[0]):
        for j in range(kw["topk_ids"].shape[1]):
            e = int(kw["topk_ids"][tok, j])
            w1 = t4.fp4_dequantize(kw["w1"][e], kw["w1_scale"][e], kw["w1_global_scale"][e:e + 1],
                                   out_dtype=torch.float32)
            w2 = t4.fp4_dequantize(kw["w2"][e], kw["w2_scale"][e], kw["w2_global_scale"][e:e + 1],
                                   out_dtype=torch.float32)
            h = ((kw["x"][tok].double() @ w1.double().T).float() + b1[e]).to(BF16)
            y = ((clamped_swiglu(h, ALPHA, LIMIT).double() @ w2.double().T).float() + b2[e].float()).to(BF16)
            want[tok] += kw["topk_weights"][tok, j] * y.float()
    err = torch.linalg.norm(got - want) / torch.linalg.norm(want)
    assert err < 2e-2, float(err)


def test_gpu_backends_say_what_they_do_not_run_yet():
    """cute-dsl refuses gpt-oss's features naming them; triton and cuda run them, in W4A16 and
    in W4A4 with MXFP4 activations (on a CPU both refuse for the device); triton refuses NVFP4 W4A4
    with biases."""
    experts = load_gpt_oss_experts(_checkpoint(2, 64, 32), PREFIX)
    x = torch.randn(3, 64).to(BF16)
    ids, weights = _routing(3, 2, 1, 0)
    args = (x, experts.w1.view(torch.float4_e2m1fn_x2), experts.w1_scale.view(torch.float8_e8m0fnu), None,
            experts.w2.view(torch.float4_e2m1fn_x2), experts.w2_scale.view(torch.float8_e8m0fnu), None, ids, weights)
    kw = dict(block_size=32, w1_bias=experts.w1_bias, w2_bias=experts.w2_bias, activation="clamped_swiglu")
    reason = t4.unsupported_reason("fused_moe", "cute-dsl", *args, **kw)
    if "failed to import" not in reason:
        assert "MXFP4 experts, expert biases, the clamped SwiGLU" in reason, reason
    for backend in ("triton", "cuda"):   # both run them on a GPU, W4A16 and W4A4
        for activations in (None, "fp4"):
            reason = t4.unsupported_reason("fused_moe", backend, *args, **kw, activations=activations)
            assert "needs CUDA tensors" in reason or "failed to import" in reason, (backend, activations, reason)
    assert t4.supported_backends("fused_moe", *args, **kw) == [t4.Backend.REFERENCE]
    nv = T.moe_problem(3, 64, 32, 2, 2, w4a4=True)
    reason = t4.unsupported_reason("fused_moe", "triton", **nv, w1_bias=experts.w1_bias)
    assert "the triton fused_moe kernels run expert biases in W4A16, or in W4A4 with MXFP4 experts only" in reason, \
        reason


@pytest.mark.parametrize("change,arg,needle", [
    (dict(w1_global_scale=torch.ones(2)), "w1_global_scale", "None for MXFP4 experts"),
    (dict(a1_global_scale=torch.ones(1)), "a1_global_scale", "MXFP4 activations have no global scale"),
    (dict(activations="fp8"), "activations", "None, 'bf16' or 'fp4'"),
    (dict(w1_bias=torch.zeros(2, 63)), "w1_bias", "[E, 2I]"),
    (dict(w2_bias=torch.zeros(2, 64, dtype=torch.float16)), "w2_bias", "float32 or bfloat16"),
    (dict(activation="gelu"), "activation", "'swiglu' or 'clamped_swiglu'"),
    (dict(swiglu_limit=0.0), "swiglu_limit", "a finite positive number"),
    (dict(swiglu_alpha=float("nan")), "swiglu_alpha", "a finite number"),
    (dict(block_size=16), "w1_scale", "block_size=32"),
])
def test_bad_gpt_oss_arguments_name_the_argument(change, arg, needle):
    experts = load_gpt_oss_experts(_checkpoint(2, 64, 32), PREFIX)
    kw = dict(x=torch.randn(3, 64).to(BF16), w1=experts.w1.view(torch.float4_e2m1fn_x2),
              w1_scale=experts.w1_scale.view(torch.float8_e8m0fnu), w1_global_scale=None,
              w2=experts.w2.view(torch.float4_e2m1fn_x2), w2_scale=experts.w2_scale.view(torch.float8_e8m0fnu),
              w2_global_scale=None, block_size=32, w1_bias=experts.w1_bias, w2_bias=experts.w2_bias,
              activation="clamped_swiglu")
    kw["topk_ids"], kw["topk_weights"] = _routing(3, 2, 1, 0)
    kw.update(change)
    if "a1_global_scale" in change:
        kw["a2_global_scale"] = torch.ones(1)
    with pytest.raises((ValueError, TypeError)) as info:
        t4.fused_moe(**kw)
    assert f"fused_moe: {arg}:" in str(info.value) and needle in str(info.value), str(info.value)


def test_nvfp4_experts_still_need_their_global_scales():
    kw = T.moe_problem(w4a4=False)
    kw["w1_global_scale"] = None
    with pytest.raises(ValueError, match="fused_moe: w1_global_scale: expected an \\[E\\] fp32 tensor"):
        t4.fused_moe(**kw)


def test_fp4moe_runs_a_gpt_oss_layer_from_its_checkpoint():
    """FP4MoE.from_gpt_oss: the router (bias; top-k on the logits, softmax over the k) and the
    experts byte for byte; its forward equals the straightforward gpt-oss layer bit for bit, also
    under torch.compile(fullgraph=True); its state_dict holds the biases."""
    from torch_fp4.nn import FP4MoE
    e, h, i, tokens, k = 4, 96, 64, 5, 2
    t = _checkpoint(e, h, i)
    experts = load_gpt_oss_experts(t, PREFIX)
    router = torch.nn.Linear(h, e, bias=True).to(BF16)
    moe = FP4MoE.from_gpt_oss(router, experts, top_k=k)
    assert "format=mxfp4" in repr(moe) and "clamped_swiglu" in repr(moe)
    for name in ("w1", "w1_scale", "w2", "w2_scale", "w1_bias", "w2_bias"):
        assert torch.equal(getattr(moe, name), getattr(experts, name)), name
    x = torch.randn(tokens, h, generator=torch.Generator().manual_seed(5)).to(BF16)
    logits = router(x)
    vals, ids = torch.topk(logits.float(), k, dim=-1)
    weights = torch.softmax(vals, dim=-1)
    want = _straightforward(t, x, ids.to(torch.int32), weights)
    assert torch.equal(moe(x), want)
    assert torch.equal(torch.compile(moe, fullgraph=True, backend="eager")(x), want)
    assert {"w1_bias", "w2_bias"} <= set(moe.state_dict())


def test_fp4moe_mxfp4_from_dense_experts_and_refusals():
    from torch_fp4.nn import FP4MoE
    from torch_fp4.nn import parallel as P
    e, h, i = 2, 64, 32
    router = torch.nn.Linear(h, e, bias=False).to(BF16)
    w1, w2 = torch.randn(e, 2 * i, h), torch.randn(e, h, i)
    moe = FP4MoE(h, i, e, 1, fmt="mxfp4")
    moe.router = router
    moe.set_weights(w1, w2)
    q, s = t4.mxfp4_quantize(w1)
    assert torch.equal(moe.w1, q.view(torch.uint8)) and torch.equal(moe.w1_scale, s.view(torch.uint8))
    assert moe(torch.randn(3, h).to(BF16)).shape == (3, h)
    w4a4 = FP4MoE(h, i, e, 1, activations="fp4", fmt="mxfp4")   # MXFP4 activations: no scales to set
    w4a4.router = router
    w4a4.set_weights(w1, w2)
    x = torch.randn(3, h).to(BF16)
    ids, tw = t4.route(router(x), 1)
    want = t4.fused_moe(x, *w4a4._expert_args(), ids, tw, block_size=32, activations="fp4", backend="reference")
    assert torch.equal(w4a4(x), want) and not torch.equal(w4a4(x), moe(x))
    with pytest.raises(ValueError, match="FP4MoE: hidden_size: expected a positive multiple of 32"):
        FP4MoE(48, i, e, 1, fmt="mxfp4")
    with pytest.raises(ValueError, match="FP4MoE: fmt: expected 'nvfp4' or 'mxfp4'"):
        FP4MoE(h, i, e, 1, fmt="fp8")
    with pytest.raises(ValueError, match="FP4MoE.calibrate: sets NVFP4 W4A4"):
        moe.calibrate(torch.randn(3, h))
    with pytest.raises(ValueError, match="TensorParallelFP4MoE: moe: expected NVFP4 experts without biases"):
        P.TensorParallelFP4MoE(moe)
