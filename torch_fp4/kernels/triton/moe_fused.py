"""Triton fused MoE (spec section 6): the launcher with torch_fp4.reference.fused_moe's signature,
and the finalize kernel that adds each token's top-k expert outputs.

Launches, all on the current stream, none reading anything back (CUDA-graph safe):
W4A4: nvfp4_quantize(x, a1_global_scale) (the Triton quantize kernel, once per token); align
(moe_align.py); FC1 + SwiGLU (+ NVFP4 quantization of the intermediate in W4A4; moe_gemm.py);
FC2; finalize. Finalize: out[t] = RN_out(sum_j topk_weights[t, j] * y[t k + j]) in fp32, j in
order, starting from 0 exactly as the reference, pairs routed to no local expert adding
w * 0; with split-K FC2 it first adds the split partials in order and forms
y = RN_bf16(alpha2[e] * sum). No atomics: the same inputs give the same bits on every run.

Under Triton's interpreter (TRITON_INTERPRET=1, CPU tensors) the kernels use their portable
forms (moe_numerics.py) and x is quantized by the reference (the interpreter's fp8 conversion
does not round to nearest), so the whole launcher is checked on a CPU.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from ... import formats as F
from ... import meta
from .._common import prepare_outputs, sm_count, use_pdl
from .moe_align import align
from .moe_gemm import MoeConfig, default_config, fc1, fc2
from .moe_numerics import interpreting, rn_bf16
from .numerics import rcp_rn

_TL = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


@triton.jit(do_not_specialize=["top_k", "P", "lo"])
def _finalize_kernel(y_ptr, inv_ptr, ids_ptr, tw_ptr, gsw_ptr, gsa_ptr, out_ptr, top_k, H, P, lo,
                     E, gsa_stride, SPLIT: tl.constexpr, A_FP4: tl.constexpr,
                     INDIRECT: tl.constexpr, OUT: tl.constexpr, BH: tl.constexpr,
                     PORTABLE: tl.constexpr, USE_GDC: tl.constexpr):
    """out[t] = RN_out(sum_j w[t, j] * y[row of pair t k + j]) in fp32, j in order, from 0. The
    row is the pair itself, or inv[pair] when INDIRECT (y in the grouping's sorted order); with
    SPLIT > 1, y holds unscaled fp32 partial sums that are added, scaled and rounded here."""
    if USE_GDC:
        tl.extra.cuda.gdc_wait()
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BH + tl.arange(0, BH)
    col_ok = cols < H
    acc = tl.zeros([BH], tl.float32)
    for j in range(top_k):
        pair = t * top_k + j
        eid = tl.load(ids_ptr + pair)
        w = tl.load(tw_ptr + pair)
        local = (eid >= lo) & (eid < lo + E)
        ev = eid + tl.zeros([BH], tl.int32)   # a vector (the interpreter mishandles scalar & vector)
        m = col_ok & (ev >= lo) & (ev < lo + E)
        if SPLIT > 1:
            s = tl.load(y_ptr + pair * H + cols, mask=m, other=0.0)
            for sp in tl.static_range(1, SPLIT):
                s += tl.load(y_ptr + (sp * P + pair) * H + cols, mask=m, other=0.0)
            e = tl.where(local, eid - lo, 0)
            gsw = tl.load(gsw_ptr + e)
            if A_FP4:
                alpha = rcp_rn(tl.load(gsa_ptr + e * gsa_stride) * gsw)
            else:
                alpha = rcp_rn(gsw)
            y = tl.where(m, rn_bf16(s * alpha, PORTABLE), 0.0)
        else:
            if INDIRECT:
                row = tl.where(local, tl.load(inv_ptr + pair), 0).to(tl.int64)
            else:
                row = pair
            y = tl.load(y_ptr + row * H + cols, mask=m, other=0.0).to(tl.float32)
        acc = acc + w * y
    if PORTABLE and OUT == tl.bfloat16:
        acc = rn_bf16(acc, PORTABLE)
    tl.store(out_ptr + t * H + cols, acc.to(OUT), mask=col_ok)


def _quantize_x(x: torch.Tensor, gs: torch.Tensor, portable: bool):
    if portable:
        from ...reference.quantize import nvfp4_quantize
    else:
        from .quantize import nvfp4_quantize
    return nvfp4_quantize(x, gs, F.SfLayout.LAYOUT_128x4)


def fused_moe(x: torch.Tensor, w1: torch.Tensor, w1_scale: torch.Tensor, w1_global_scale: torch.Tensor,
              w2: torch.Tensor, w2_scale: torch.Tensor, w2_global_scale: torch.Tensor,
              topk_ids: torch.Tensor, topk_weights: torch.Tensor,
              a1_global_scale: torch.Tensor | None, a2_global_scale: torch.Tensor | None,
              local_expert_offset: int, out_dtype: torch.dtype,
              config: MoeConfig | None = None) -> torch.Tensor:
    """Launcher with torch_fp4.reference.fused_moe's signature; `config` overrides the tiles."""
    out = prepare_outputs(meta.fused_moe(x, out_dtype))
    tokens, hidden = x.shape
    experts, two_i = w1.shape[0], w1.shape[1]
    top_k = topk_ids.shape[1]
    if tokens == 0 or top_k == 0:
        return out.zero_() if tokens else out
    portable = interpreting()
    if config is None:
        sms = sm_count(x.device) if x.is_cuda else 132
        config = default_config(tokens, top_k, experts, hidden, two_i // 2, sms)
    ids, tw = topk_ids.contiguous(), topk_weights.contiguous()
    pairs = ids.numel()
    blocks = align(ids, experts, local_expert_offset, config.block_m)
    w4a4 = a1_global_scale is not None
    if w4a4:
        xq, xs = _quantize_x(x, a1_global_scale, portable)
        inter = fc1(xq, xs, w1, w1_scale, w1_global_scale, a1_global_scale, a2_global_scale,
                    blocks, top_k, config, portable)
    else:
        inter = fc1(x, None, w1, w1_scale, w1_global_scale, None, None, blocks, top_k, config,
                    portable)
    y = fc2(inter, w2, w2_scale, w2_global_scale, a2_global_scale, blocks, pairs, config, portable)
    finalize(y, ids, tw, out, experts, local_expert_offset, portable, config.fc2_split,
             w2_global_scale, a2_global_scale if w4a4 else None)
    return out


def finalize(y: torch.Tensor, ids: torch.Tensor, tw: torch.Tensor, out: torch.Tensor, experts: int,
             local_expert_offset: int, portable: bool, split: int = 1,
             w2_global_scale: Optional[torch.Tensor] = None,
             a2_global_scale: Optional[torch.Tensor] = None,
             inv: Optional[torch.Tensor] = None) -> None:
    """The top-k sum into out [T, H]: y rows per pair (or per sorted row through `inv`); with
    split > 1, y holds `split` unscaled fp32 partial sums per pair and alpha2 comes from the
    global scales."""
    tokens, hidden = out.shape
    top_k, pairs = ids.shape[1], ids.numel()
    w4a4 = a2_global_scale is not None
    gsw = w2_global_scale if w2_global_scale is not None else tw
    bh = min(1024, triton.next_power_of_2(hidden))
    pdl = use_pdl(out.device)
    _finalize_kernel[(tokens, triton.cdiv(hidden, bh))](
        y, inv if inv is not None else ids, ids, tw, gsw, a2_global_scale if w4a4 else gsw, out,
        top_k, hidden, pairs, local_expert_offset, experts,
        1 if (w4a4 and a2_global_scale.numel() > 1) else 0,
        SPLIT=split, A_FP4=w4a4, INDIRECT=inv is not None, OUT=_TL[out.dtype], BH=bh,
        PORTABLE=portable, USE_GDC=pdl, launch_pdl=pdl, num_warps=4, enable_fp_fusion=False)
