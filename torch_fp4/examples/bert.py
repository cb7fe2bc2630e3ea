"""A BERT encoder in plain PyTorch, for sentence embeddings (post-LayerNorm blocks, GELU with
erf, absolute position embeddings, token type 0, mean pooling over the attention mask, then L2
normalization), loadable from a Hugging Face BERT `model.safetensors`."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as Fn
from torch import nn


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int = 30522
    hidden_size: int = 384
    num_layers: int = 6
    num_heads: int = 12
    intermediate_size: int = 1536
    max_positions: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12

    @classmethod
    def from_json(cls, path: str | Path) -> "BertConfig":
        """From a Hugging Face `config.json` (BERT with absolute positions and GELU only)."""
        cfg = json.loads(Path(path).read_text())
        for key, want in (("hidden_act", "gelu"), ("position_embedding_type", "absolute")):
            if cfg.get(key, want) != want:
                raise ValueError(f"BertConfig.from_json: {key}: expected {want!r}, got {cfg[key]!r}")
        return cls(cfg["vocab_size"], cfg["hidden_size"], cfg["num_hidden_layers"],
                   cfg["num_attention_heads"], cfg["intermediate_size"],
                   cfg["max_position_embeddings"], cfg["type_vocab_size"], cfg["layer_norm_eps"])


class BertLayer(nn.Module):
    """x = LN(x + attn(x)); x = LN(x + ffn_out(gelu(ffn_in(x))))."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        h, eps = cfg.hidden_size, cfg.layer_norm_eps
        self.heads = cfg.num_heads
        self.q, self.k, self.v, self.attn_out = (nn.Linear(h, h) for _ in range(4))
        self.attn_norm = nn.LayerNorm(h, eps=eps)
        self.ffn_in = nn.Linear(h, cfg.intermediate_size)
        self.ffn_out = nn.Linear(cfg.intermediate_size, h)
        self.ffn_norm = nn.LayerNorm(h, eps=eps)

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape

        def heads(y):
            return y.view(b, t, self.heads, h // self.heads).transpose(1, 2)
        att = Fn.scaled_dot_product_attention(heads(self.q(x)), heads(self.k(x)), heads(self.v(x)),
                                              attn_mask=keep)
        x = self.attn_norm(x + self.attn_out(att.transpose(1, 2).reshape(b, t, h)))
        return self.ffn_norm(x + self.ffn_out(Fn.gelu(self.ffn_in(x))))


class BertEncoder(nn.Module):
    """Token ids [B, T] and attention mask [B, T] -> unit-norm sentence embeddings [B, H]."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        h = cfg.hidden_size
        self.cfg = cfg
        self.word = nn.Embedding(cfg.vocab_size, h)
        self.position = nn.Embedding(cfg.max_positions, h)
        self.token_type = nn.Embedding(cfg.type_vocab_size, h)
        self.embed_norm = nn.LayerNorm(h, eps=cfg.layer_norm_eps)
        self.layers = nn.ModuleList(BertLayer(cfg) for _ in range(cfg.num_layers))

    def hidden_states(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        x = self.word(ids) + self.position.weight[:t] + self.token_type.weight[0]
        x = self.embed_norm(x)
        keep = mask.bool()[:, None, None, :]          # attend to real tokens only
        for layer in self.layers:
            x = layer(x, keep)
        return x

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.hidden_states(ids, mask).float()
        m = mask.to(x.dtype).unsqueeze(-1)
        pooled = (x * m).sum(1) / m.sum(1).clamp_min(1e-9)
        return Fn.normalize(pooled, p=2, dim=-1)

    def load_safetensors(self, path: str | Path) -> None:
        """Load Hugging Face BERT weights (`embeddings.*`, `encoder.layer.N.*`; the pooler and
        position ids are not used)."""
        from safetensors.torch import load_file
        src = load_file(str(path))
        names = {"word.weight": "embeddings.word_embeddings.weight",
                 "position.weight": "embeddings.position_embeddings.weight",
                 "token_type.weight": "embeddings.token_type_embeddings.weight",
                 "embed_norm.weight": "embeddings.LayerNorm.weight",
                 "embed_norm.bias": "embeddings.LayerNorm.bias"}
        parts = {"q": "attention.self.query", "k": "attention.self.key",
                 "v": "attention.self.value", "attn_out": "attention.output.dense",
                 "attn_norm": "attention.output.LayerNorm", "ffn_in": "intermediate.dense",
                 "ffn_out": "output.dense", "ffn_norm": "output.LayerNorm"}
        for i in range(self.cfg.num_layers):
            for ours, theirs in parts.items():
                for p in ("weight", "bias"):
                    names[f"layers.{i}.{ours}.{p}"] = f"encoder.layer.{i}.{theirs}.{p}"
        missing = sorted(v for v in names.values() if v not in src)
        if missing:
            raise ValueError(f"BertEncoder.load_safetensors: path: expected BERT weights "
                             f"({len(names)} tensors), got a file without {', '.join(missing[:3])}"
                             f"{' ...' if len(missing) > 3 else ''}")
        self.load_state_dict({ours: src[theirs] for ours, theirs in names.items()})
