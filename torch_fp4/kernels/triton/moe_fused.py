"""Triton fused MoE (spec section 6): the launcher with torch_fp4.reference.fused_moe's signature,
and the finalize as a kernel of its own (large batches, and the cute-dsl path).

Launches, all on the current stream, none reading anything back (CUDA-graph safe):
W4A4: nvfp4_quantize(x, a1_global_scale) (the Triton quantize kernel, once per token); align
(moe_align.py; it also zeroes FC2's arrival counters); FC1 + SwiGLU (+ NVFP4 quantization of the
intermediate in W4A4; moe_gemm.py); FC2 and the finalize
out[t] = RN_out(sum_j topk_weights[t, j] * y[t k + j]) in fp32, j in order, starting from 0
exactly as the reference, pairs routed to no local expert adding w * 0 (moe_numerics.topk_sum;
with split-K FC2 the split partials are added in order first and y = RN_bf16(alpha2[e] * sum)).
Decode-size batches run the finalize in FC2's epilogue (the program that completes a token's
column tile last does the sum; MoeConfig.fused_finalize), larger ones as the kernel below. Either
way the sum is in slot order, so the same inputs give the same bits on every run (atomics only
count arrivals).

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
from .moe_gemm import GptOss, MoeConfig, default_config, fc1, fc2, fc2_counters
from .moe_numerics import interpreting, rn_bf16, topk_sum

_TL = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


@triton.jit(do_not_specialize=["top_k", "P", "lo"])
def _finalize_kernel(y_ptr, inv_ptr, ids_ptr, tw_ptr, gsw_ptr, gsa_ptr, b2_ptr, out_ptr, top_k, H, P, lo,
                     E, gsa_stride, KP: tl.constexpr, SPLIT: tl.constexpr, A_FP4: tl.constexpr,
                     INDIRECT: tl.constexpr, OUT: tl.constexpr, BT: tl.constexpr,
                     BH: tl.constexpr, PORTABLE: tl.constexpr, STRICT: tl.constexpr,
                     USE_GDC: tl.constexpr, MX: tl.constexpr, BIAS: tl.constexpr):
    """out[t] = RN_out(topk_sum) for BT tokens x BH columns per program."""
    if USE_GDC:
        tl.extra.cuda.gdc_wait()
    t = tl.program_id(0).to(tl.int64) * BT + tl.arange(0, BT)
    cols = tl.program_id(1) * BH + tl.arange(0, BH)
    col_ok = cols < H
    t_ok = t < P // top_k
    acc = topk_sum(y_ptr, inv_ptr, ids_ptr, tw_ptr, gsw_ptr, gsa_ptr, gsa_stride, b2_ptr, t, t_ok, cols,
                   col_ok, top_k, H, P, lo, E, KP, SPLIT, A_FP4, INDIRECT, PORTABLE, STRICT, MX, BIAS)
    if PORTABLE and OUT == tl.bfloat16:
        acc = rn_bf16(acc, PORTABLE)
    tl.store(out_ptr + t[:, None] * H + cols[None, :], acc.to(OUT),
             mask=t_ok[:, None] & col_ok[None, :])


def _quantize_x(x: torch.Tensor, gs: torch.Tensor, portable: bool):
    if portable:
        from ...reference.quantize import nvfp4_quantize
    else:
        from .quantize import nvfp4_quantize
    return nvfp4_quantize(x, gs, F.SfLayout.LAYOUT_128x4)


def _mx_values(v: torch.Tensor, portable: bool) -> torch.Tensor:
    """v's MXFP4 values (spec section 3, blocks of 32 along each row) as bf16, which holds every
    MXFP4 value exactly: W4A4 with MXFP4 activations is W4A16 on these."""
    if portable:
        from ...reference.quantize import fp4_dequantize, mxfp4_quantize
    else:
        from .quantize import fp4_dequantize, mxfp4_quantize
    q, s = mxfp4_quantize(v, F.SfLayout.LINEAR)
    return fp4_dequantize(q, s, None, F.MXFP4, F.SfLayout.LINEAR, torch.bfloat16)


def fused_moe(x: torch.Tensor, w1: torch.Tensor, w1_scale: torch.Tensor, w1_global_scale: torch.Tensor,
              w2: torch.Tensor, w2_scale: torch.Tensor, w2_global_scale: torch.Tensor,
              topk_ids: torch.Tensor, topk_weights: torch.Tensor,
              a1_global_scale: torch.Tensor | None, a2_global_scale: torch.Tensor | None,
              local_expert_offset: int, out_dtype: torch.dtype, strict_ids: bool = False,
              fmt: F.Fp4Format = F.NVFP4, w1_bias: torch.Tensor | None = None,
              w2_bias: torch.Tensor | None = None, activation: str = "swiglu", swiglu_alpha: float = 1.702,
              swiglu_limit: float = 7.0, w4a4: bool = False, config: MoeConfig | None = None, tactic=None,
              problem=None) -> torch.Tensor:
    """Launcher with torch_fp4.reference.fused_moe's signature; the tiles: `tactic`
    (moe_tactics.TritonMoeTactic, from the dispatch: the heuristic, the tactic cache or
    `use_tactic`), else `config`, else moe_gemm.default_config. gpt-oss's features (MXFP4 experts,
    biases, the clamped SwiGLU) go to the GEMMs as a GptOss, in W4A16, or with MXFP4 experts in W4A4
    (`w4a4`: MXFP4 activations, spec section 6) as W4A16 on the exact MXFP4 values of x and of
    the intermediate (one quantize and one dequantize launch each)."""
    mx_acts = w4a4 and fmt is F.MXFP4
    if w4a4 and not mx_acts and a1_global_scale is None:
        raise RuntimeError("torch_fp4 internal: the triton fused_moe kernels take NVFP4 or MXFP4 activations only")
    out = prepare_outputs(meta.fused_moe(x, out_dtype))
    tokens, hidden = x.shape
    experts, two_i = w1.shape[0], w1.shape[1]
    top_k = topk_ids.shape[1]
    if tokens == 0 or top_k == 0:
        return out.zero_() if tokens else out
    portable = interpreting()
    if tactic is not None:
        config = tactic.config()
    if config is None:
        sms = sm_count(x.device) if x.is_cuda else 132
        config = default_config(tokens, top_k, experts, hidden, two_i // 2, sms)
    ids, tw = topk_ids.contiguous(), topk_weights.contiguous()
    counters = None
    if config.fused_finalize:
        counters = torch.empty(fc2_counters(tokens, hidden, config), dtype=torch.int32,
                               device=x.device)
    blocks = align(ids, experts, local_expert_offset, config.block_m, zero=counters)
    gpt_oss = GptOss.of(fmt, w1_bias, w2_bias, activation, swiglu_alpha, swiglu_limit)
    w4a4 = a1_global_scale is not None
    if mx_acts:
        inter = fc1(_mx_values(x, portable), None, w1, w1_scale, w1_global_scale, None, None, blocks, top_k,
                    config, portable, gpt_oss)
        inter = _mx_values(inter, portable)
    elif w4a4:
        xq, xs = _quantize_x(x, a1_global_scale, portable)
        inter = fc1(xq, xs, w1, w1_scale, w1_global_scale, a1_global_scale, a2_global_scale,
                    blocks, top_k, config, portable)
    else:
        inter = fc1(x, None, w1, w1_scale, w1_global_scale, None, None, blocks, top_k, config,
                    portable, gpt_oss)
    y = fc2(inter, w2, w2_scale, w2_global_scale, a2_global_scale, blocks, ids, tw, out,
            local_expert_offset, config, portable, counters, strict_ids, gpt_oss)
    if not config.fused_finalize:
        finalize(y, ids, tw, out, experts, local_expert_offset, portable, config.fc2_split,
                 w2_global_scale, a2_global_scale if w4a4 else None, strict=strict_ids, gpt_oss=gpt_oss)
    return out


def finalize(y: torch.Tensor, ids: torch.Tensor, tw: torch.Tensor, out: torch.Tensor, experts: int,
             local_expert_offset: int, portable: bool, split: int = 1,
             w2_global_scale: Optional[torch.Tensor] = None,
             a2_global_scale: Optional[torch.Tensor] = None,
             inv: Optional[torch.Tensor] = None, strict: bool = False,
             gpt_oss: Optional[GptOss] = None) -> None:
    """The top-k sum into out [T, H] as a kernel of its own: y rows per pair (or per sorted row
    through `inv`); with split > 1, y holds `split` unscaled fp32 partial sums per pair and
    alpha2 comes from the global scales. `strict`: NaN rows for tokens with an id outside
    [local_expert_offset, local_expert_offset + experts). `gpt_oss`: MXFP4 experts (no alpha) and
    FC2's bias, added to the split partials' scaled sum before its rounding."""
    g = gpt_oss or GptOss()
    tokens, hidden = out.shape
    top_k, pairs = ids.shape[1], ids.numel()
    w4a4 = a2_global_scale is not None
    gsw = w2_global_scale if w2_global_scale is not None else tw
    bh = min(256, triton.next_power_of_2(hidden))
    bt = 4
    pdl = use_pdl(out.device)
    _finalize_kernel[(triton.cdiv(tokens, bt), triton.cdiv(hidden, bh))](
        y, inv if inv is not None else ids, ids, tw, gsw, a2_global_scale if w4a4 else gsw,
        tw if g.w2_bias is None else g.w2_bias, out,
        top_k, hidden, pairs, local_expert_offset, experts,
        1 if (w4a4 and a2_global_scale.numel() > 1) else 0, KP=triton.next_power_of_2(top_k),
        SPLIT=split, A_FP4=w4a4, INDIRECT=inv is not None, OUT=_TL[out.dtype], BT=bt, BH=bh,
        PORTABLE=portable, STRICT=strict, USE_GDC=pdl, launch_pdl=pdl, num_warps=4,
        enable_fp_fusion=False, MX=g.mx, BIAS=g.w2_bias is not None)
