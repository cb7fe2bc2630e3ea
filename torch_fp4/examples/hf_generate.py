"""`python -m torch_fp4 hf`: a transformers causal LM quantized to FP4 generates text (greedy), and
the run prints, per variant (bf16, NVFP4 W4A16 / W4A4, MXFP4 W4A16 for dense families): accuracy
against the bf16 model over the generated positions (logit cosine, KL(bf16 || FP4), top-1
agreement, from the logits of each model on the bf16 model's generated sequence), tokens/s of
generate() eager and compiled (torch.compile(fullgraph=True) of the forward with a static KV
cache, built by static_cache before generate; on a GPU mode="reduce-overhead", i.e. CUDA
graphs), and weight memory.

With no --model it builds a small random model of --family from a transformers config (nothing
is downloaded). --model PATH takes a local model directory: a dense one is quantized like the
random model; one holding an NVFP4 checkpoint (save_pretrained's, ModelOpt's or
compressed-tensors' naming) is loaded with torch_fp4.from_pretrained and timed alone (there is
no bf16 model to compare it with).
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from .. import checkpoint as CK
from ..demo import _fmt_tps, accuracy, progress, weight_bytes
from ..nn import QuantConfig, quantize_model
from ..nn.pretrained import _transformers, from_pretrained

FAMILIES = ("llama", "mixtral", "qwen3_moe", "deepseek_v3")
_TINY = dict(vocab_size=128, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=None)
_SMALL = dict(_TINY, vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
              num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=512)
# size -> family -> (transformers config class, its fields): "tiny" for the tests (seconds on a
# CPU), "small" for the hf command
CONFIGS = {
    "tiny": {
        "llama": ("LlamaConfig", _TINY),
        "mixtral": ("MixtralConfig", dict(_TINY, num_local_experts=4, num_experts_per_tok=2)),
        "qwen3_moe": ("Qwen3MoeConfig", dict(_TINY, head_dim=16, moe_intermediate_size=32, num_experts=8,
                                             num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
                                             mlp_only_layers=[])),
        "deepseek_v3": ("DeepseekV3Config", dict(_TINY, num_key_value_heads=4, moe_intermediate_size=32,
                                                 n_routed_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2,
                                                 first_k_dense_replace=1, q_lora_rank=32, kv_lora_rank=32,
                                                 qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=16)),
    },
    "small": {
        "llama": ("LlamaConfig", _SMALL),
        "mixtral": ("MixtralConfig", dict(_SMALL, num_local_experts=8, num_experts_per_tok=2)),
        "qwen3_moe": ("Qwen3MoeConfig", dict(_SMALL, head_dim=32, moe_intermediate_size=128, num_experts=16,
                                             num_experts_per_tok=4, norm_topk_prob=True, decoder_sparse_step=1,
                                             mlp_only_layers=[])),
        "deepseek_v3": ("DeepseekV3Config", dict(_SMALL, num_key_value_heads=8, moe_intermediate_size=128,
                                                 n_routed_experts=16, num_experts_per_tok=4, n_group=4, topk_group=2,
                                                 first_k_dense_replace=1, q_lora_rank=64, kv_lora_rank=64,
                                                 qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=32)),
    },
}


# families whose compiled generate is not measured, and why
NO_STATIC_CACHE = {"deepseek_v3": "transformers 4.57's static KV cache cannot hold DeepSeek-V3's MLA keys and "
                                  "values (different head dims), the dense model's generate fails the same way"}


@dataclass(frozen=True)
class Row:
    variant: str
    accuracy: Optional[tuple]          # (cosine, KL, top-1), None without a bf16 model
    eager_tps: float
    compiled_tps: Optional[float]
    weight_bytes: int


def random_model(family: str, seed: int = 0, device="cpu", size: str = "small") -> torch.nn.Module:
    """A random bf16 causal LM of `family` and `size` (CONFIGS) built from a transformers config
    as transformers builds a bf16 model (nothing is downloaded)."""
    tr = _transformers("hf")
    name, fields = CONFIGS[size][family]
    config = getattr(tr, name)(**fields)
    torch.manual_seed(seed)
    return tr.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).to(device).eval()


def _is_fp4_dir(path: str) -> bool:
    with open(os.path.join(path, "config.json")) as f:
        qc = json.load(f).get("quantization_config") or {}
    return qc.get("quant_method") in CK.CHECKPOINT_FORMATS


def _variants(family: Optional[str], prompt: torch.Tensor, load: Callable[[], torch.nn.Module]):
    """(name, builder) per variant; MXFP4 only for dense models (FP4MoE experts are NVFP4)."""
    def quantized(fmt: str, activations: str) -> Callable[[], torch.nn.Module]:
        def build():
            model = load()
            quantize_model(model, QuantConfig(fmt=fmt, activations=activations),
                           calibration=prompt if activations == "fp4" and fmt == "nvfp4" else None)
            return model
        return build
    out = [("bf16", load), ("NVFP4 W4A16", quantized("nvfp4", "bf16")), ("NVFP4 W4A4", quantized("nvfp4", "fp4"))]
    if family in (None, "llama"):
        out.append(("MXFP4 W4A16", quantized("mxfp4", "bf16")))
    return out


def static_cache(model, prompt: torch.Tensor, tokens: int):
    """transformers' StaticCache for generate(prompt, max_new_tokens=tokens) on `model`, its
    layers allocated here, eagerly (Cache.early_initialization, with the head sizes transformers'
    own export recipes read from the config). StaticLayer.lazy_initialization marks the keys and
    values with torch._dynamo.mark_static_address only when it runs outside a traced graph (it
    skips the marking while dynamo traces); allocated here, they are always marked, so inductor
    takes them as static inputs, whose in-place updates (index_copy_) CUDA graphs may record,
    instead of skipping CUDA graphs for "mutated inputs". One cache serves every generate() of
    the same prompt shape (_generate resets it in place; a new cache would move the addresses
    the graphs were recorded with). Holds the prompt and every generated token but the last (as
    generate's own static cache: max_length - 1)."""
    tr = _transformers("hf")
    config = model.config.get_text_config(decoder=True)
    cache = tr.StaticCache(config=config, max_cache_len=prompt.shape[1] + tokens - 1)
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    cache.early_initialization(prompt.shape[0], heads, head_dim, model.get_input_embeddings().weight.dtype,
                               prompt.device)
    return cache


def _generate(model, prompt: torch.Tensor, tokens: int, cache=None) -> torch.Tensor:
    """Greedy generate(); with `cache` (static_cache) the static KV cache, reset first, and on a
    GPU the forward compiled by generate itself (compile_forward set its config)."""
    kw = {}
    if cache is not None:
        cache.reset()                      # zeroed in place: same addresses, no cached tokens
        kw = dict(past_key_values=cache, disable_compile=not prompt.is_cuda)
    return model.generate(prompt, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False,
                          pad_token_id=0, **kw)


def _tokens_per_s(model, prompt: torch.Tensor, tokens: int, cache, repeats: int) -> float:
    _generate(model, prompt, tokens, cache)               # warm-up (compiles, captures graphs)
    cuda = prompt.is_cuda
    best = float("inf")
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        _generate(model, prompt, tokens, cache)
        if cuda:
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return prompt.shape[0] * tokens / best


def _compiled_tokens_per_s(name: str, model, prompt: torch.Tensor, tokens: int, device: torch.device,
                           repeats: int, notes: list[str]) -> Optional[float]:
    """Compiled generate()'s tokens/s (compile_forward, static_cache). The FP4 variants must compile
    with fullgraph=True (a failure raises); the bf16 peer is transformers' own model, some of whose
    blocks do not (4.57's Mixtral experts loop over the routed experts, data-dependent): then
    its compiled column is n/a, with a note saying why."""
    torch._dynamo.reset()
    compile_forward(model, device)
    try:
        return _tokens_per_s(model, prompt, tokens, static_cache(model, prompt, tokens), repeats)
    except Exception as exc:
        if name != "bf16":
            raise
        torch._dynamo.reset()
        text = str(exc).strip()
        first = text.splitlines()[0] if text else ""
        notes.append(f"bf16 compiled: n/a: transformers' own {type(model).__name__} does not compile with "
                     f"fullgraph=True ({type(exc).__name__}: {first[:160]})")
        return None


def compile_forward(model: torch.nn.Module, device: torch.device) -> None:
    """The forward compiled with fullgraph=True (a graph break is an error), generate() then run
    with a static KV cache (static_cache). On a GPU generate compiles it itself (mode
    "reduce-overhead": CUDA graphs) and keeps the prefill eager; on the CPU the forward is
    compiled here."""
    if device.type == "cuda":
        model.generation_config.compile_config = _transformers("hf").CompileConfig(fullgraph=True,
                                                                                     mode="reduce-overhead")
    else:
        model.forward = torch.compile(model.forward, fullgraph=True)


def run(model_path: Optional[str] = None, family: str = "llama", tokens: int = 32, device: Optional[str] = None,
        seed: int = 0, compile: Optional[bool] = None, batch: int = 2, prompt_len: int = 16) -> list[Row]:
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cuda = dev.type == "cuda"
    do_compile = cuda if compile is None else compile
    if do_compile and model_path is None and family in NO_STATIC_CACHE:
        print(f"compiled: off ({NO_STATIC_CACHE[family]})", flush=True)
        do_compile = False
    tr = _transformers("hf")
    if model_path is not None and _is_fp4_dir(model_path):
        variants, fam = [("FP4 checkpoint", lambda: from_pretrained(model_path, device=dev))], None
    elif model_path is not None:
        def load():
            return tr.AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.bfloat16,
                                                           local_files_only=True).to(dev).eval()
        variants, fam = None, None
    else:
        def load():
            return random_model(family, seed, dev)
        variants, fam = None, family
    # the config alone (sizes for the prompt and the header), no model built for it
    if model_path is not None:
        config = tr.AutoConfig.from_pretrained(model_path, local_files_only=True)
    else:
        name, fields = CONFIGS["small"][family]
        config = getattr(tr, name)(**fields)
    gen = torch.Generator().manual_seed(seed + 1)
    prompt = torch.randint(2, config.vocab_size, (batch, prompt_len), generator=gen).to(dev)
    if variants is None:
        variants = _variants(fam, prompt, load)
    where = torch.cuda.get_device_name(dev) if cuda else "CPU, reference backend"
    what = model_path or f"random {family} ({config.num_hidden_layers} layers, hidden {config.hidden_size})"
    print(f"torch_fp4 hf on {dev} ({where}): {what}; {batch} prompts of {prompt_len} tokens, {tokens} "
          f"new tokens each (greedy)", flush=True)
    bar = progress(len(variants) * (2 + do_compile), "hf")
    rows, ref_seq, ref_logits, notes = [], None, None, []
    repeats = 3 if cuda else 1
    try:
        with torch.no_grad():
            for name, build in variants:
                bar.set_description_str(f"{name}: build and generate")
                model = build()
                if ref_seq is None:
                    ref_seq = _generate(model, prompt, tokens)
                logits = model(ref_seq).logits[:, prompt_len - 1:-1].float()
                acc = None
                if name == "bf16":
                    ref_logits = logits
                if ref_logits is not None:
                    acc = accuracy(logits, ref_logits)
                bar.update()
                bar.set_description_str(f"{name}: eager generate")
                eager = _tokens_per_s(model, prompt, tokens, None, repeats)
                bar.update()
                compiled = None
                if do_compile:
                    bar.set_description_str(f"{name}: compile and generate")
                    compiled = _compiled_tokens_per_s(name, model, prompt, tokens, dev, repeats, notes)
                    bar.update()
                rows.append(Row(name, acc, eager, compiled, weight_bytes(model)))
                del model
    finally:
        bar.close()
    print_table(rows)
    how = ("torch.compile(fullgraph=True" + (", mode='reduce-overhead')" if cuda else ")") +
           " of the forward, static KV cache") if do_compile else "not run (--compile to add it)"
    print(f"\nAccuracy: logits of each model on the bf16 model's {batch} generated sequences at the "
          f"{tokens} generated positions; KL(bf16 || FP4) in nats. Speed: generate() of {tokens} tokens "
          f"({'best of 3 after a warm-up' if cuda else 'one run after a warm-up'}); compiled: {how}. "
          "Weights: every parameter and buffer (embeddings, norms, routers and the LM head stay bf16).")
    for note in notes:
        print(note)
    if not cuda:
        print("On the CPU every torch_fp4 op runs the reference backend (it dequantizes the weights on "
              "every call): the speed column says nothing about the GPU kernels.")
    return rows


def print_table(rows: list[Row]) -> None:
    base = rows[0].weight_bytes if rows and rows[0].variant == "bf16" else None
    head = (f"{'variant':<14} {'logit cos':>9} {'KL':>9} {'top-1':>6} {'eager tok/s':>12} "
            f"{'compiled tok/s':>15} {'weights MiB':>12} {'vs bf16':>8}")
    print("\n" + head + "\n" + "-" * len(head))
    for r in rows:
        acc = (f"{r.accuracy[0]:>9.5f} {r.accuracy[1]:>9.5f} {r.accuracy[2]:>6.3f}" if r.accuracy
               else f"{'n/a':>9} {'n/a':>9} {'n/a':>6}")
        ratio = f"{base / r.weight_bytes:>7.2f}x" if base else f"{'n/a':>8}"
        print(f"{r.variant:<14} {acc} {_fmt_tps(r.eager_tps):>12} {_fmt_tps(r.compiled_tps):>15} "
              f"{r.weight_bytes / 2**20:>12.2f} {ratio}")
