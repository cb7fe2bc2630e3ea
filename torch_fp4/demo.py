"""`python -m torch_fp4 demo`: quantize a small random transformer block and MoE layer to FP4
and compare them with bf16.

Runs on the GPU when there is one, on the CPU otherwise, with the backend chosen by "auto".
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as Fn

from . import formats as F
from . import ops
from .nn import QuantConfig, quantize_model


@dataclass(frozen=True)
class Mode:
    name: str
    fmt: F.Fp4Format
    activations: str


MODES = (Mode("NVFP4 W4A16", F.NVFP4, "bf16"), Mode("NVFP4 W4A4", F.NVFP4, "fp4"),
         Mode("MXFP4 W4A16", F.MXFP4, "bf16"), Mode("MXFP4 W4A4", F.MXFP4, "fp4"))


class Block(torch.nn.Module):
    """Pre-norm attention + SwiGLU MLP, random weights, bf16 activations."""

    def __init__(self, hidden: int, heads: int, ffn: int, device: torch.device, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)

        def lin(n, k):
            layer = torch.nn.Linear(k, n, bias=False, device=device, dtype=torch.bfloat16)
            layer.weight.data.copy_(torch.randn(n, k, generator=g) / k ** 0.5)
            return layer
        self.heads = heads
        self.qkv, self.o = lin(3 * hidden, hidden), lin(hidden, hidden)
        self.gate_up, self.down = lin(2 * ffn, hidden), lin(hidden, ffn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        q, k, v = self.qkv(Fn.rms_norm(x, (h,))).view(b, t, 3, self.heads, -1).unbind(2)
        att = Fn.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                              v.transpose(1, 2), is_causal=True)
        x = x + self.o(att.transpose(1, 2).reshape(b, t, h))
        gate, up = self.gate_up(Fn.rms_norm(x, (h,))).chunk(2, dim=-1)
        return x + self.down(Fn.silu(gate) * up)


def _compare(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    o, r = out.double().flatten(), ref.double().flatten()
    return ((o - r).norm() / r.norm()).item(), Fn.cosine_similarity(o, r, dim=0).item()


def _moe_rows(device: torch.device, tokens: int, hidden: int, inter: int, experts: int, top_k: int):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(tokens, hidden, generator=g).to(device, torch.bfloat16)
    w1 = (torch.randn(experts, 2 * inter, hidden, generator=g) / hidden ** 0.5).to(device, torch.bfloat16)
    w2 = (torch.randn(experts, hidden, inter, generator=g) / inter ** 0.5).to(device, torch.bfloat16)
    ids, wts = ops.route(torch.randn(tokens, experts, generator=g).to(device), top_k,
                         method="renormalize")
    ref = torch.zeros(tokens, hidden, dtype=torch.float32, device=device)
    for j in range(top_k):
        e = ids[:, j].long()
        h = torch.einsum("th,tnh->tn", x.float(), w1[e].float())
        act = Fn.silu(h[:, :inter]) * h[:, inter:]
        ref += wts[:, j:j + 1] * torch.einsum("ti,thi->th", act, w2[e].float())
    gs1 = torch.cat([ops.compute_global_scale(w) for w in w1])
    gs2 = torch.cat([ops.compute_global_scale(w) for w in w2])
    w1q, w1s = ops.nvfp4_quantize(w1, gs1)
    w2q, w2s = ops.nvfp4_quantize(w2, gs2)
    rows = []
    for name, extra in (("FP4 MoE W4A16", {}),
                        ("FP4 MoE W4A4", {"a1_global_scale": ops.compute_global_scale(x),
                                          "a2_global_scale": torch.full((1,), 2688.0 / 4, device=device)})):
        out = ops.fused_moe(x, w1q, w1s, gs1, w2q, w2s, gs2, ids, wts, **extra)
        rows.append((name, *_compare(out, ref)))
    return rows


def run(device: str | None = None, seed: int = 0) -> list[tuple]:
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    hidden, heads, ffn, batch, seq = 256, 4, 512, 2, 32
    print(f"torch_fp4 demo on {dev} ({torch.cuda.get_device_name(dev) if dev.type == 'cuda' else 'CPU'}); "
          f"block hidden={hidden} heads={heads} ffn={ffn}, tokens={batch}x{seq}", flush=True)
    block = Block(hidden, heads, ffn, dev, seed)
    x = torch.randn(batch, seq, hidden, generator=torch.Generator().manual_seed(seed + 1)).to(dev, torch.bfloat16)
    with torch.inference_mode():
        ref = block(x)
    bf16_bytes = sum(p.numel() * 2 for p in block.parameters())
    rows = []
    for i, mode in enumerate(MODES, 1):
        t0 = time.perf_counter()
        fp4 = quantize_model(copy.deepcopy(block), QuantConfig(mode.fmt.name, mode.activations))
        nbytes = sum(b.numel() * b.element_size() for n, b in fp4.named_buffers()
                     if not n.endswith("input_global_scale_bits"))
        with torch.inference_mode():
            out = fp4(x)
        rows.append((mode.name, *_compare(out, ref), bf16_bytes / nbytes, time.perf_counter() - t0))
        print(f"  [{i}/{len(MODES) + 1}] {mode.name}: done in {rows[-1][-1]:.2f}s", flush=True)
    moe = _moe_rows(dev, tokens=64, hidden=hidden, inter=128, experts=8, top_k=2)
    print(f"  [{len(MODES) + 1}/{len(MODES) + 1}] fused MoE: done", flush=True)
    print()
    print(f"{'variant':<16} {'rel. error':>10} {'cosine':>8} {'weights vs bf16':>16}")
    for name, err, cos, ratio, _ in rows:
        print(f"{name:<16} {err:>10.4f} {cos:>8.5f} {ratio:>15.2f}x")
    for name, err, cos in moe:
        print(f"{name:<16} {err:>10.4f} {cos:>8.5f} {'':>16}")
    print("\nError is relative to the same model in bf16 (Frobenius norm of the difference); "
          "weights compress by the factor shown.")
    return rows + moe
