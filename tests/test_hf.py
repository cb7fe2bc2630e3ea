"""quantize_model on Hugging Face transformers causal LMs (dense Llama, Mixtral, Qwen3-MoE,
DeepSeek-V3)."""
import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")
if not (4, 57) <= tuple(int(v) for v in transformers.__version__.split(".")[:2]) < (5, 0):
    pytest.skip(f"transformers {transformers.__version__} is outside the tested range >=4.57,<5 "
                "(the hf extra)", allow_module_level=True)

import torch_fp4 as t4  # noqa: E402
from torch_fp4 import hf, ops  # noqa: E402
from torch_fp4.nn import FP4Linear, FP4MoE, FP4SparseMoeBlock, QuantConfig, quantize_model  # noqa: E402

COMMON = dict(vocab_size=128, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
              pad_token_id=0, bos_token_id=1, eos_token_id=None)


def _llama(**kw):
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**COMMON, **kw))


def _mixtral(**kw):
    kw = dict(num_local_experts=4, num_experts_per_tok=2, **kw)
    return transformers.MixtralForCausalLM(transformers.MixtralConfig(**COMMON, **kw))


def _qwen3(norm_topk_prob=True, **kw):
    cfg = transformers.Qwen3MoeConfig(**COMMON, head_dim=16, moe_intermediate_size=32, num_experts=8,
                                      num_experts_per_tok=2, norm_topk_prob=norm_topk_prob,
                                      decoder_sparse_step=1, mlp_only_layers=[], **kw)
    return transformers.Qwen3MoeForCausalLM(cfg)


def _deepseek(norm_topk_prob=True, **kw):
    cfg = dict(COMMON, num_key_value_heads=4, moe_intermediate_size=32, n_routed_experts=8,
               num_experts_per_tok=2, n_group=4, topk_group=2, first_k_dense_replace=1,
               q_lora_rank=32, kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=16,
               v_head_dim=16, norm_topk_prob=norm_topk_prob)
    return transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(**{**cfg, **kw}))


MOE_MODELS = {"mixtral": _mixtral, "qwen3": lambda: _qwen3(True), "qwen3_unnorm": lambda: _qwen3(False)}
EXPERT_NAMES = {"MixtralSparseMoeBlock": ("w1", "w3", "w2"),
                "Qwen3MoeSparseMoeBlock": ("gate_proj", "up_proj", "down_proj")}


def _build(make, dtype=torch.float32):
    torch.manual_seed(0)
    return make().to(dtype).eval()


def _ids(batch=2, seq=7):
    return torch.randint(2, 128, (batch, seq), generator=torch.Generator().manual_seed(1))


def _cos(a, b):
    return torch.nn.functional.cosine_similarity(a.flatten().double(), b.flatten().double(), dim=0).item()


def _check_converted(model):
    """Every nn.Linear is FP4Linear except lm_head and the MoE routers; no MoE block is left."""
    linears = 0
    for name, mod in model.named_modules():
        assert not (hf.is_moe_like(mod) and not isinstance(mod, FP4MoE)), name
        if isinstance(mod, FP4Linear):
            linears += 1
        elif isinstance(mod, torch.nn.Linear):
            parent = model.get_submodule(name.rpartition(".")[0])
            assert name == "lm_head" or (name.endswith(".router") and isinstance(parent, FP4MoE)), name
    assert linears > 0


@pytest.mark.parametrize("make", [_llama, *MOE_MODELS.values(), _deepseek],
                         ids=["llama", *MOE_MODELS, "deepseek_v3"])
def test_quantize_model_causal_lm(make):
    dense = _build(make)
    model = quantize_model(copy.deepcopy(dense), QuantConfig())
    _check_converted(model)
    ids = _ids()
    with torch.no_grad():
        ref, out = dense(ids).logits, model(ids).logits
    # Random-init weights put every logit near zero, the worst case for a relative measure;
    # NVFP4 W4A16 over 2 layers measured 0.988 (Qwen3-MoE) to 0.992 (Llama) on these seeds
    # (DeepSeek-V3: 0.991).
    assert _cos(out, ref) > 0.98
    gen = [model.generate(ids, max_new_tokens=4, do_sample=False) for _ in range(2)]
    assert gen[0].shape == (2, 11) and torch.equal(gen[0], gen[1])


def _moe_blocks(model):
    """The dense model's MoE blocks."""
    return [(n, m) for n, m in model.named_modules() if type(m).__name__ in hf.MOE_BLOCKS]


def _converted_pairs(dense):
    """(bf16-representable input x [2, 5, 64] in the model's dtype, then (dense block, converted
    block) of each MoE block of a quantize_model copy of `dense`."""
    model = quantize_model(copy.deepcopy(dense), QuantConfig())
    torch.manual_seed(2)
    x = torch.randn(2, 5, 64).to(torch.bfloat16).to(next(dense.parameters()).dtype)
    pairs = [(block, model.get_submodule(name)) for name, block in _moe_blocks(dense)]
    for block, conv in pairs:
        assert isinstance(conv, FP4SparseMoeBlock) and isinstance(conv, type(block))
    return x, pairs


def _fp4_blocks(model):
    return [(n, m) for n, m in model.named_modules() if isinstance(m, FP4SparseMoeBlock)]


@pytest.mark.parametrize("name", list(MOE_MODELS))
def test_moe_routing_matches_transformers(name):
    """route(softmax, renormalize) picks HF's experts with HF's weights, bit for bit."""
    dense = _build(MOE_MODELS[name])
    x = torch.randn(9, 64)
    for _, block in _moe_blocks(dense):
        logits = block.gate(x)
        w = torch.softmax(logits, dim=1, dtype=torch.float)
        w, sel = torch.topk(w, block.top_k, dim=-1)
        spec = hf.moe_block_spec(block)
        if spec.renormalize:
            w /= w.sum(dim=-1, keepdim=True)
        ids, weights = ops.route(logits, block.top_k, "softmax", spec.renormalize)
        assert torch.equal(ids.long(), sel) and torch.equal(weights, w)
        assert spec.renormalize == (name != "qwen3_unnorm")


@pytest.mark.parametrize("name", list(MOE_MODELS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_converted_block_equals_fp4moe(name, dtype):
    # bf16-representable input: FP4MoE.forward routes from x rounded to bf16, the converted block
    # from x itself (as transformers does); on such x the two agree.
    x, pairs = _converted_pairs(_build(MOE_MODELS[name], dtype))
    for block, conv in pairs:
        g, u, d = EXPERT_NAMES[type(block).__name__]
        spec = hf.moe_block_spec(block)
        ref = FP4MoE.from_experts(block.gate, [(getattr(e, g), getattr(e, u)) for e in block.experts],
                                  [getattr(e, d) for e in block.experts], top_k=block.top_k,
                                  method="softmax", renormalize=spec.renormalize,
                                  compute_dtype=torch.bfloat16)
        out, logits = conv(x)
        assert torch.equal(logits, block.gate(x.reshape(-1, 64)))
        if dtype == torch.float32:
            want = ref(x)
        else:       # transformers applies the routing weights in bf16
            ids, w = ops.route(logits, block.top_k, "softmax", spec.renormalize)
            want = ops.fused_moe(x.reshape(-1, 64), ref.w1, ref.w1_scale, ref.w1_global_scale,
                                 ref.w2, ref.w2_scale, ref.w2_global_scale, ids,
                                 w.to(dtype).float(), out_dtype=dtype).reshape(x.shape)
        assert out.dtype == dtype and torch.equal(out, want)


def _deepseek_biased(norm_topk_prob=True, dtype=torch.float32):
    """A DeepSeek-V3 model whose correction biases make most biased scores (about 0.5 + bias)
    negative, so that transformers' masking of unchosen groups with 0.0 (not -inf) picks
    experts of those groups for some tokens."""
    model = _build(lambda: _deepseek(norm_topk_prob), dtype)
    gen = torch.Generator().manual_seed(3)
    for _, block in _moe_blocks(model):
        bias = block.gate.e_score_correction_bias
        bias.copy_((torch.tensor([-0.5, -0.75] * 4) + 0.02 * torch.randn(8, generator=gen))
                   .to(bias.dtype))
    return model


@pytest.mark.parametrize("norm", [True, False], ids=["norm", "unnorm"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_deepseek_v3_routing_matches_transformers(norm, dtype):
    """The converted block picks DeepseekV3TopkRouter's experts, in its order, with its weights,
    bit for bit (fp32 logits, grouped top-k on biased scores, norm_topk_prob, scaling)."""
    dense = _deepseek_biased(norm, dtype)
    model = quantize_model(copy.deepcopy(dense), QuantConfig())
    blocks = _moe_blocks(dense)
    assert len(blocks) == 1 and type(blocks[0][1]).__name__ == "DeepseekV3MoE"
    torch.manual_seed(4)
    x = torch.randn(64, 64).to(dtype)
    for bname, block in blocks:
        conv = model.get_submodule(bname)
        assert conv.method == "deepseek_v3" and conv.norm_topk_prob == norm
        assert conv.routed_scaling_factor == block.gate.routed_scaling_factor == 2.5
        want_ids, want_w = block.gate(x)
        ids, w = conv._deepseek_v3_route(x)
        assert ids.dtype == torch.int32 and w.dtype == torch.float32
        assert torch.equal(ids.long(), want_ids) and torch.equal(w, want_w)
        assert torch.equal(conv._route(x)[0], ids)      # calibrate routes the same way
        # what torch_fp4's route would choose: here not transformers' choice for some tokens
        logits = torch.nn.functional.linear(x.float(), block.gate.weight.float())
        other = ops.route(logits, 2, "deepseek_v3", bias=block.gate.e_score_correction_bias,
                          n_group=4, topk_group=2, routed_scaling_factor=2.5)[0]
        assert (other.sort(-1)[0] != ids.sort(-1)[0]).any()
        if not norm:
            assert not torch.allclose(w.sum(-1), torch.full((64,), 2.5))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_deepseek_v3_block_equals_reference(dtype):
    """The converted DeepseekV3MoE = NVFP4 experts routed by transformers' own router, plus the
    shared experts converted on their own, bit for bit (CPU reference backend)."""
    x, pairs = _converted_pairs(_deepseek_biased(True, dtype))
    for block, conv in pairs:
        assert all(isinstance(getattr(conv.shared_experts, n), FP4Linear)
                   for n in ("gate_proj", "up_proj", "down_proj"))
        gate = block.gate
        router = torch.nn.Linear(64, 8, bias=False).to(dtype)
        router.weight.data.copy_(gate.weight)
        ref = FP4MoE.from_experts(router, [(e.gate_proj, e.up_proj) for e in block.experts],
                                  [e.down_proj for e in block.experts], top_k=gate.top_k,
                                  method="deepseek_v3", routing_bias=gate.e_score_correction_bias,
                                  n_group=gate.n_group, topk_group=gate.topk_group,
                                  routed_scaling_factor=gate.routed_scaling_factor,
                                  compute_dtype=torch.bfloat16)
        shared = quantize_model(copy.deepcopy(block.shared_experts), QuantConfig())
        ids, w = gate(x)
        routed = ops.fused_moe(x.reshape(-1, 64).to(torch.bfloat16), ref.w1, ref.w1_scale,
                               ref.w1_global_scale, ref.w2, ref.w2_scale, ref.w2_global_scale,
                               ids.to(torch.int32), w, out_dtype=dtype, backend="reference")
        want = routed.reshape(x.shape) + shared(x)
        with torch.no_grad():
            out = conv(x)
        assert isinstance(out, torch.Tensor) and out.dtype == dtype    # no router logits
        assert torch.equal(out, want)
        with torch.no_grad():
            assert _cos(out, block(x)) > 0.98


def test_deepseek_v3_shared_experts_follow_config():
    """Shared experts are dense projections: converted by default, kept dense when excluded."""
    model = quantize_model(_build(_deepseek), QuantConfig(exclude="*.shared_experts.*"))
    conv = model.model.layers[1].mlp
    assert isinstance(conv, FP4SparseMoeBlock)
    assert all(type(m) is torch.nn.Linear for m in conv.shared_experts.modules()
               if isinstance(m, torch.nn.Linear))
    assert isinstance(model.model.layers[0].mlp.gate_proj, FP4Linear)   # the dense first layer


def test_deepseek_v3_w4a4_calibrated():
    dense = _build(_deepseek)
    model = quantize_model(copy.deepcopy(dense), QuantConfig(activations="fp4"), calibration=_ids())
    blocks = _fp4_blocks(model)
    assert len(blocks) == 1 and blocks[0][1].activations == "fp4"
    assert blocks[0][1].shared_experts.gate_proj.activations == "fp4"
    with torch.no_grad():
        assert _cos(model(_ids()).logits, dense(_ids()).logits) > 0.95


def test_deepseek_v3_unmatchable_top_k_raises():
    """top_k above topk_group * experts per group: transformers would pick masked experts."""
    model = _build(lambda: _deepseek(num_experts_per_tok=5))
    with pytest.raises(ValueError, match=r"quantize_model: DeepseekV3MoE: gate: top_k: expected at "
                       r"most topk_group \* experts per group = 4, got 5"):
        quantize_model(model)
    # refused before any change
    assert type(model.model.layers[0].mlp.gate_proj) is torch.nn.Linear


def test_router_logits_still_recorded():
    """transformers collects router_logits from instances of the block's class (aux loss)."""
    model = quantize_model(_build(_mixtral), QuantConfig())
    with torch.no_grad():
        out = model(_ids(), output_router_logits=True)
    assert len(out.router_logits) == 2 and out.router_logits[0].shape == (14, 4)
    assert out.aux_loss is not None and torch.isfinite(out.aux_loss)


def test_lm_head_dense_unless_included():
    model = quantize_model(_build(_llama), QuantConfig())
    assert type(model.lm_head) is torch.nn.Linear
    model = quantize_model(_build(_mixtral), QuantConfig(include="*"))
    assert isinstance(model.lm_head, FP4Linear)
    blocks = _fp4_blocks(model)
    assert len(blocks) == 2 and all(type(b.router) is torch.nn.Linear for _, b in blocks)
    model = quantize_model(_build(_llama), QuantConfig(keep_dense=()))
    assert isinstance(model.lm_head, FP4Linear)
    with pytest.raises(TypeError, match="QuantConfig: keep_dense: expected a tuple"):
        QuantConfig(keep_dense="lm_head")


def test_w4a4_moe_needs_calibration():
    model = _build(_mixtral)
    with pytest.raises(ValueError, match=r"quantize_model: calibration: expected sample inputs for "
                       r"W4A4 MoE block model\.layers\.0\.block_sparse_moe \(MixtralSparseMoeBlock\)"):
        quantize_model(model, QuantConfig(activations="fp4"))
    assert type(model.model.layers[0].block_sparse_moe).__name__ == "MixtralSparseMoeBlock"
    dense = copy.deepcopy(model)
    quantize_model(model, QuantConfig(activations="fp4"), calibration=_ids())
    blocks = _fp4_blocks(model)
    assert len(blocks) == 2 and all(b.activations == "fp4" for _, b in blocks)
    with torch.no_grad():
        assert _cos(model(_ids()).logits, dense(_ids()).logits) > 0.95
    with pytest.raises(ValueError, match="config.fmt: expected 'nvfp4' for MoE block"):
        quantize_model(_build(_mixtral), QuantConfig(fmt="mxfp4"))


class FooSparseMoeBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gate = torch.nn.Linear(64, 4, bias=False)
        self.experts = torch.nn.ModuleList(torch.nn.Linear(64, 64) for _ in range(4))


def test_unsupported_moe_block_raises():
    model = torch.nn.ModuleDict({"proj": torch.nn.Linear(64, 64), "moe": FooSparseMoeBlock()})
    with pytest.raises(ValueError, match="quantize_model: FooSparseMoeBlock: expected a supported "
                       "MoE block .* got unsupported MoE block class FooSparseMoeBlock"):
        quantize_model(model)
    assert type(model["proj"]) is torch.nn.Linear       # refused before any change
    quantize_model(model, QuantConfig(exclude="moe"))    # excluded: dense whole, no guessing
    assert isinstance(model["proj"], FP4Linear) and type(model["moe"].gate) is torch.nn.Linear
    assert all(type(e) is torch.nn.Linear for e in model["moe"].experts)


@pytest.mark.parametrize("make,block", [(_mixtral, "MixtralSparseMoeBlock"),
                                        (_qwen3, "Qwen3MoeSparseMoeBlock"),
                                        (_deepseek, "DeepseekV3MoE")])
def test_non_silu_activation_raises(make, block):
    with pytest.raises(ValueError, match=f"quantize_model: {block}: experts\\[0\\]: act_fn: "
                       "expected SiLU .* got GELUActivation"):
        quantize_model(_build(lambda: make(hidden_act="gelu")))


def test_moe_like_rule():
    for name, want in (("MixtralSparseMoeBlock", True), ("DeepseekV3MoE", True),
                       ("Llama4TextMoe", True), ("Qwen3MoeMLP", False), ("MoeRouter", False)):
        assert (hf.MOE_LIKE.search(name) is not None) == want, name


@pytest.mark.slow
def test_compile_converted_mixtral_forward():
    model = quantize_model(_build(_mixtral), QuantConfig())
    ids = _ids()
    with torch.no_grad():
        want = model(ids, use_cache=False).logits
        try:
            got = torch.compile(model, fullgraph=True)(ids, use_cache=False).logits
        except torch._dynamo.exc.Unsupported as e:     # a graph break in transformers' own code
            pytest.skip(f"transformers' forward does not trace with fullgraph=True: {e}")
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4)


def test_top_level_names():
    assert t4.quantize_model is quantize_model
