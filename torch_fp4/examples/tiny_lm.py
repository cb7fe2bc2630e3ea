"""A small causal transformer LM with random weights (fixed seed, nothing downloaded), dense or
MoE, in bf16: token embedding, pre-norm blocks of causal attention and a SwiGLU MLP (or a routed
mixture of SwiGLU experts), final RMSNorm, LM head. Used by `python -m torch_fp4 demo`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as Fn
from torch import nn

from .. import ops
from ..nn import FP4MoE


@dataclass(frozen=True)
class LMConfig:
    vocab: int = 1024
    hidden: int = 256
    heads: int = 4
    layers: int = 4
    ffn: int = 768                # dense SwiGLU width
    experts: int = 8              # MoE variant: experts per block, each of width expert_ffn
    expert_ffn: int = 256
    top_k: int = 2
    routing: str = "renormalize"  # torch_fp4.route method
    logit_scale: float = 4.0      # std of the random logits (peaked next-token distributions)


class Attention(nn.Module):
    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.heads = cfg.heads
        self.qkv = nn.Linear(cfg.hidden, 3 * cfg.hidden, bias=False)
        self.o = nn.Linear(cfg.hidden, cfg.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, h // self.heads).transpose(1, 3).unbind(2)
        att = Fn.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(att.transpose(1, 2).reshape(b, t, h))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate) * up), gate and up in one [gate; up] projection."""

    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.gate_up = nn.Linear(cfg.hidden, 2 * cfg.ffn, bias=False)
        self.down = nn.Linear(cfg.ffn, cfg.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(Fn.silu(gate) * up)


class MoE(nn.Module):
    """Router (nn.Linear hidden -> experts) plus bf16 SwiGLU experts w1 [E, 2I, H] ([gate; up]
    rows) and w2 [E, H, I]; each token's output is the routing-weighted sum of its top_k experts.
    Every expert runs on every token (simple, no host sync); `to_fp4` swaps in an FP4MoE."""

    def __init__(self, cfg: LMConfig):
        super().__init__()
        e, h, i = cfg.experts, cfg.hidden, cfg.expert_ffn
        self.top_k, self.routing = cfg.top_k, cfg.routing
        self.router = nn.Linear(h, e, bias=False)
        self.w1 = nn.Parameter(torch.empty(e, 2 * i, h), requires_grad=False)
        self.w2 = nn.Parameter(torch.empty(e, h, i), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = x.reshape(-1, x.shape[-1])
        ids, weights = ops.route(self.router(a), self.top_k, self.routing)
        combine = torch.zeros(a.shape[0], self.w1.shape[0], device=a.device)
        combine = combine.scatter(1, ids.long(), weights)             # [T, E] routing weights
        out = torch.zeros(a.shape, dtype=torch.float32, device=a.device)
        for e in range(self.w1.shape[0]):
            gate, up = (a @ self.w1[e].T).chunk(2, dim=-1)
            out = out + combine[:, e:e + 1] * ((Fn.silu(gate) * up) @ self.w2[e].T).float()
        return out.to(x.dtype).reshape(x.shape)

    def to_fp4(self, activations: str, calibration: Optional[torch.Tensor] = None) -> FP4MoE:
        return FP4MoE.from_experts(self.router, self.w1, self.w2, top_k=self.top_k,
                                   method=self.routing, activations=activations,
                                   calibration=calibration)


class Block(nn.Module):
    def __init__(self, cfg: LMConfig, moe: bool):
        super().__init__()
        self.attn_norm, self.mlp_norm = nn.RMSNorm(cfg.hidden, eps=1e-6), nn.RMSNorm(cfg.hidden, eps=1e-6)
        self.attn = Attention(cfg)
        self.mlp = MoE(cfg) if moe else MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class TinyLM(nn.Module):
    """tokens [B, T] (int64) -> next-token logits [B, T, vocab]."""

    def __init__(self, cfg: LMConfig, moe: bool = False, seed: int = 0,
                 device: Optional[torch.device] = None, dtype: torch.dtype = torch.bfloat16):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.hidden)
        self.blocks = nn.ModuleList(Block(cfg, moe) for _ in range(cfg.layers))
        self.norm = nn.RMSNorm(cfg.hidden, eps=1e-6)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)
        self._init(seed)
        self.requires_grad_(False).to(device, dtype)

    @torch.no_grad()
    def _init(self, seed: int) -> None:
        """Normal weights with std 1/sqrt(fan_in); output projections shrunk by the depth, so
        the residual stream keeps its scale; the LM head gives logits of std `logit_scale`."""
        g = torch.Generator().manual_seed(seed)
        depth = (2 * self.cfg.layers) ** -0.5
        for name, p in self.named_parameters():
            if p.dim() < 2:
                continue                                        # norm weights stay 1
            scale = 1.0 if name == "embed.weight" else p.shape[-1] ** -0.5
            if name.endswith(("o.weight", "down.weight", "w2")):
                scale *= depth
            if name == "lm_head.weight":
                scale *= self.cfg.logit_scale
            p.copy_(torch.randn(p.shape, generator=g) * scale)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.norm(x))


def moe_inputs(model: TinyLM, tokens: torch.Tensor) -> list[torch.Tensor]:
    """The input of each block's MoE for `tokens` (for calibrating W4A4 activation scales)."""
    seen: list[torch.Tensor] = []
    hooks = [b.mlp.register_forward_pre_hook(lambda m, args: seen.append(args[0].detach()))
             for b in model.blocks]
    try:
        with torch.no_grad():
            model(tokens)
    finally:
        for h in hooks:
            h.remove()
    return seen


def moe_to_fp4(model: TinyLM, activations: str, calibration_tokens: torch.Tensor) -> TinyLM:
    """Replace every block's bf16 MoE by an FP4MoE (NVFP4 experts; W4A4 calibrated on the MoE
    inputs that `calibration_tokens` produce in `model`), in place."""
    inputs = moe_inputs(model, calibration_tokens) if activations == "fp4" else [None] * len(model.blocks)
    for block, x in zip(model.blocks, inputs):
        block.mlp = block.mlp.to_fp4(activations, x)
    return model
