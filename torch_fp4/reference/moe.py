"""Reference routing and FP4 fused MoE (spec section 6)."""
from __future__ import annotations

import torch

from .. import formats as F
from .gemm import mm_fp4
from .quantize import mxfp4_quantize, nvfp4_quantize

INTERMEDIATE_DTYPE = torch.bfloat16
DEEPSEEK_EPS = 1e-20


def topk_stable(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k along the last dim, largest first; ties go to the lower index (deterministic)."""
    vals, idx = torch.sort(x, dim=-1, descending=True, stable=True)
    return vals[..., :k], idx[..., :k]


def _deepseek_v3(logits: torch.Tensor, top_k: int, bias: torch.Tensor, n_group: int | None,
                 topk_group: int | None, scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    scores = torch.sigmoid(logits)
    biased = scores + bias.float()
    if n_group is not None and n_group > 1:
        t, e = biased.shape
        grouped = biased.view(t, n_group, e // n_group)
        group_score = topk_stable(grouped, min(2, e // n_group))[0].sum(-1)
        keep = torch.zeros(t, n_group, dtype=torch.bool, device=logits.device)
        keep.scatter_(1, topk_stable(group_score, topk_group)[1], True)
        biased = biased.masked_fill(~keep.repeat_interleave(e // n_group, dim=1), float("-inf"))
    ids = topk_stable(biased, top_k)[1]
    w = scores.gather(1, ids)
    w = w / (w.sum(-1, keepdim=True) + DEEPSEEK_EPS) * scaling
    return ids, w


def route(logits: torch.Tensor, top_k: int, method: str, renormalize: bool,
          bias: torch.Tensor | None, n_group: int | None, topk_group: int | None,
          routed_scaling_factor: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits [T, E] -> (topk_ids int32 [T, k], topk_weights fp32 [T, k])."""
    lf = logits.float()
    if method == "softmax":
        w, ids = topk_stable(torch.softmax(lf, dim=-1), top_k)
        if renormalize:
            w = w / w.sum(-1, keepdim=True)
    elif method == "renormalize":
        vals, ids = topk_stable(lf, top_k)
        w = torch.softmax(vals, dim=-1)
    elif method == "deepseek_v3":
        ids, w = _deepseek_v3(lf, top_k, bias, n_group, topk_group, routed_scaling_factor)
    elif method == "llama4":
        vals, ids = topk_stable(lf, top_k)
        w = torch.sigmoid(vals)
    else:
        raise ValueError(f"method: unknown routing method {method!r}")
    return ids.to(torch.int32), w.float().contiguous()


def silu_mul(h: torch.Tensor) -> torch.Tensor:
    """[gate; up] halves of h -> RN_bf16(silu(gate) * up), silu(z) = z / (1 + exp(-z)) in fp32."""
    inter = h.shape[-1] // 2
    gate, up = h[..., :inter].float(), h[..., inter:].float()
    return (gate / (1.0 + torch.exp(-gate)) * up).to(INTERMEDIATE_DTYPE)


def clamped_swiglu(h: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    """gpt-oss's activation of the [gate; up] halves of h, in fp32 then RN_bf16:
    g = min(gate, limit), u = clamp(up, -limit, limit), RN_bf16((u + 1) * (g * sigmoid(alpha * g))),
    sigmoid(z) = 1 / (1 + exp(-z)); each fp32 operation rounded, in this order."""
    inter = h.shape[-1] // 2
    gate, up = h[..., :inter].float(), h[..., inter:].float()
    g = torch.clamp(gate, max=limit)
    u = torch.clamp(up, min=-limit, max=limit)
    glu = g * (1.0 / (1.0 + torch.exp(-(alpha * g))))
    return ((u + 1.0) * glu).to(INTERMEDIATE_DTYPE)


def _gemm(a, a_scale, w, w_scale, alpha, fmt: F.Fp4Format, bias: torch.Tensor | None) -> torch.Tensor:
    """One expert GEMM: RN_bf16(RN_fp32(alpha * acc)), or with a bias row
    RN_bf16(RN_fp32(RN_fp32(alpha * acc) + bias)) (spec section 6)."""
    lay = F.SfLayout.LAYOUT_128x4
    if bias is None:
        return mm_fp4(a, w.T, a_scale, w_scale.T, alpha, INTERMEDIATE_DTYPE, fmt, lay)
    acc = mm_fp4(a, w.T, a_scale, w_scale.T, alpha, torch.float32, fmt, lay)
    return (acc + bias.float()).to(INTERMEDIATE_DTYPE)


def _select(gs: torch.Tensor, e: int) -> torch.Tensor:
    return gs[:1] if gs.numel() == 1 else gs[e:e + 1]


def fused_moe(x: torch.Tensor, w1: torch.Tensor, w1_scale: torch.Tensor, w1_global_scale: torch.Tensor,
              w2: torch.Tensor, w2_scale: torch.Tensor, w2_global_scale: torch.Tensor,
              topk_ids: torch.Tensor, topk_weights: torch.Tensor,
              a1_global_scale: torch.Tensor | None, a2_global_scale: torch.Tensor | None,
              local_expert_offset: int, out_dtype: torch.dtype, strict_ids: bool = False,
              fmt: F.Fp4Format = F.NVFP4, w1_bias: torch.Tensor | None = None,
              w2_bias: torch.Tensor | None = None, activation: str = "swiglu", swiglu_alpha: float = 1.702,
              swiglu_limit: float = 7.0, w4a4: bool = False,
              weight_layout: F.WeightLayout = F.WeightLayout.ROW) -> torch.Tensor:
    """Every local expert runs densely over all tokens (simple, no host sync, capturable); each
    (t, j) then picks the output of its expert, or zero when that expert is not local.
    strict_ids (no expert parallelism): a token with an id outside [offset, offset + E) gets NaN
    in every column instead. MXFP4 experts (fmt) have no global scales (alphas 1). W4A4 (given
    a1_global_scale, or w4a4): x and the intermediate quantized in the experts' format, NVFP4
    with a1 / a2, MXFP4 without global scales. w1 and w2 hold their experts in weight_layout."""
    w1, w2 = F.from_weight_layout(w1, weight_layout), F.from_weight_layout(w2, weight_layout)
    tokens, hidden = x.shape
    lay = F.SfLayout.LAYOUT_128x4
    picked = torch.zeros(tokens, topk_ids.shape[1], hidden, dtype=torch.float32, device=x.device)
    w4a4 = w4a4 or a1_global_scale is not None

    def quantized(v, gs):   # W4A4's activation quantization
        return nvfp4_quantize(v, gs, lay) if fmt is F.NVFP4 else mxfp4_quantize(v, lay)
    if w4a4:
        xq, xs = quantized(x, a1_global_scale)

    def alpha(a_gs, w_gs, e):
        return None if w_gs is None else F.nvfp4_alpha(a_gs, w_gs[e:e + 1])
    for e in range(w1.shape[0]):
        b1 = None if w1_bias is None else w1_bias[e]
        b2 = None if w2_bias is None else w2_bias[e]
        if not w4a4:
            h = _gemm(x, None, w1[e], w1_scale[e], alpha(None, w1_global_scale, e), fmt, b1)
        else:
            h = _gemm(xq, xs, w1[e], w1_scale[e], alpha(a1_global_scale, w1_global_scale, e), fmt, b1)
        act = silu_mul(h) if activation == "swiglu" else clamped_swiglu(h, swiglu_alpha, swiglu_limit)
        if not w4a4:
            y = _gemm(act, None, w2[e], w2_scale[e], alpha(None, w2_global_scale, e), fmt, b2)
        else:
            gs2 = None if a2_global_scale is None else _select(a2_global_scale, e)
            aq, as_ = quantized(act, gs2)
            y = _gemm(aq, as_, w2[e], w2_scale[e], alpha(gs2, w2_global_scale, e), fmt, b2)
        hit = (topk_ids == local_expert_offset + e).unsqueeze(-1)
        picked = torch.where(hit, y.float().unsqueeze(1), picked)
    out = torch.zeros(tokens, hidden, dtype=torch.float32, device=x.device)
    for j in range(topk_ids.shape[1]):
        out = out + topk_weights[:, j:j + 1].float() * picked[:, j]
    if strict_ids:
        experts = w1.shape[0]
        stray = ((topk_ids < local_expert_offset) | (topk_ids >= local_expert_offset + experts)).any(dim=1)
        out = torch.where(stray[:, None], torch.full_like(out, float("nan")), out)
    return out.to(out_dtype)
