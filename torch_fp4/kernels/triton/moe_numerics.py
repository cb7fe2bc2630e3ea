"""Device functions shared by the MoE kernels (routing, grouped GEMM, finalize).

Each function has a GPU form and, selected by the constexpr PORTABLE, an integer-arithmetic form
that Triton's CPU interpreter (TRITON_INTERPRET=1) runs exactly: the interpreter cannot run the
GEMM's inline-asm E2M1 decode, has no libdevice, and its fp32 -> bf16 / e4m3 conversions do not
round to nearest. Both forms give the same bits; the GPU kernels are compiled with PORTABLE=False,
so the portable code never reaches them.
"""
from __future__ import annotations

import os

import triton
import triton.language as tl
from triton.language.extra import libdevice

from .mm import _decode
from .numerics import (LAYOUT_128x4, e2m1_decode, e2m1_encode_doubled, mxfp4_block_scale, mxfp4_limit2,
                       nvfp4_block_scale, r6, rcp_rn, scale_offsets, ue8m0_to_float)


def interpreting() -> bool:
    """Whether Triton kernels run under the CPU interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def exp_f32(x, PORTABLE: tl.constexpr):
    """e^x in fp32 as PyTorch's CUDA kernels compute it (libdevice expf, max 2 ulp error; not
    Triton's tl.exp, which is ex2.approx of a rounded product)."""
    if PORTABLE:
        y = tl.exp(x)
    else:
        y = libdevice.exp(x)
    return y


@triton.jit
def rn_bf16(x, PORTABLE: tl.constexpr):
    """fp32 -> the nearest bf16 value (ties to even), returned as fp32."""
    if PORTABLE:
        bits = x.to(tl.int32, bitcast=True)
        r = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
        y = tl.where(x != x, x, r.to(tl.float32, bitcast=True))
    else:
        y = x.to(tl.bfloat16).to(tl.float32)
    return y


@triton.jit
def swiglu_act(gate, up, sw_alpha, sw_limit, CLAMPED: tl.constexpr, PORTABLE: tl.constexpr):
    """The activation of FC1's bf16 gate and up values (fp32 tensors holding bf16 values), rounded
    to bf16 (spec section 6): silu(gate) * up, or gpt-oss's clamped SwiGLU g = min(gate, L),
    u = clamp(up, -L, L), (u + 1) * (g * sigmoid(alpha g)); each fp32 operation rounded in this
    order (kernels compiled without FMA contraction)."""
    if CLAMPED:
        g = tl.where(gate > sw_limit, sw_limit, gate)
        u = tl.where(up > sw_limit, sw_limit, tl.where(up < -sw_limit, -sw_limit, up))
        sig = tl.div_rn(1.0, 1.0 + exp_f32(-(sw_alpha * g), PORTABLE))
        act = rn_bf16((u + 1.0) * (g * sig), PORTABLE)
    else:
        act = rn_bf16(tl.div_rn(gate, 1.0 + exp_f32(-gate, PORTABLE)) * up, PORTABLE)
    return act


@triton.jit
def e4m3_value(bits):
    """e4m3fn byte (int32) -> fp32, by integer arithmetic (exact)."""
    exp = (bits >> 3) & 15
    man = bits & 7
    normal = (((exp + 120) << 23) | (man << 20)).to(tl.float32, bitcast=True)
    val = tl.where(exp == 0, man.to(tl.float32) * 0.001953125, normal)
    val = tl.where((bits & 0x7F) == 0x7F, float("nan"), val)
    return tl.where((bits & 0x80) != 0, -val, val)


@triton.jit
def e4m3_rn_satfinite_portable(s):
    """s >= 0 (or NaN) -> (e4m3fn bits int32, their value fp32): round to nearest even, values
    above 448 saturate to 448, NaN -> 0x7F. The value is q * 2^(e-3) with e the exponent of s
    (at least -6, the subnormal range) and q = RN(s * 2^(3-e)) in [0, 16]; the bits
    ((e + 7) << 3) + q - 8 carry into the exponent when q = 16."""
    sc = tl.minimum(s, 448.0)
    e = tl.maximum((sc.to(tl.int32, bitcast=True) >> 23) - 127, -6)
    q = sc * ((130 - e) << 23).to(tl.float32, bitcast=True)
    q = (q + 8388608.0) - 8388608.0
    bits = ((e + 7) << 3) + q.to(tl.int32) - 8
    val = q * ((e + 124) << 23).to(tl.float32, bitcast=True)
    nan = s != s
    return tl.where(nan, 0x7F, bits), tl.where(nan, s, val)


@triton.jit
def nvfp4_scale(amax, gs, PORTABLE: tl.constexpr):
    """(e4m3 scale bits uint8, o) of the NVFP4 block rule (torch_fp4.formats.nvfp4_block_scale)."""
    if PORTABLE:
        s = gs * (amax * r6())
        bits, sf = e4m3_rn_satfinite_portable(s)
        o = rcp_rn(sf * rcp_rn(gs))
        sbits = bits.to(tl.uint8)
        o = tl.where(sf == 0, 0.0, o)
    else:
        sbits, o = nvfp4_block_scale(amax, gs)
    return sbits, o


@triton.jit
def exact_values(v, gs, BLOCK: tl.constexpr, PORTABLE: tl.constexpr):
    """v [R, C] fp32 (C a multiple of BLOCK) -> the values of its quantization along C, dequantized
    without the global scale (code * block scale, exact in bf16): NVFP4 (BLOCK 16) with global
    scale gs (a scalar or [R, 1]), or MXFP4 (BLOCK 32, gs unused); the rules of the quantize
    kernels (a NaN block: every value NaN)."""
    R: tl.constexpr = v.shape[0]
    C: tl.constexpr = v.shape[1]
    v3 = tl.reshape(v, (R, C // BLOCK, BLOCK))
    amax = tl.max(v3.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=2).to(tl.float32, bitcast=True)
    if BLOCK == 32:
        sbits, o = mxfp4_block_scale(amax)
        e = sbits.to(tl.int32)
        limit2 = mxfp4_limit2(e)
        sf = ue8m0_to_float(e)
    else:
        sbits, o = nvfp4_scale(amax, gs, PORTABLE)
        limit2 = tl.full(amax.shape, 16.0, tl.float32)
        sf = e4m3_value(sbits.to(tl.int32))
    code = e2m1_encode_doubled(v3 * (o * 2.0)[:, :, None], limit2[:, :, None])
    code = tl.where((o != o)[:, :, None], 7, code)
    return tl.reshape(e2m1_decode(code) * sf[:, :, None], (R, C))


@triton.jit
def fp4_tile(data_ptr, scale_ptr, rows, n_rows, kh0, half_k, n_kb, kp, HALF: tl.constexpr,
             BK: tl.constexpr, EVEN_K: tl.constexpr, PORTABLE: tl.constexpr, MX: tl.constexpr):
    """Rows `rows` x K elements [2 kh0, 2 kh0 + BK) of a row-major FP4 matrix [n_rows, 2 half_k]
    with 128x4 block scales (NVFP4: e4m3 per 16 elements; MX: MXFP4, e8m0 per 32), dequantized
    without a global scale, as (even elements, odd elements) [R, BK/2]; rows >= n_rows and K
    past the end read as 0. GPU: the mm kernel's in-register decode (HALF values); portable:
    fp32 values."""
    if PORTABLE:
        kh = kh0 + tl.arange(0, BK // 2)
        mask = (rows < n_rows)[:, None] & (kh < half_k)[None, :]
        packed = tl.load(data_ptr + rows.to(tl.int64)[:, None] * half_k + kh[None, :], mask=mask,
                         other=0).to(tl.int32)
        if MX:
            sbits = tl.load(scale_ptr + scale_offsets(rows[:, None], (kh // 16)[None, :], n_kb, kp,
                                                      LAYOUT_128x4), mask=mask, other=0).to(tl.int32)
            sf = ue8m0_value(sbits)
        else:
            sbits = tl.load(scale_ptr + scale_offsets(rows[:, None], (kh // 8)[None, :], n_kb, kp,
                                                      LAYOUT_128x4), mask=mask, other=0).to(tl.int32)
            sf = e4m3_value(sbits)
        lo = e2m1_decode(packed & 15) * sf
        hi = e2m1_decode(packed >> 4) * sf
    else:
        if MX:
            lo, hi = _decode(data_ptr, scale_ptr, rows, n_rows, kh0, half_k, n_kb, kp, half_k,
                             LAYOUT_128x4, True, 32, BK, HALF, EVEN_K)
        else:
            lo, hi = _decode(data_ptr, scale_ptr, rows, n_rows, kh0, half_k, n_kb, kp, half_k,
                             LAYOUT_128x4, False, 16, BK, HALF, EVEN_K)
    return lo, hi


@triton.jit
def ue8m0_value(bits):
    """UE8M0 byte (int32) -> fp32 2^(e - 127): e = 0 is the subnormal 2^-127, e = 255 NaN."""
    val = tl.where(bits == 0, 2.0 ** -127, (bits << 23).to(tl.float32, bitcast=True))
    return tl.where(bits == 255, float("nan"), val)


@triton.jit
def mma(a, b, acc, PORTABLE: tl.constexpr):
    """acc + a @ b (portable: fp32 operands multiplied exactly, no tf32)."""
    if PORTABLE:
        acc = tl.dot(a, b, acc, input_precision="ieee")
    else:
        acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def alpha_of(gsw_ptr, gsa_ptr, e, gsa_stride, A_FP4: tl.constexpr):
    """GEMM alpha of NVFP4 expert e (scalar or vector): RN(1 / RN(gs_a * gs_w[e])) (W4A4) or
    RN(1 / gs_w[e]) (W4A16), as torch_fp4.formats.nvfp4_alpha. (MXFP4 experts have none.)"""
    gsw = tl.load(gsw_ptr + e)
    if A_FP4:
        alpha = rcp_rn(tl.load(gsa_ptr + e * gsa_stride) * gsw)
    else:
        alpha = rcp_rn(gsw)
    return alpha


@triton.jit
def slot_tiles(ids_ptr, tw_ptr, tok, sel, top_k, KP: tl.constexpr):
    """The routing of tokens `tok` [R] where `sel`: expert ids [R, KP] (-1 where unselected or
    past top_k) and weights [R, KP] (0), one load each."""
    jj = tl.arange(0, KP)
    m = sel[:, None] & (jj < top_k)[None, :]
    offs = tok[:, None] * top_k + jj[None, :]
    return (tl.load(ids_ptr + offs, mask=m, other=-1),
            tl.load(tw_ptr + offs, mask=m, other=0.0))


@triton.jit
def _slot_term(y_ptr, inv_ptr, gsw_ptr, gsa_ptr, gsa_stride, b2_ptr, ids_t, w_bits, j, tok, sel, cols,
               col_ok, top_k, N, P, lo, E, KP: tl.constexpr, SPLIT: tl.constexpr,
               A_FP4: tl.constexpr, INDIRECT: tl.constexpr, PORTABLE: tl.constexpr,
               MX: tl.constexpr, BIAS: tl.constexpr):
    """(w[t, j], y[t, j]) of topk_sum for slot j (0 and 0 where unselected)."""
    jj = tl.arange(0, KP)[None, :]
    # column j of the slot tiles (a sum with one term: exact; w through its bits keeps -0.0)
    eid = tl.sum(tl.where(jj == j, ids_t, 0), axis=1)
    w = tl.sum(tl.where(jj == j, w_bits, 0), axis=1).to(tl.float32, bitcast=True)
    pair = tok * top_k + j
    local = sel & (eid >= lo) & (eid < lo + E)
    m = local[:, None] & col_ok[None, :]
    if SPLIT > 1:
        s = tl.load(y_ptr + pair[:, None] * N + cols[None, :], mask=m, other=0.0,
                    cache_modifier=".cg")
        for sp in tl.static_range(1, SPLIT):
            s += tl.load(y_ptr + (pair + sp * P)[:, None] * N + cols[None, :], mask=m,
                         other=0.0, cache_modifier=".cg")
        e_loc = tl.where(local, eid - lo, 0)
        if not MX:
            s = s * alpha_of(gsw_ptr, gsa_ptr, e_loc, gsa_stride, A_FP4)[:, None]
        if BIAS:   # RN_bf16(RN_fp32(alpha2 * sum) + b2[e]) (spec section 6)
            s = s + tl.load(b2_ptr + e_loc.to(tl.int64)[:, None] * N + cols[None, :], mask=m,
                            other=0.0).to(tl.float32)
        y = tl.where(m, rn_bf16(s, PORTABLE), 0.0)
    else:
        if INDIRECT:
            row = tl.load(inv_ptr + pair, mask=local, other=0).to(tl.int64)
        else:
            row = pair
        y = tl.load(y_ptr + row[:, None] * N + cols[None, :], mask=m, other=0.0,
                    cache_modifier=".cg").to(tl.float32)
    return w, y


@triton.jit
def topk_sum(y_ptr, inv_ptr, ids_ptr, tw_ptr, gsw_ptr, gsa_ptr, gsa_stride, b2_ptr, tok, sel, cols,
             col_ok, top_k, N, P, lo, E, KP: tl.constexpr, SPLIT: tl.constexpr,
             A_FP4: tl.constexpr, INDIRECT: tl.constexpr, PORTABLE: tl.constexpr,
             STRICT: tl.constexpr, MX: tl.constexpr, BIAS: tl.constexpr):
    """The finalize rule for tokens `tok` [R] (where `sel`) x columns `cols` [C]: fp32
    sum_j w[t, j] * y[t, j], j = 0, 1, ... in order from 0 as the reference adds, pairs routed to
    no local expert adding w * 0. y[t, j] is row t k + j of y [*, N] bf16 (row inv[t k + j] when
    INDIRECT), or, with SPLIT > 1, RN_bf16(alpha2[e] * (sum of the SPLIT fp32 partial rows
    t k + j of y [SPLIT, P, N], in split order)), with MX no alpha and with BIAS + b2[e] in fp32
    before the rounding. KP >= top_k (a power of two); without split
    partials the slot loop is unrolled so that every slot's rows load at once. Rows are read
    past L1 (.cg): other programs of the same kernel may have written them. STRICT (no expert
    parallelism): a token with an id outside [lo, lo + E) in one of its top_k slots sums to NaN
    in every column (spec section 6)."""
    ids_t, w_t = slot_tiles(ids_ptr, tw_ptr, tok, sel, top_k, KP)
    w_bits = w_t.to(tl.int32, bitcast=True)
    acc = tl.zeros([tok.shape[0], cols.shape[0]], tl.float32)
    if SPLIT > 1:
        for j in range(top_k):
            w, y = _slot_term(y_ptr, inv_ptr, gsw_ptr, gsa_ptr, gsa_stride, b2_ptr, ids_t, w_bits, j,
                              tok, sel, cols, col_ok, top_k, N, P, lo, E, KP, SPLIT, A_FP4, INDIRECT,
                              PORTABLE, MX, BIAS)
            acc = acc + w[:, None] * y
    else:
        for j in tl.static_range(KP):
            w, y = _slot_term(y_ptr, inv_ptr, gsw_ptr, gsa_ptr, gsa_stride, b2_ptr, ids_t, w_bits, j,
                              tok, sel, cols, col_ok, top_k, N, P, lo, E, KP, SPLIT, A_FP4, INDIRECT,
                              PORTABLE, MX, BIAS)
            acc = acc + w[:, None] * y   # slots past top_k add +0 (acc is never -0)
    if STRICT:
        jj = tl.arange(0, KP)[None, :]
        stray = (jj < top_k) & ((ids_t < lo) | (ids_t >= lo + E))
        acc = tl.where((tl.max(stray.to(tl.int32), axis=1) > 0)[:, None], float("nan"), acc)
    return acc
