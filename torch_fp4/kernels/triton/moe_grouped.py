"""A fused MoE (spec section 6) around a backend's grouped GEMM: the launches every grouped-GEMM
backend shares (the cuda backend's Hopper GEMM, kernels/cuda/moe.py; the CuTe DSL Blackwell GEMM,
kernels/cute/moe_fused.py). A backend gives a `GroupedGemm`: its GEMM over rows grouped by
expert, the rows per block it needs, and how it takes quantized activations.

Launches, all on the current stream, none reading anything back (CUDA-graph safe by
construction: every buffer is sized from upper bounds of the shapes):
1. moe_align.align(topk_ids, E, offset, block_m): pairs grouped by local expert, each expert
   padded to whole blocks of block_m rows; block_expert[b] (-1 past the used rows).
2. A = x[sorted_pairs // k]: x's rows in sorted order (torch index_select). Padding rows'
   sorted_pairs entries are 0 (align's zero_padding), so those rows hold token 0's row, are never
   read back, and stay confined to their own rows (every GEMM and quantization here is row-wise).
3. W4A4: A quantized with a1_global_scale (the backend's quantize, in its scale layout): the
   rows of nvfp4_quantize(x) in sorted order, i.e. the reference's x~ (quantization is row-wise).
   With `GroupedGemm.exact`, steps 2 and 3 are one launch writing the exact values of those rows
   without the global scale (NVFP4, or MXFP4 for MXFP4 activations).
4. FC1 = gemm(A, w1, alpha1, swiglu=True): bf16 [rows, I] = RN_bf16(silu(gate) * up) from
   h = RN_bf16(alpha1[e] * acc), alpha1 = formats.nvfp4_alpha(a1_gs or None, w1_gs) [E] formed
   on the device.
5. W4A4: the intermediate quantized with a2_global_scale: a [1] scale quantizes [rows, I] in one
   go; a per-expert [E] scale quantizes per block, [rows, I] viewed as [blocks, block_m, I] (one
   global scale per batch entry: a2[max(block_expert, 0)]). With `GroupedGemm.exact`, steps 4
   and 5 are FC1's plain GEMM then `silu_mul` writing the exact values of the intermediate's
   quantization (a2 of the row's expert) in the SwiGLU's launch.
6. FC2 = gemm(A2, w2, alpha2, swiglu=False): bf16 [rows, H] in sorted order.
7. _inverse_kernel: inv[sorted_pairs[r]] = r for every row r holding a pair (r < expert_end of its
   block's expert); pairs routed to no local expert keep an undefined entry that nothing reads.
8. moe_fused.finalize through inv: out[t] = RN_out(sum_j topk_weights[t, j] * y[inv[t k + j]])
   in fp32, j in order, starting from 0, pairs routed to no local expert adding w * 0 (no
   atomics, deterministic).

gpt-oss's features (`gpt_oss`): MXFP4 experts (the GEMM's MXFP4 variant, alphas 1); FC1's
bias or the clamped SwiGLU: step 4 as the GEMM's plain output (fp32 RN(alpha1 * acc) when the bias
follows) then `silu_mul` (the bias added, gate and up rounded to bf16, the activation); FC2's bias:
step 6 in fp32, then `add_bias_rows` (RN_bf16(y + b2[e])), so the finalize reads bf16 rows as
always.

`silu_mul` is the SwiGLU of step 4 as a kernel of its own, for GEMMs that do not fuse it:
RN_bf16(silu(gate) * up) exactly as torch_fp4.reference.silu_mul; given the blocks' experts it
writes zeros for the rows of unused blocks (which the GEMM skips) without reading them, so the
intermediate is defined everywhere.

Under Triton's interpreter (TRITON_INTERPRET=1, CPU tensors) silu_mul's exact values take the
portable forms of moe_numerics (the interpreter's fp8 conversion does not round to nearest).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
import triton
import triton.language as tl

from ... import formats as F
from ... import meta
from .._common import MAX_GRID_Z, prepare_outputs, use_pdl
from .moe_align import align
from .moe_fused import finalize
from .moe_gemm import GptOss
from .moe_numerics import exact_values, interpreting, rn_bf16, swiglu_act

MAX_QUANTIZE_BATCH = MAX_GRID_Z   # grid z of the batched (per-block) quantize of the intermediate
_ROWS_PER_PROGRAM = 1024
_SWIGLU_ROWS, _SWIGLU_COLS = 8, 256


@dataclass(frozen=True)
class ActQuant:
    """W4A4's activation quantization: the format, and for NVFP4 the global scale ([1], or [E]
    for the intermediate: one per expert)."""
    fmt: F.Fp4Format
    global_scale: Optional[torch.Tensor] = None


@dataclass(frozen=True)
class GroupedGemm:
    """What a backend gives the shared MoE launches.

    gemm(a, a_scale, w, w_scale, alpha, block_expert, swiglu) -> bf16 [rows, n] (or [rows, n/2]
    with swiglu): a is [rows, k] 16-bit (a_scale None) or NVFP4 [rows, k/2] with its block scales
    in `sf_layout`; rows are blocks of `block_m` rows, block b multiplying expert block_expert[b]
    (-1: an unused block, whose rows may hold anything).
    quantize(x, gs, sf_layout) -> (data, scale): NVFP4 with a [1] or per-batch-entry global scale,
    or MXFP4 with gs None (W4A4 with MXFP4 activations, where the backend has no `exact`).
    exact(x, gs, fmt, src_pairs, top_k) -> bf16 [rows, k] (optional): row m holds the values of
    x[src_pairs[m] // top_k]'s quantization (fmt; NVFP4 with gs) dequantized without gs (exact in
    bf16), gathered and quantized in one launch. Given, W4A4 feeds gemm 16-bit activations
    (a_scale None; the global scales stay in the alphas): these for FC1, and silu_mul's exact
    values for FC2, instead of codes and scales.
    activation(h, block_expert, block_m, gpt_oss, exact) -> bf16 [rows, I] (optional): the
    backend's kernel for silu_mul's contract (below), used where FC1's GEMM does not fuse it.
    """
    gemm: Callable[..., torch.Tensor]
    block_m: int
    quantize: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    sf_layout: F.SfLayout = F.SfLayout.LAYOUT_128x4
    exact: Optional[Callable[..., torch.Tensor]] = None
    activation: Optional[Callable[..., torch.Tensor]] = None


@triton.jit(do_not_specialize=["n_rows"])
def _inverse_kernel(sorted_ptr, block_expert_ptr, end_ptr, inv_ptr, n_rows, BM: tl.constexpr,
                    BR: tl.constexpr, USE_GDC: tl.constexpr):
    """inv[sorted_pairs[r]] = r for the rows r that hold a pair (each pair has one such row)."""
    if USE_GDC:
        tl.extra.cuda.gdc_wait()
    r = tl.program_id(0) * BR + tl.arange(0, BR)
    in_range = r < n_rows
    e = tl.load(block_expert_ptr + r // BM, mask=in_range, other=-1)
    end = tl.load(end_ptr + tl.maximum(e, 0), mask=in_range, other=0)
    holds_pair = in_range & (e >= 0) & (r < end)
    pair = tl.load(sorted_ptr + r, mask=holds_pair, other=0)
    tl.store(inv_ptr + pair, r, mask=holds_pair)


@triton.jit(do_not_specialize=["rows", "inter"])
def _silu_mul_kernel(h_ptr, out_ptr, block_expert_ptr, b1_ptr, gs_ptr, gs_stride, rows, inter, sw_alpha, sw_limit,
                     BM: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr, GROUPED: tl.constexpr,
                     PORTABLE: tl.constexpr, USE_GDC: tl.constexpr, H_F32: tl.constexpr, BIAS: tl.constexpr,
                     CLAMPED: tl.constexpr, EXACT: tl.constexpr):
    """out[r, c] = act(h[r, c], h[r, inter + c]) for BR rows x BC columns (moe_numerics.swiglu_act:
    silu(gate) * up, or CLAMPED gpt-oss's); GROUPED: rows of unused blocks (block_expert[r // BM]
    < 0, which the GEMM did not write) are zeros, read from nowhere. H_F32: h holds FC1's fp32
    RN(alpha1 * acc), rounded here to bf16 after adding (BIAS) b1[e] of the row's expert.
    EXACT 16 / 32: out holds the exact values of act's NVFP4 (global scale gs[e * gs_stride] of the
    row's expert) / MXFP4 quantization without the global scale (W4A4's FC2 activations)."""
    if USE_GDC:
        tl.extra.cuda.gdc_wait()
    r = (tl.program_id(0) * BR + tl.arange(0, BR)).to(tl.int64)
    c = tl.program_id(1) * BC + tl.arange(0, BC)
    in_rows = r < rows
    used = in_rows
    e = tl.zeros([BR], tl.int64)
    if GROUPED:
        e = tl.load(block_expert_ptr + r // BM, mask=in_rows, other=-1).to(tl.int64)
        used = in_rows & (e >= 0)
    ok = used[:, None] & (c < inter)[None, :]
    src = h_ptr + r[:, None] * (2 * inter) + c[None, :]
    gate = tl.load(src, mask=ok, other=0.0).to(tl.float32)
    up = tl.load(src + inter, mask=ok, other=0.0).to(tl.float32)
    if BIAS:   # RN_bf16(RN_fp32(alpha1 * acc) + b1[e]) (spec section 6)
        b = b1_ptr + tl.maximum(e, 0)[:, None] * (2 * inter) + c[None, :]
        gate = gate + tl.load(b, mask=ok, other=0.0).to(tl.float32)
        up = up + tl.load(b + inter, mask=ok, other=0.0).to(tl.float32)
    if H_F32:
        gate = rn_bf16(gate, PORTABLE)
        up = rn_bf16(up, PORTABLE)
    act = swiglu_act(gate, up, sw_alpha, sw_limit, CLAMPED, PORTABLE)
    act = tl.where(ok, act, 0.0)
    if EXACT != 0:
        gs = tl.load(gs_ptr + tl.maximum(e, 0) * gs_stride)[:, None] if EXACT == 16 else 1.0
        act = exact_values(act, gs, EXACT, PORTABLE)
    tl.store(out_ptr + r[:, None] * inter + c[None, :], act.to(tl.bfloat16),
             mask=in_rows[:, None] & (c < inter)[None, :])


def silu_mul(h: torch.Tensor, block_expert: Optional[torch.Tensor] = None, block_m: int = 1,
             gpt_oss: Optional[GptOss] = None, exact: Optional[ActQuant] = None) -> torch.Tensor:
    """bf16 [rows, 2I] holding [gate, up] -> bf16 [rows, I] = RN_bf16(silu(gate) * up). With
    block_expert (rows in blocks of block_m, as a GroupedGemm's), the rows of unused blocks
    (expert -1, never written by the GEMM) come out as zeros without being read. gpt_oss (with
    block_expert): its clamped SwiGLU; h fp32 (FC1's RN(alpha1 * acc)) rounded to bf16 after its
    w1_bias. exact (with block_expert): the result's exact quantized values instead (ActQuant;
    a [E] global scale by the row's expert)."""
    rows, inter = h.shape[0], h.shape[1] // 2
    out = torch.empty((rows, inter), dtype=torch.bfloat16, device=h.device)
    if rows == 0 or inter == 0:
        return out
    go = gpt_oss or GptOss()
    bias = go.w1_bias is not None
    if bias and (block_expert is None or h.dtype != torch.float32):
        raise RuntimeError("torch_fp4 internal: FC1's bias needs fp32 GEMM results grouped by expert")
    pdl = use_pdl(h.device) if h.is_cuda else False
    grouped = block_expert is not None
    if exact is not None and not grouped:
        raise RuntimeError("torch_fp4 internal: silu_mul's exact values need the blocks' experts")
    gs = None if exact is None else exact.global_scale   # NVFP4: [1] or [E]; MXFP4: None
    _silu_mul_kernel[(triton.cdiv(rows, _SWIGLU_ROWS), triton.cdiv(inter, _SWIGLU_COLS))](
        h, out, block_expert if grouped else h, go.w1_bias if bias else h, h if gs is None else gs,
        0 if gs is None or gs.numel() == 1 else gs.stride(0),
        rows, inter, go.swiglu_alpha, go.swiglu_limit, BM=block_m, BR=_SWIGLU_ROWS, BC=_SWIGLU_COLS, GROUPED=grouped,
        PORTABLE=interpreting(), USE_GDC=pdl, H_F32=h.dtype == torch.float32, BIAS=bias, CLAMPED=go.clamped,
        EXACT=0 if exact is None else exact.fmt.block_size, launch_pdl=pdl, num_warps=4, enable_fp_fusion=False)
    return out


@triton.jit(do_not_specialize=["rows", "n"])
def _bias_rows_kernel(y_ptr, b_ptr, block_expert_ptr, out_ptr, rows, n, BM: tl.constexpr, BR: tl.constexpr,
                      BC: tl.constexpr, PORTABLE: tl.constexpr, USE_GDC: tl.constexpr):
    """out[r, c] = RN_bf16(y[r, c] + b[e, c]) with e = block_expert[r // BM] (fp32 y: FC2's
    RN(alpha2 * acc)); rows of unused blocks are zeros, read from nowhere."""
    if USE_GDC:
        tl.extra.cuda.gdc_wait()
    r = (tl.program_id(0) * BR + tl.arange(0, BR)).to(tl.int64)
    c = tl.program_id(1) * BC + tl.arange(0, BC)
    in_rows = r < rows
    e = tl.load(block_expert_ptr + r // BM, mask=in_rows, other=-1).to(tl.int64)
    ok = (in_rows & (e >= 0))[:, None] & (c < n)[None, :]
    y = tl.load(y_ptr + r[:, None] * n + c[None, :], mask=ok, other=0.0)
    y = y + tl.load(b_ptr + tl.maximum(e, 0)[:, None] * n + c[None, :], mask=ok, other=0.0).to(tl.float32)
    y = tl.where(ok, rn_bf16(y, PORTABLE), 0.0)
    tl.store(out_ptr + r[:, None] * n + c[None, :], y.to(tl.bfloat16), mask=in_rows[:, None] & (c < n)[None, :])


def add_bias_rows(y: torch.Tensor, bias: torch.Tensor, block_expert: torch.Tensor, block_m: int) -> torch.Tensor:
    """fp32 [rows, n] grouped by expert in blocks of block_m -> bf16 RN_bf16(y + bias[e]) (FC2's y
    with its bias, spec section 6); rows of unused blocks zeros."""
    rows, n = y.shape
    out = torch.empty((rows, n), dtype=torch.bfloat16, device=y.device)
    if rows == 0 or n == 0:
        return out
    pdl = use_pdl(y.device) if y.is_cuda else False
    _bias_rows_kernel[(triton.cdiv(rows, _SWIGLU_ROWS), triton.cdiv(n, _SWIGLU_COLS))](
        y, bias, block_expert, out, rows, n, BM=block_m, BR=_SWIGLU_ROWS, BC=_SWIGLU_COLS, PORTABLE=interpreting(),
        USE_GDC=pdl, launch_pdl=pdl, num_warps=4, enable_fp_fusion=False)
    return out


def quantize_intermediate(h: torch.Tensor, a2_gs: torch.Tensor, block_expert: torch.Tensor,
                           g: GroupedGemm):
    """NVFP4 codes and scales of FC1's output [rows, I] with a2 [1] (one launch) or a2 [E] (per
    block of rows); MXFP4 (a2 None: MXFP4 activations) in one launch."""
    if a2_gs is None or a2_gs.numel() == 1:
        return g.quantize(h, a2_gs, g.sf_layout)
    rows, inter = h.shape
    per_block = a2_gs.index_select(0, block_expert.clamp(min=0))
    data, scale = g.quantize(h.view(rows // g.block_m, g.block_m, inter), per_block, g.sf_layout)
    return data.reshape(rows, inter // 2), scale.reshape(rows, scale.shape[-1])


def fused_moe(x: torch.Tensor, w1: torch.Tensor, w1_scale: torch.Tensor, w1_global_scale: torch.Tensor,
              w2: torch.Tensor, w2_scale: torch.Tensor, w2_global_scale: torch.Tensor,
              topk_ids: torch.Tensor, topk_weights: torch.Tensor,
              a1_global_scale: Optional[torch.Tensor], a2_global_scale: Optional[torch.Tensor],
              local_expert_offset: int, out_dtype: torch.dtype, strict_ids: bool,
              g: GroupedGemm, gpt_oss: Optional[GptOss] = None,
              act_fmt: Optional[F.Fp4Format] = None) -> torch.Tensor:
    """torch_fp4.reference.fused_moe's signature plus the backend's grouped GEMM `g`: launches
    only, nothing read back. gpt_oss: MXFP4 experts (gemm(..., mx=True), alphas 1), FC1 and FC2
    biases (the GEMM's fp32 results, gemm(..., out_dtype=torch.float32), then silu_mul /
    add_bias_rows add them and round), the clamped SwiGLU (silu_mul). act_fmt: W4A4's
    activation format (default NVFP4 when a1_global_scale is given, else W4A16); MXFP4 goes
    through `g.exact` when the backend has it, else through g.quantize (gs None)."""
    go = gpt_oss or GptOss()
    out = prepare_outputs(meta.fused_moe(x, out_dtype))
    tokens = x.shape[0]
    experts = w1.shape[0]
    top_k = topk_ids.shape[1]
    if tokens == 0 or top_k == 0:
        return out.zero_() if tokens else out
    ids, tw = topk_ids.contiguous(), topk_weights.contiguous()
    pairs = ids.numel()
    blocks = align(ids, experts, local_expert_offset, g.block_m, zero_padding=True)
    act_fmt = act_fmt or (F.NVFP4 if a1_global_scale is not None else None)
    exact = act_fmt is not None and g.exact is not None
    # A: x's rows in sorted order (padding rows: token 0's row, never read back); W4A4 with
    # `exact`: their exact quantized values, gathered in the same launch
    a_sf = None
    if exact:
        a = g.exact(x, a1_global_scale, act_fmt, blocks.sorted_pairs, top_k)
    else:
        a = x.index_select(0, blocks.sorted_pairs // top_k)
        if act_fmt is not None:
            a, a_sf = g.quantize(a, a1_global_scale, g.sf_layout)
    mx = {"mx": True} if go.mx else {}
    ones = torch.ones(experts, dtype=torch.float32, device=x.device) if go.mx else None
    alpha1 = ones if go.mx else F.nvfp4_alpha(a1_global_scale, w1_global_scale)
    h_exact = ActQuant(act_fmt, a2_global_scale) if exact else None
    if go.w1_bias is None and not go.clamped and h_exact is None:
        h = g.gemm(a, a_sf, w1, w1_scale, alpha1, blocks.block_expert, True, **mx)
    else:
        f32 = {"out_dtype": torch.float32} if go.w1_bias is not None else {}
        h = (g.activation or silu_mul)(g.gemm(a, a_sf, w1, w1_scale, alpha1, blocks.block_expert, False, **mx, **f32),
                                       blocks.block_expert, g.block_m, go, h_exact)
    h_sf = None
    if act_fmt is not None and not exact:
        h, h_sf = quantize_intermediate(h, a2_global_scale, blocks.block_expert, g)
    alpha2 = ones if go.mx else F.nvfp4_alpha(a2_global_scale, w2_global_scale)
    if go.w2_bias is None:
        y = g.gemm(h, h_sf, w2, w2_scale, alpha2, blocks.block_expert, False, **mx)
    else:
        y = add_bias_rows(g.gemm(h, h_sf, w2, w2_scale, alpha2, blocks.block_expert, False, **mx,
                                 out_dtype=torch.float32), go.w2_bias, blocks.block_expert, g.block_m)
    inv = torch.empty(pairs, dtype=torch.int32, device=x.device)
    pdl = use_pdl(x.device) if x.is_cuda else False
    _inverse_kernel[(triton.cdiv(blocks.rows, _ROWS_PER_PROGRAM),)](
        blocks.sorted_pairs, blocks.block_expert, blocks.expert_end, inv, blocks.rows,
        BM=g.block_m, BR=_ROWS_PER_PROGRAM, USE_GDC=pdl, launch_pdl=pdl, num_warps=4)
    finalize(y, ids, tw, out, experts, local_expert_offset, interpreting(), inv=inv, strict=strict_ids)
    return out
