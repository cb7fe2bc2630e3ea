"""Hugging Face transformers MoE blocks: what quantize_model needs to know to replace them.

Imports neither transformers (torch_fp4 works without it) nor torch_fp4.nn (nn imports this
module): blocks are recognised by class name and their attributes are checked, and each
supported block is described by a `MoeBlockSpec` (its dense router and experts, and its routing
as `torch_fp4.route` arguments) from which `quantize_model` builds the FP4 module.

Tested against transformers 4.57 (the `hf` extra pins >=4.57,<5), where both supported blocks
compute, with `gate` an nn.Linear H -> E applied to the hidden states in the model's dtype:
    weights = softmax(router_logits in fp32); top-k; (renormalize to sum 1); cast to x.dtype
and return (hidden_states, router_logits). Mixtral always renormalizes; Qwen3-MoE only when
`norm_topk_prob`. That is `route(logits, top_k, "softmax", renormalize)`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import torch

from .ops import _checks as C

# A class name that looks like a mixture-of-experts block: transformers' blocks end with
# "SparseMoeBlock" (Mixtral, Qwen2/3-MoE, OLMoE, Phi-MoE, Jamba), "MoE" (DeepSeek-V3, GLM-4-MoE)
# or "Moe" (Llama 4). quantize_model refuses such a block unless MOE_BLOCKS knows it, rather
# than converting its experts one nn.Linear at a time (and its router with them).
MOE_LIKE = re.compile(r"(MoeBlock|MoE|Moe)$")


@dataclass(frozen=True)
class MoeBlockSpec:
    """One supported block in the terms of FP4MoE.from_experts, plus its return structure.

    router: the block's nn.Linear H -> E (kept dense); w1: per expert a (gate, up) pair of
    nn.Linear; w2: per expert the down nn.Linear; returns_logits: forward returns
    (hidden_states, router_logits) rather than hidden_states alone.
    """
    router: torch.nn.Linear
    w1: tuple
    w2: tuple
    top_k: int
    renormalize: bool
    returns_logits: bool


def is_moe_like(module: torch.nn.Module) -> bool:
    """Whether the module's class name is one MOE_LIKE matches (see there)."""
    return MOE_LIKE.search(type(module).__name__) is not None


def _silu(op: str, expert: torch.nn.Module) -> None:
    """Only SiLU maps to fused_moe's SwiGLU (silu(gate) * up); any other activation would be
    computed wrongly, so it is refused."""
    act = getattr(expert, "act_fn", None)
    name = type(act).__name__
    # transformers' ACT2FN: "silu" -> SiLUActivation, "swish" -> torch.nn.SiLU
    if name not in ("SiLU", "SiLUActivation"):
        C.fail(op, "act_fn", "SiLU (config.hidden_act 'silu': FP4MoE's experts are SwiGLU)",
               name if act is not None else "no act_fn attribute")


def _linear(op: str, name: str, mod) -> torch.nn.Linear:
    if not isinstance(mod, torch.nn.Linear):
        C.fail(op, name, "an nn.Linear", type(mod).__name__, TypeError)
    return mod


def _spec(block: torch.nn.Module, gate: str, up: str, down: str, renormalize: bool) -> MoeBlockSpec:
    op = f"quantize_model: {type(block).__name__}"
    router = _linear(op, "gate", getattr(block, "gate", None))
    experts = getattr(block, "experts", None)
    if not isinstance(experts, torch.nn.ModuleList) or len(experts) != router.out_features:
        C.fail(op, "experts", f"an nn.ModuleList of {router.out_features} experts (gate's "
               "out_features)", type(experts).__name__ if not isinstance(experts, torch.nn.ModuleList)
               else f"{len(experts)} experts", TypeError)
    top_k = getattr(block, "top_k", None)
    C.integer(op, "top_k", top_k)
    w1, w2 = [], []
    for e, expert in enumerate(experts):
        _silu(f"{op}: experts[{e}]", expert)
        w1.append((_linear(op, f"experts[{e}].{gate}", getattr(expert, gate, None)),
                   _linear(op, f"experts[{e}].{up}", getattr(expert, up, None))))
        w2.append(_linear(op, f"experts[{e}].{down}", getattr(expert, down, None)))
    return MoeBlockSpec(router, tuple(w1), tuple(w2), top_k, renormalize, returns_logits=True)


def _mixtral(block: torch.nn.Module) -> MoeBlockSpec:
    # Router jitter (training only, multiplies the input) is not part of inference routing;
    # FP4 blocks are inference-only.
    return _spec(block, "w1", "w3", "w2", renormalize=True)


def _qwen3_moe(block: torch.nn.Module) -> MoeBlockSpec:
    norm = getattr(block, "norm_topk_prob", None)
    C.boolean(f"quantize_model: {type(block).__name__}", "norm_topk_prob", norm)
    return _spec(block, "gate_proj", "up_proj", "down_proj", renormalize=norm)


# class name -> spec extractor. A block is only added after its forward in the supported
# transformers range has been read and matched by a test (tests/test_hf.py).
MOE_BLOCKS: dict[str, Callable[[torch.nn.Module], MoeBlockSpec]] = {
    "MixtralSparseMoeBlock": _mixtral,
    "Qwen3MoeSparseMoeBlock": _qwen3_moe,
}


def moe_block_spec(block: torch.nn.Module) -> MoeBlockSpec:
    """The spec of a supported block; ValueError naming the class of an unsupported one."""
    name = type(block).__name__
    extract = MOE_BLOCKS.get(name)
    if extract is None:
        C.fail("quantize_model", name, "a supported MoE block (" + ", ".join(MOE_BLOCKS) +
               "); exclude it with QuantConfig(exclude=...) to keep it dense",
               f"unsupported MoE block class {name}")
    return extract(block)
