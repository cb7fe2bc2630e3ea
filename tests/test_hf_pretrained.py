"""save_pretrained / from_pretrained (torch_fp4/nn/pretrained.py): transformers model directories
holding NVFP4 checkpoints (ModelOpt and compressed-tensors naming) to FP4 models and back."""
import json
import os

import pytest
import torch

transformers = pytest.importorskip("transformers")
if not (4, 57) <= tuple(int(v) for v in transformers.__version__.split(".")[:2]) < (5, 0):
    pytest.skip(f"transformers {transformers.__version__} is outside the tested range >=4.57,<5 "
                "(the hf extra)", allow_module_level=True)

import torch_fp4 as t4  # noqa: E402
from torch_fp4 import checkpoint as CK  # noqa: E402
from torch_fp4.nn import FP4Linear, FP4MoE  # noqa: E402

from torch_fp4.examples.hf_generate import FAMILIES, random_model  # noqa: E402

FORMATS = ("compressed-tensors", "modelopt")


def _dense(family: str, seed: int = 0) -> torch.nn.Module:
    """A tiny random bf16 model built as transformers builds a bf16 model (rotary tables in fp32)."""
    return random_model(family, seed, "cpu", size="tiny")


def _ids(seed: int = 1) -> torch.Tensor:
    return torch.randint(2, 128, (2, 7), generator=torch.Generator().manual_seed(seed))


def _logits(model, ids) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


def _files_equal(a: str, b: str) -> bool:
    with open(os.path.join(a, "model.safetensors"), "rb") as f, open(os.path.join(b, "model.safetensors"), "rb") as g:
        return f.read() == g.read()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("family", FAMILIES)
def test_round_trip_every_family_bitwise(family, fmt, tmp_path):
    model = _dense(family)
    t4.quantize_model(model, t4.QuantConfig())
    ids = _ids()
    want = _logits(model, ids)
    t4.save_pretrained(model, tmp_path / "a", fmt)
    config = json.load(open(tmp_path / "a" / "config.json"))
    assert config["quantization_config"]["quant_method"] == fmt
    loaded = t4.from_pretrained(tmp_path / "a")
    assert torch.equal(_logits(loaded, ids), want)
    assert sum(isinstance(m, FP4MoE) for m in loaded.modules()) == sum(isinstance(m, FP4MoE) for m in model.modules())
    assert sum(isinstance(m, FP4Linear) for m in loaded.modules()) == sum(isinstance(m, FP4Linear) for m in model.modules())
    t4.save_pretrained(loaded, tmp_path / "b", fmt)
    assert _files_equal(tmp_path / "a", tmp_path / "b"), "save -> load -> save changed the file"
    # greedy generate: deterministic and the same tokens as the model that was saved
    out = loaded.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert torch.equal(out, loaded.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0))
    assert torch.equal(out, model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0))


@pytest.mark.parametrize("family", ["llama", "mixtral"])
def test_w4a4_calibrated_scales_round_trip(family, tmp_path):
    model = _dense(family)
    ids = _ids()
    t4.quantize_model(model, t4.QuantConfig(activations="fp4"), calibration=ids)
    want = _logits(model, ids)
    t4.save_pretrained(model, tmp_path, "modelopt")
    assert json.load(open(tmp_path / "config.json"))["quantization_config"]["quant_algo"] == "NVFP4"
    loaded = t4.from_pretrained(tmp_path)
    assert torch.equal(_logits(loaded, ids), want)
    layers = [m for m in loaded.modules() if isinstance(m, FP4Linear)]
    assert layers and all(m.activations == "fp4" and m.static_input_scale for m in layers)
    # activations="bf16" ignores the stored activation scales: W4A16 everywhere
    w4a16 = t4.from_pretrained(tmp_path, activations="bf16")
    assert all(m.activations == "bf16" for m in w4a16.modules() if isinstance(m, (FP4Linear, FP4MoE)))


@pytest.mark.parametrize("fmt", FORMATS)
def test_directory_written_with_checkpoint_py_loads_byte_for_byte(fmt, tmp_path):
    """A model directory of another producer's naming: every projection quantized by the ops and
    written with torch_fp4.checkpoint, the rest dense; from_pretrained gives FP4Linear layers holding
    exactly those bytes and the logits of quantize_model's model of the same weights."""
    dense = _dense("llama")
    reference = _dense("llama")
    t4.quantize_model(reference, t4.QuantConfig())
    weights, extra = {}, {}
    for name, mod in dense.named_modules():
        if isinstance(mod, torch.nn.Linear) and name != "lm_head":
            gs = t4.compute_global_scale(mod.weight)
            data, scale = t4.nvfp4_quantize(mod.weight, gs)
            weights[name] = CK.NVFP4Weight(data, scale, gs)
    for key, t in dense.state_dict().items():
        if key.rpartition(".")[0] not in weights:    # not an NVFP4 layer's own weight
            extra[key] = t
    if dense.config.tie_word_embeddings:
        extra.pop("lm_head.weight")
    CK.save_safetensors(weights, tmp_path / "model.safetensors", fmt, extra_tensors=extra)
    dense.config.quantization_config = {"quant_method": fmt}
    dense.config.save_pretrained(tmp_path)
    loaded = t4.from_pretrained(tmp_path)
    for name, w in weights.items():
        mod = loaded.get_submodule(name)
        assert isinstance(mod, FP4Linear)
        assert torch.equal(mod.weight, w.data.view(torch.uint8))
        # ModelOpt stores the decode scalar RN(1/gs); its reciprocal may be one ulp from gs, with
        # the same decode factor (checkpoint.py's docstring), so the logits below stay equal
        gs = w.global_scale if fmt == "compressed-tensors" else torch.reciprocal(torch.reciprocal(w.global_scale))
        assert torch.equal(mod.weight_global_scale, gs)
    ids = _ids()
    assert torch.equal(_logits(loaded, ids), _logits(reference, ids))


def test_refusals_name_what_is_wrong(tmp_path):
    from safetensors.torch import load_file, save_file
    model = _dense("mixtral")
    t4.quantize_model(model, t4.QuantConfig())
    t4.save_pretrained(model, tmp_path / "ok", "compressed-tensors")
    tensors = load_file(tmp_path / "ok" / "model.safetensors")

    def rewrite(where, change):
        os.makedirs(tmp_path / where, exist_ok=True)
        for f in ("config.json", "generation_config.json"):
            if os.path.exists(tmp_path / "ok" / f):
                with open(tmp_path / "ok" / f) as src, open(tmp_path / where / f, "w") as dst:
                    dst.write(src.read())
        t = dict(tensors)
        change(t)
        save_file(t, str(tmp_path / where / "model.safetensors"), metadata={"format": "pt"})
        return tmp_path / where

    # a key that names nothing in the model
    bad = rewrite("extra", lambda t: t.__setitem__("model.layers.0.mystery", torch.zeros(3)))
    with pytest.raises(ValueError, match="model.layers.0.mystery"):
        t4.from_pretrained(bad)
    # a dense tensor missing
    bad = rewrite("missing", lambda t: t.pop("model.norm.weight"))
    with pytest.raises(ValueError, match="model.norm.weight"):
        t4.from_pretrained(bad)
    # an expert whose gate and up weight global scales differ: FP4MoE holds one per expert
    key = "model.layers.0.block_sparse_moe.experts.1.w3.weight_global_scale"
    bad = rewrite("scales", lambda t: t.__setitem__(key, t[key] * 2))
    with pytest.raises(ValueError, match="experts.1.w3"):
        t4.from_pretrained(bad)
    # some experts quantized, others not
    def half(t):
        for k in [k for k in t if k.startswith("model.layers.0.block_sparse_moe.experts.0.w2.")]:
            t.pop(k)
        t["model.layers.0.block_sparse_moe.experts.0.w2.weight"] = torch.zeros(64, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="experts"):
        t4.from_pretrained(rewrite("half", half))
    with pytest.raises(FileNotFoundError, match="config.json"):
        t4.from_pretrained(tmp_path / "nowhere")


def test_save_refuses_what_the_formats_cannot_hold(tmp_path):
    dynamic = _dense("llama")
    t4.quantize_model(dynamic, t4.QuantConfig(activations="fp4"))        # no calibration
    with pytest.raises(ValueError, match="fixed activation scale"):
        t4.save_pretrained(dynamic, tmp_path / "a")
    mx = _dense("llama")
    t4.quantize_model(mx, t4.QuantConfig(fmt="mxfp4"))
    with pytest.raises(ValueError, match="NVFP4"):
        t4.save_pretrained(mx, tmp_path / "b")
    with pytest.raises(ValueError, match="fmt"):
        t4.save_pretrained(_dense("llama"), tmp_path / "c", "gguf")
    with pytest.raises(ValueError, match="NVFP4 layers"):
        t4.save_pretrained(_dense("llama"), tmp_path / "d")
    with pytest.raises(TypeError, match="transformers model"):
        t4.save_pretrained(torch.nn.Linear(16, 16), tmp_path / "e")


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llama", "mixtral", "deepseek_v3"])
def test_generate_compiles_fullgraph_with_a_static_cache(family, tmp_path):
    """The loaded FP4 model's forward traces with torch.compile(fullgraph=True) (no graph break
    from the FP4 modules; the eager backend here, inductor and CUDA graphs in the hf command on a
    GPU), and generate() with a static KV cache gives the eager model's tokens."""
    model = _dense(family)
    t4.quantize_model(model, t4.QuantConfig())
    t4.save_pretrained(model, tmp_path)
    loaded = t4.from_pretrained(tmp_path)
    ids = _ids()
    torch._dynamo.reset()
    if family == "deepseek_v3":
        # transformers 4.57's static cache cannot hold MLA's K and V (head dims 32 and 16; the
        # dense model fails the same way): the forward alone, without a cache
        want = loaded(ids, use_cache=False).logits
        compiled = torch.compile(loaded.forward, fullgraph=True, backend="eager")
        assert torch.equal(compiled(ids, use_cache=False).logits, want)
        return
    kw = dict(max_new_tokens=4, do_sample=False, pad_token_id=0, cache_implementation="static",
              disable_compile=True)
    want = loaded.generate(ids, **kw)
    loaded.forward = torch.compile(loaded.forward, fullgraph=True, backend="eager")
    assert torch.equal(loaded.generate(ids, **kw), want)


def test_hf_command_runs_random_and_checkpoint_models(tmp_path, capsys):
    from torch_fp4.examples import hf_generate
    rows = hf_generate.run(family="llama", tokens=2, device="cpu", compile=False)
    assert [r.variant for r in rows] == ["bf16", "NVFP4 W4A16", "NVFP4 W4A4", "MXFP4 W4A16"]
    assert rows[0].accuracy[0] == pytest.approx(1.0) and all(0.5 < r.accuracy[0] <= 1.0 for r in rows)
    assert all(r.weight_bytes < rows[0].weight_bytes / 2 for r in rows[1:])
    model = _dense("mixtral")
    t4.quantize_model(model, t4.QuantConfig())
    t4.save_pretrained(model, tmp_path)
    rows = hf_generate.run(str(tmp_path), tokens=2, device="cpu", compile=False)
    assert [r.variant for r in rows] == ["FP4 checkpoint"] and rows[0].accuracy is None
    assert "FP4 checkpoint" in capsys.readouterr().out


def test_hf_command_bf16_peer_that_breaks_the_graph_is_na(monkeypatch, capsys):
    """A bf16 model whose own forward does not compile with fullgraph=True (transformers 4.57's
    Mixtral experts) gets n/a and a note in the compiled column; an FP4 variant's failure raises."""
    from torch_fp4.examples import hf_generate

    def broken(model, prompt, tokens, cache, repeats):
        if cache is not None:
            raise RuntimeError("data-dependent expression\nmore")
        return 1.0
    monkeypatch.setattr(hf_generate, "_tokens_per_s", broken)
    monkeypatch.setattr(hf_generate, "compile_forward", lambda model, device: None)
    monkeypatch.setattr(hf_generate, "static_cache", lambda model, prompt, tokens: object())
    notes = []
    model = _dense("mixtral")
    got = hf_generate._compiled_tokens_per_s("bf16", model, _ids(), 2, torch.device("cpu"), 1, notes)
    assert got is None and len(notes) == 1
    assert "MixtralForCausalLM" in notes[0] and "data-dependent expression" in notes[0]
    with pytest.raises(RuntimeError, match="data-dependent"):
        hf_generate._compiled_tokens_per_s("NVFP4 W4A16", model, _ids(), 2, torch.device("cpu"), 1, notes)


def test_sharded_directory_loads(tmp_path):
    """model.safetensors.index.json and its shards (each layer's tensors in one shard) load as the
    single file does."""
    from safetensors.torch import load_file, save_file
    model = _dense("qwen3_moe")
    t4.quantize_model(model, t4.QuantConfig())
    t4.save_pretrained(model, tmp_path / "one")
    tensors = load_file(tmp_path / "one" / "model.safetensors")
    shards = {"model-00001-of-00002.safetensors": {}, "model-00002-of-00002.safetensors": {}}
    for key, t in tensors.items():
        second = key.startswith("model.layers.1.") or key.startswith("lm_head")
        shards[f"model-0000{2 if second else 1}-of-00002.safetensors"][key] = t
    os.makedirs(tmp_path / "two")
    for name, part in shards.items():
        save_file(part, str(tmp_path / "two" / name), metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {k: n for n, part in shards.items() for k in part}}
    json.dump(index, open(tmp_path / "two" / "model.safetensors.index.json", "w"))
    with open(tmp_path / "one" / "config.json") as src, open(tmp_path / "two" / "config.json", "w") as dst:
        dst.write(src.read())
    ids = _ids()
    assert torch.equal(_logits(t4.from_pretrained(tmp_path / "two"), ids), _logits(model, ids))


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["llama", "mixtral"])
def test_compiled_generate_on_the_gpu_equals_eager(family, tmp_path):
    """On a GPU: generate() with the hf command's static cache (hf_generate.static_cache, its
    layers allocated before generate and marked as static addresses) and the forward compiled as
    the hf command does (CompileConfig(fullgraph=True, mode='reduce-overhead')) gives the tokens
    of eager generate() with the same cache, twice in a row (the second run replays what the
    first captured), and inductor does not skip CUDA graphs (the cache's in-place updates are
    mutations of static inputs, which CUDA graph trees record): no skip counted or logged, and
    CUDA graphs recorded."""
    import logging
    from torch._dynamo.utils import counters
    from torch_fp4.examples.hf_generate import compile_forward, static_cache
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    model = _dense(family)
    t4.quantize_model(model, t4.QuantConfig())
    t4.save_pretrained(model, tmp_path)
    loaded = t4.from_pretrained(tmp_path, device="cuda")
    ids = _ids().cuda()
    cache = static_cache(loaded, ids, 6)

    def generate(**kw):
        cache.reset()
        return loaded.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0, past_key_values=cache, **kw)

    want = generate(disable_compile=True)
    skips = []

    class Skips(logging.Handler):
        def emit(self, record):
            if "skipping cudagraph" in record.getMessage():
                skips.append(record.getMessage())

    handler, log = Skips(level=logging.WARNING), logging.getLogger("torch._inductor")
    torch._dynamo.reset()
    counters.clear()
    compile_forward(loaded, torch.device("cuda"))
    log.addHandler(handler)
    try:
        for _ in range(2):
            assert torch.equal(generate(), want)
    finally:
        log.removeHandler(handler)
    assert not skips and not counters["inductor"]["cudagraph_skips"], skips
    assert counters["inductor"]["cudagraph_recorded_non_static_inputs"] > 0, dict(counters["inductor"])
