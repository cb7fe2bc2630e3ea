"""Triton FP4 GEMM: out = RN_out(alpha * A @ W^T), W FP4 [N, K/2] (passed as b = w.T).

FP4 operands are decoded in registers, four codes per inline-asm instance (_DECODE_ASM): bit
placement gives the E2M1 value times a power of two in bf16 (fp16 for fp16 activations with
NVFP4), one multiply restores it and one multiplies by the block scale; both products are exact.
The packed tile is decoded into its even and odd elements and the other operand is split the
same way, so no interleaving shuffle is needed: A @ W^T = A_even @ W_even^T + A_odd @ W_odd^T.
The MMA (wgmma on sm_90) accumulates in fp32, so only the fp32 accumulation rounds, which the
spec's bound allows; on grid-exact inputs the result is exact. fp16 activations with MXFP4 (values
beyond fp16's range) multiply in tf32, exact for fp16 and FP4 values.

Tactics (torch_fp4/kernels/triton/mm_tactics.py) choose tiles, operand swap and split-K. Split-K
partial sums go to an fp32 workspace and a second kernel adds them in split order. For large M
the DequantMmTactic dequantizes to 16-bit and uses torch.mm (cuBLAS) with fp32 output.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import formats as F
from ... import meta
from ...problems import MmProblem
from .._common import formed_alpha, prepare_outputs, tactic_or_default, use_pdl, with_bias
from .mm_dot_scaled_tactics import DotScaledMmTactic
from .mm_tactics import MM_SPACE, DequantMmTactic, TritonMmTactic, dot_dtype, k_per_split
from .numerics import LAYOUT_128x4, LAYOUT_LINEAR, grouped_tile, scale_offsets, scale_word_offsets
from .quantize import _LAYOUT_ID, fp4_dequantize, fp4_quantized_values

_TL = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


# E2M1 -> 16-bit float, four packed codes per instance: bytes b0..b3 of $4 are spread to 16-bit
# halves (prmt), each code's sign goes to bit 15 and its exponent and mantissa to the top of the
# mantissa field, which encodes value * 2^-126 (bf16) or value * 2^-14 (fp16), subnormal 0.5
# included; one multiply by 2^126 (2^14) gives the value and one by the block scale ($5, $6)
# the dequantized value, both exact. Outputs: $0,$1 the low codes (even elements), $2,$3 the
# high codes (odd elements) of the four bytes.
_DECODE_ASM = """
{
.reg .b32 x0, x1, m, s, u, z;
mov.b32 u, {unit};
mov.b32 z, 0x80008000;
prmt.b32 x0, $4, 0, 0x4140;
prmt.b32 x1, $4, 0, 0x4342;
and.b32 m, x0, 0x00070007; shl.b32 m, m, {lo_m}; and.b32 s, x0, 0x00080008; shl.b32 s, s, 12;
or.b32 m, m, s; fma.rn.{t}x2 m, m, u, z; fma.rn.{t}x2 $0, m, $5, z;
and.b32 m, x1, 0x00070007; shl.b32 m, m, {lo_m}; and.b32 s, x1, 0x00080008; shl.b32 s, s, 12;
or.b32 m, m, s; fma.rn.{t}x2 m, m, u, z; fma.rn.{t}x2 $1, m, $6, z;
and.b32 m, x0, 0x00700070; shl.b32 m, m, {hi_m}; and.b32 s, x0, 0x00800080; shl.b32 s, s, 8;
or.b32 m, m, s; fma.rn.{t}x2 m, m, u, z; fma.rn.{t}x2 $2, m, $5, z;
and.b32 m, x1, 0x00700070; shl.b32 m, m, {hi_m}; and.b32 s, x1, 0x00800080; shl.b32 s, s, 8;
or.b32 m, m, s; fma.rn.{t}x2 m, m, u, z; fma.rn.{t}x2 $3, m, $6, z;
}
"""
# bf16 places both fields with one multiply: (nibble) * (2^6 + 2^12) puts a copy of the low
# nibble at bits 6..9 and one at 12..15 (disjoint, so no carries); the mask keeps exponent and
# mantissa from the first copy and the sign from the second. The high nibble uses 2^2 + 2^8.
DECODE_BF16: tl.constexpr = tl.constexpr("""
{
.reg .b32 x0, x1, m, u, z;
mov.b32 u, 0x7E807E80;
mov.b32 z, 0x80008000;
prmt.b32 x0, $4, 0, 0x4140;
prmt.b32 x1, $4, 0, 0x4342;
and.b32 m, x0, 0x000F000F; mul.lo.u32 m, m, 0x1040; and.b32 m, m, 0x81C081C0;
fma.rn.bf16x2 m, m, u, z; fma.rn.bf16x2 $0, m, $5, z;
and.b32 m, x1, 0x000F000F; mul.lo.u32 m, m, 0x1040; and.b32 m, m, 0x81C081C0;
fma.rn.bf16x2 m, m, u, z; fma.rn.bf16x2 $1, m, $6, z;
and.b32 m, x0, 0x00F000F0; mul.lo.u32 m, m, 0x104; and.b32 m, m, 0x81C081C0;
fma.rn.bf16x2 m, m, u, z; fma.rn.bf16x2 $2, m, $5, z;
and.b32 m, x1, 0x00F000F0; mul.lo.u32 m, m, 0x104; and.b32 m, m, 0x81C081C0;
fma.rn.bf16x2 m, m, u, z; fma.rn.bf16x2 $3, m, $6, z;
}
""")
DECODE_F16: tl.constexpr = tl.constexpr(
    _DECODE_ASM.replace("{lo_m}", "9").replace("{hi_m}", "5").replace("{t}", "f16")
    .replace("{unit}", "0x74007400"))


@triton.jit
def _decode(data_ptr, scale_ptr, rows, n_rows, kh0, half_k, n_kb, kp, row_stride,
            LAYOUT: tl.constexpr, MX: tl.constexpr, BLOCK: tl.constexpr, BK: tl.constexpr,
            HALF: tl.constexpr, EVEN_K: tl.constexpr):
    """Rows `rows` x K elements [2 kh0, 2 kh0 + BK) of a packed FP4 matrix, dequantized (no global
    scale) to HALF (bf16 or fp16) as (even elements, odd elements), each [R, BK/2]; rows >= n_rows
    and K beyond the end read as 0. Splitting by parity instead of interleaving keeps every code in
    the register that loaded it; the caller splits the other operand the same way."""
    R: tl.constexpr = rows.shape[0]
    kh = kh0 + tl.arange(0, BK // 2)
    kb = kh0 // (BLOCK // 2) + tl.arange(0, BK // BLOCK)
    row_ok = rows < n_rows
    if EVEN_K:  # K is a multiple of BK: no K masks
        mask = row_ok[:, None]
    else:
        mask = row_ok[:, None] & (kh < half_k)[None, :]
    packed = tl.load(data_ptr + rows.to(tl.int64)[:, None] * row_stride + kh[None, :],
                     mask=mask, other=0)
    NKB: tl.constexpr = BK // BLOCK
    if LAYOUT != LAYOUT_LINEAR and NKB % 4 == 0:
        # The swizzled layouts keep four consecutive K blocks of a row in one aligned 32-bit
        # word: load words (asynchronous copies the software pipeline can prefetch) and
        # spread their bytes; padding blocks beyond K are zeroed (their codes are masked).
        kw = kh0 // (2 * BLOCK) + tl.arange(0, NKB // 4)
        if EVEN_K:
            w_mask = row_ok[:, None]
        else:  # the last step may run past the padded scale columns (kp / 4 words per row)
            w_mask = row_ok[:, None] & (kw < kp // 4)[None, :]
        words = tl.load(scale_ptr.to(tl.pointer_type(tl.int32))
                        + scale_word_offsets(rows[:, None], kw[None, :], kp, LAYOUT),
                        mask=w_mask, other=0)
        sbits = (words[:, :, None] >> (8 * tl.arange(0, 4))[None, None, :]) & 0xFF
        sbits = tl.reshape(sbits, (R, NKB))
        if not EVEN_K:
            sbits = tl.where((kb < n_kb)[None, :], sbits, 0)
        sbits = sbits.to(tl.uint8)
    else:
        sbits = tl.load(scale_ptr + scale_offsets(rows[:, None], kb[None, :], n_kb, kp, LAYOUT),
                        mask=row_ok[:, None] & (kb < n_kb)[None, :], other=0)
    if MX:  # 2^(e-127) as bf16 bits: e=0 is the subnormal 2^-127, e=255 NaN
        e = sbits.to(tl.int32)
        bits = tl.where(e == 0, 0x40, tl.where(e == 255, 0x7FC0, e << 7))
        scale = bits.to(tl.int16).to(tl.bfloat16, bitcast=True)
    else:
        scale = sbits.to(tl.float8e4nv, bitcast=True).to(tl.float32).to(HALF)
    scale = tl.reshape(tl.broadcast_to(scale[:, :, None], (R, BK // BLOCK, BLOCK // 2)), (R, BK // 2))
    if HALF == tl.float16:
        lo, hi = tl.inline_asm_elementwise(DECODE_F16, "=r,=r,=r,=r,r,r,r", [packed, scale],
                                           dtype=(tl.float16, tl.float16), is_pure=True, pack=4)
    else:
        lo, hi = tl.inline_asm_elementwise(DECODE_BF16, "=r,=r,=r,=r,r,r,r", [packed, scale],
                                           dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4)
    return lo, hi


@triton.jit
def _mm_kernel(a_ptr, as_ptr, b_ptr, bs_ptr, alpha_ptr, out_ptr, ws_ptr,
               M, N, K, KH, a_kp, b_kp, kh_per_split,
               A_FP4: tl.constexpr, A_LAYOUT: tl.constexpr, MX: tl.constexpr, BLOCK: tl.constexpr,
               HAS_ALPHA: tl.constexpr, SPLIT: tl.constexpr, SWAP: tl.constexpr,
               DOT: tl.constexpr, HALF: tl.constexpr, OUT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
               BK: tl.constexpr, GROUP_M: tl.constexpr, EVEN_K: tl.constexpr,
               USE_GDC: tl.constexpr):
    if USE_GDC:
        tl.extra.cuda.gdc_wait()
    pid, pid_k = tl.program_id(0), tl.program_id(1)
    pid_m, pid_n = grouped_tile(pid, M, N, BM, BN, GROUP_M)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    n_kb = K // BLOCK  # KH = K // 2 is an argument so that its divisibility is known
    if SWAP:
        acc = tl.zeros((BN, BM), tl.float32)
    else:
        acc = tl.zeros((BM, BN), tl.float32)
    # The loop runs over packed bytes (kh0 = k / 2) so that every offset's divisibility is
    # known from the arguments' (wide, asynchronous loads).
    kh_begin = pid_k * kh_per_split
    kh_end = tl.minimum(KH, kh_begin + kh_per_split)
    for kh0 in range(kh_begin, kh_end, BK // 2):
        w0, w1 = _decode(b_ptr, bs_ptr, rn, N, kh0, KH, n_kb, b_kp, KH, LAYOUT_128x4, MX,
                         BLOCK, BK, HALF, EVEN_K)
        if A_FP4:
            x0, x1 = _decode(a_ptr, as_ptr, rm, M, kh0, KH, n_kb, a_kp, KH, A_LAYOUT, MX,
                             BLOCK, BK, HALF, EVEN_K)
        else:
            kk = 2 * kh0 + tl.arange(0, BK)
            if EVEN_K:
                x_mask = (rm < M)[:, None]
            else:
                x_mask = (rm < M)[:, None] & (kk < K)[None, :]
            x = tl.load(a_ptr + rm.to(tl.int64)[:, None] * K + kk[None, :], mask=x_mask, other=0.0)
            x0, x1 = tl.split(tl.reshape(x, (BM, BK // 2, 2)))
        w0, w1, x0, x1 = w0.to(DOT), w1.to(DOT), x0.to(DOT), x1.to(DOT)
        if SWAP:
            acc = tl.dot(w0, tl.trans(x0), acc)
            acc = tl.dot(w1, tl.trans(x1), acc)
        else:
            acc = tl.dot(x0, tl.trans(w0), acc)
            acc = tl.dot(x1, tl.trans(w1), acc)
    if SWAP:
        acc = tl.trans(acc)
    mask = (rm < M)[:, None] & (rn < N)[None, :]
    offs = rm.to(tl.int64)[:, None] * N + rn[None, :]
    if SPLIT > 1:
        tl.store(ws_ptr + pid_k.to(tl.int64) * M * N + offs, acc, mask=mask)
    else:
        if HAS_ALPHA:
            acc = acc * tl.load(alpha_ptr)
        tl.store(out_ptr + offs, acc.to(OUT), mask=mask)


@triton.jit
def _split_reduce_kernel(ws_ptr, alpha_ptr, out_ptr, MN, SPLIT: tl.constexpr,
                         HAS_ALPHA: tl.constexpr, OUT: tl.constexpr, BLOCK: tl.constexpr,
                         USE_GDC: tl.constexpr):
    """out = RN_out(alpha * sum of the split partials, added in split order)."""
    if USE_GDC:
        tl.extra.cuda.gdc_wait()
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    acc = tl.load(ws_ptr + offs, mask=mask, other=0.0)
    for s in tl.static_range(1, SPLIT):
        acc += tl.load(ws_ptr + s * MN + offs, mask=mask, other=0.0)
    if HAS_ALPHA:
        acc = acc * tl.load(alpha_ptr)
    tl.store(out_ptr + offs, acc.to(OUT), mask=mask)


def mm_fp4(a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor | None, b_scale: torch.Tensor,
           alpha: torch.Tensor | None, out_dtype: torch.dtype, fmt: F.Fp4Format,
           layout: F.SfLayout, wlayout: F.WeightLayout = F.WeightLayout.ROW,
           quantize_a: bool = False, a_global_scale: torch.Tensor | None = None,
           b_global_scale: torch.Tensor | None = None, bias: torch.Tensor | None = None,
           tactic: TritonMmTactic | None = None, problem: MmProblem | None = None) -> torch.Tensor:
    if wlayout is not F.WeightLayout.ROW:
        raise ValueError(f"mm_fp4: the triton backend reads row-major weights, got {wlayout.value!r}")
    if bias is not None:   # the kernels take no bias: _common.with_bias adds it to their fp32 result
        return with_bias(lambda d, q: mm_fp4(a, b, a_scale, b_scale, alpha, d, fmt, layout, wlayout, quantize_a,
                                             a_global_scale, b_global_scale, tactic=tactic, problem=q),
                         problem, out_dtype, bias)
    p = problem or MmProblem.of(a, b, a_scale, b_scale, alpha, out_dtype, fmt, layout, wlayout, quantize_a,
                                b_global_scale)
    alpha = formed_alpha(alpha, a_global_scale, b_global_scale)
    if quantize_a:   # W4A4 from 16-bit activations: their exact values first, then W4A16
        a, p = fp4_quantized_values(a, a_global_scale, fmt), p.on_values()
    args = (a, b, a_scale, b_scale, alpha, out_dtype, fmt, layout)
    t = tactic_or_default(tactic, MM_SPACE, p)
    if isinstance(t, DotScaledMmTactic):
        from .mm_dot_scaled import mm_fp4_dot_scaled
        return mm_fp4_dot_scaled(*args, tactic=t, problem=p)
    if isinstance(t, DequantMmTactic):
        return _dequantize_then_mm(*args, half=dot_dtype(p))
    out = prepare_outputs(meta.mm_fp4(a, b, out_dtype))
    m, n, k = p.m, p.n, p.k
    if m == 0 or n == 0:
        return out
    per_split = k_per_split(p, t)
    ws = torch.empty((t.split_k, m, n), dtype=torch.float32, device=a.device) if t.split_k > 1 else out
    pdl = use_pdl(a.device)
    a_fp4 = a_scale is not None
    dot = dot_dtype(p)
    a_kp = F.padded_scale_shape(m, k // fmt.block_size, layout)[1] if a_fp4 else 0
    b_kp = b_scale.shape[0]
    grid = (triton.cdiv(m, t.block_m) * triton.cdiv(n, t.block_n), t.split_k)
    _mm_kernel[grid](
        a.view(torch.uint8) if a_fp4 else a, a_scale.view(torch.uint8) if a_fp4 else b_scale.view(torch.uint8),
        b.view(torch.uint8), b_scale.view(torch.uint8), alpha if alpha is not None else ws, out, ws,
        m, n, k, k // 2, a_kp, b_kp, per_split // 2,
        A_FP4=a_fp4, A_LAYOUT=_LAYOUT_ID[layout], MX=fmt is F.MXFP4, BLOCK=fmt.block_size,
        HAS_ALPHA=alpha is not None, SPLIT=t.split_k, SWAP=t.swap_ab, DOT=_TL[dot],
        HALF=tl.float16 if dot == torch.float16 else tl.bfloat16,
        OUT=_TL[out_dtype], BM=t.block_m, BN=t.block_n, BK=t.block_k, GROUP_M=t.group_m,
        EVEN_K=k % t.block_k == 0,
        USE_GDC=pdl, launch_pdl=pdl, num_warps=t.num_warps, num_stages=t.num_stages)
    if t.split_k > 1:
        block = 1024
        _split_reduce_kernel[(triton.cdiv(m * n, block),)](
            ws, alpha if alpha is not None else ws, out, m * n, SPLIT=t.split_k,
            HAS_ALPHA=alpha is not None, OUT=_TL[out_dtype], BLOCK=block, USE_GDC=pdl,
            launch_pdl=pdl, num_warps=4)
    return out


def _dequantize_then_mm(a, b, a_scale, b_scale, alpha, out_dtype, fmt, layout, half) -> torch.Tensor:
    """DequantMmTactic: exact 16-bit operands (`half`, the dot dtype), torch.mm accumulating into
    fp32, then RN_out(alpha * acc)."""
    w = fp4_dequantize(b.T, b_scale.T, None, fmt, F.SfLayout.LAYOUT_128x4, half)
    x = fp4_dequantize(a, a_scale, None, fmt, layout, half) if a_scale is not None else a
    acc = torch.mm(x, w.T, out_dtype=torch.float32)
    if alpha is not None:
        acc.mul_(alpha)
    return acc if out_dtype == torch.float32 else acc.to(out_dtype)
