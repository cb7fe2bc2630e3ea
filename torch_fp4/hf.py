"""Hugging Face transformers MoE blocks: what quantize_model needs to know to replace them.

Imports neither transformers (torch_fp4 works without it) nor torch_fp4.nn (nn imports this
module): blocks are recognised by class name and their attributes are checked, and each
supported block is described by a `MoeBlockSpec` (its dense router and experts, and its routing
as `torch_fp4.route` arguments) from which `quantize_model` builds the FP4 module.

Tested against transformers 4.57 (the `hf` extra pins >=4.57,<5), where Mixtral's and
Qwen3-MoE's blocks compute, with `gate` an nn.Linear H -> E applied to the hidden states in the
model's dtype:
    weights = softmax(router_logits in fp32); top-k; (renormalize to sum 1); cast to x.dtype
and return (hidden_states, router_logits). Mixtral always renormalizes; Qwen3-MoE only when
`norm_topk_prob`. That is `route(logits, top_k, "softmax", renormalize)`.

DeepSeek-V3's DeepseekV3MoE returns hidden_states alone: routed experts plus `shared_experts`
(a dense MLP of nn.Linear) of the input. Its router (DeepseekV3TopkRouter, a bare weight
[E, H] and an `e_score_correction_bias` buffer) computes logits in fp32, sigmoid scores, picks
top_k experts by score + bias within the best topk_group of n_group groups (a group scored by
its two best biased scores; the other groups' biased scores are set to 0.0, not -inf), and
weighs them by the unbiased scores, divided by (their sum + 1e-20) only when `norm_topk_prob`,
times routed_scaling_factor, all in fp32 with torch.topk(sorted=False) order. torch_fp4's
`route(method="deepseek_v3")` differs in details (it always normalizes, masks with -inf and
orders by score, ties to the lower id), so the converted block computes this routing itself
(FP4SparseMoeBlock).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Optional

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
    (hidden_states, router_logits) rather than hidden_states alone. The remaining fields are
    DeepSeek-V3's (see the module docstring); shared_experts is kept as the same module, and
    quantize_model converts its nn.Linear layers like any dense projection.
    """
    router: torch.nn.Linear
    w1: tuple
    w2: tuple
    top_k: int
    renormalize: bool
    returns_logits: bool
    # DeepSeek-V3 routing (method "deepseek_v3"): the correction bias [E], grouping, scaling,
    # whether the k weights are normalized, and the dense shared-experts MLP added to the output
    method: str = "softmax"
    routing_bias: Optional[torch.Tensor] = None
    n_group: Optional[int] = None
    topk_group: Optional[int] = None
    routed_scaling_factor: float = 1.0
    norm_topk_prob: bool = True
    shared_experts: Optional[torch.nn.Module] = None


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


def _experts(op: str, block: torch.nn.Module, gate: str, up: str, down: str, count: int) -> tuple:
    """Per expert the (gate, up) nn.Linear pair and the down nn.Linear, SiLU checked."""
    experts = getattr(block, "experts", None)
    if not isinstance(experts, torch.nn.ModuleList) or len(experts) != count:
        C.fail(op, "experts", f"an nn.ModuleList of {count} experts (gate's "
               "out_features)", type(experts).__name__ if not isinstance(experts, torch.nn.ModuleList)
               else f"{len(experts)} experts", TypeError)
    w1, w2 = [], []
    for e, expert in enumerate(experts):
        _silu(f"{op}: experts[{e}]", expert)
        w1.append((_linear(op, f"experts[{e}].{gate}", getattr(expert, gate, None)),
                   _linear(op, f"experts[{e}].{up}", getattr(expert, up, None))))
        w2.append(_linear(op, f"experts[{e}].{down}", getattr(expert, down, None)))
    return tuple(w1), tuple(w2)


def _spec(block: torch.nn.Module, gate: str, up: str, down: str, renormalize: bool) -> MoeBlockSpec:
    op = f"quantize_model: {type(block).__name__}"
    router = _linear(op, "gate", getattr(block, "gate", None))
    top_k = getattr(block, "top_k", None)
    C.integer(op, "top_k", top_k)
    w1, w2 = _experts(op, block, gate, up, down, router.out_features)
    return MoeBlockSpec(router, w1, w2, top_k, renormalize, returns_logits=True)


# class name -> the names of an expert's (gate, up, down) nn.Linear layers in that block
EXPERT_LINEARS: dict[str, tuple[str, str, str]] = {
    "MixtralSparseMoeBlock": ("w1", "w3", "w2"),
    "Qwen3MoeSparseMoeBlock": ("gate_proj", "up_proj", "down_proj"),
    "DeepseekV3MoE": ("gate_proj", "up_proj", "down_proj"),
}


def _mixtral(block: torch.nn.Module) -> MoeBlockSpec:
    # Router jitter (training only, multiplies the input) is not part of inference routing;
    # FP4 blocks are inference-only.
    return _spec(block, *EXPERT_LINEARS["MixtralSparseMoeBlock"], renormalize=True)


def _qwen3_moe(block: torch.nn.Module) -> MoeBlockSpec:
    norm = getattr(block, "norm_topk_prob", None)
    C.boolean(f"quantize_model: {type(block).__name__}", "norm_topk_prob", norm)
    return _spec(block, *EXPERT_LINEARS["Qwen3MoeSparseMoeBlock"], renormalize=norm)


def _deepseek_v3(block: torch.nn.Module) -> MoeBlockSpec:
    op = f"quantize_model: {type(block).__name__}"
    gate = getattr(block, "gate", None)
    weight = getattr(gate, "weight", None)
    bias = getattr(gate, "e_score_correction_bias", None)
    if not (isinstance(weight, torch.Tensor) and weight.dim() == 2
            and isinstance(bias, torch.Tensor) and tuple(bias.shape) == (weight.shape[0],)):
        C.fail(op, "gate", "a DeepseekV3TopkRouter (weight [E, H], e_score_correction_bias [E])",
               type(gate).__name__, TypeError)
    values = {}
    for name in ("top_k", "n_group", "topk_group"):
        values[name] = getattr(gate, name, None)
        C.integer(f"{op}: gate", name, values[name])
    norm = getattr(gate, "norm_topk_prob", None)
    C.boolean(f"{op}: gate", "norm_topk_prob", norm)
    scaling = getattr(gate, "routed_scaling_factor", None)
    C.real(f"{op}: gate", "routed_scaling_factor", scaling)
    # Checked here, before quantize_model changes anything; FP4MoE checks the same. A top_k above
    # topk_group * (experts per group) is refused: transformers would then pick experts of the
    # masked groups.
    from .ops.moe import _validate_route
    meta = torch.device("meta")
    _validate_route(torch.empty(0, weight.shape[0], device=meta), values["top_k"], "deepseek_v3",
                    False, torch.empty(weight.shape[0], device=meta), values["n_group"],
                    values["topk_group"], float(scaling), "auto", op=f"{op}: gate")
    shared = getattr(block, "shared_experts", None)
    if not isinstance(shared, torch.nn.Module):
        C.fail(op, "shared_experts", "a module (the shared experts' MLP)", type(shared).__name__,
               TypeError)
    # The router's weight as an nn.Linear (FP4MoE keeps its router as one); the block computes
    # the logits from it in fp32 as DeepseekV3TopkRouter does.
    router = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False,
                             device=weight.device, dtype=weight.dtype)
    router.weight.data = weight.detach().clone()
    w1, w2 = _experts(op, block, *EXPERT_LINEARS["DeepseekV3MoE"], weight.shape[0])
    return MoeBlockSpec(router, w1, w2, values["top_k"], False, returns_logits=False,
                        method="deepseek_v3", routing_bias=bias.detach(), n_group=values["n_group"],
                        topk_group=values["topk_group"], routed_scaling_factor=float(scaling),
                        norm_topk_prob=norm, shared_experts=shared)


# class name -> spec extractor. A block is only added after its forward in the supported
# transformers range has been read and matched by a test (tests/test_hf.py).
MOE_BLOCKS: dict[str, Callable[[torch.nn.Module], MoeBlockSpec]] = {
    "MixtralSparseMoeBlock": _mixtral,
    "Qwen3MoeSparseMoeBlock": _qwen3_moe,
    "DeepseekV3MoE": _deepseek_v3,
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
