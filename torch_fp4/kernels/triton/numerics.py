"""Triton device functions for the numerics contract (bit-exact twins of torch_fp4.formats).

Every rounding step is one fp32 operation: multiplies are never fused with adds, reciprocals
use `tl.div_rn` (correctly rounded), and fp32 -> e4m3 uses the hardware's RNE satfinite
conversion (sm_89+), whose saturation and NaN (0x7F) match the spec.
"""
import triton
import triton.language as tl

LAYOUT_128x4: tl.constexpr = tl.constexpr(0)
LAYOUT_8x4: tl.constexpr = tl.constexpr(1)
LAYOUT_LINEAR: tl.constexpr = tl.constexpr(2)


@triton.jit
def r6():
    """RN(1/6) = fp32 bits 0x3E2AAAAB."""
    return tl.full([], 0x3E2AAAAB, tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def rcp_rn(x):
    """Correctly rounded 1/x."""
    return tl.div_rn(tl.full(x.shape, 1.0, tl.float32), x)


@triton.jit
def nan_amax(lo, hi, axis: tl.constexpr):
    """max |x| over both halves along `axis` as an integer max of fp32 bit patterns: NaN
    patterns exceed Inf's, so a NaN anywhere makes the result NaN (tl.max would drop it)."""
    bits = tl.maximum(lo.to(tl.int32, bitcast=True) & 0x7FFFFFFF, hi.to(tl.int32, bitcast=True) & 0x7FFFFFFF)
    return tl.max(bits, axis=axis).to(tl.float32, bitcast=True)


@triton.jit
def e2m1_encode_doubled(y2, limit2):
    """E2M1 code (int32) of y = y2 / 2, for y2 = 2 * y computed as x * (2 * o), which is exact.
    limit2 is twice the largest magnitude to encode: 16.0 (plain saturation at 6), or
    mxfp4_limit2 of an MXFP4 block's scale byte.

    On m2 = min(|y2|, limit2) (at most 16) the grid is {0, 1, 2, 3, 4, 6, 8, 12} and rounding to it is fp32 RNE
    to two significant bits with at least unit steps: add and subtract c = 2^(max(e, 1) + 22),
    e the exponent of m2. Ties go to the even code exactly as the spec's comparison chain.
    Codes: r2 < 4 -> r2; else (exponent, top mantissa bit) of r2 - 254, at most 7. The sign is
    kept on zero. NaN is not handled here: only a NaN block scale makes y NaN, and callers
    replace such blocks by code 7.
    """
    m2 = tl.minimum(tl.abs(y2), limit2)
    c = (tl.maximum(m2.to(tl.int32, bitcast=True) & 0x7F800000, 128 << 23) + (22 << 23))
    c = c.to(tl.float32, bitcast=True)
    r2 = (m2 + c) - c
    big = tl.minimum((r2.to(tl.int32, bitcast=True) >> 22) - 254, 7)
    code = tl.where(r2 < 4.0, r2.to(tl.int32), big)
    return code | ((y2.to(tl.int32, bitcast=True) >> 28) & 8)


@triton.jit
def e2m1_decode(c):
    """E2M1 code (int32) -> fp32 value, by integer arithmetic (exact; code 8 gives -0.0)."""
    exp = (c >> 1) & 3
    man = c & 1
    twice = tl.where(exp == 0, man, (2 + man) << tl.maximum(exp - 1, 0))
    mag = (twice.to(tl.float32) * 0.5).to(tl.int32, bitcast=True)
    return (mag | ((c & 8) << 28)).to(tl.float32, bitcast=True)


# Element pairs: two adjacent elements travel as one integer twice their width (bf16/fp16 in
# int32, fp32 in int64, fp8 in int16), even element in the low half. Loads and stores stay
# wide and the even/odd split needs no reshape.
SRC_BF16: tl.constexpr = tl.constexpr(0)
SRC_FP16: tl.constexpr = tl.constexpr(1)
SRC_FP32: tl.constexpr = tl.constexpr(2)
SRC_FP8: tl.constexpr = tl.constexpr(3)


@triton.jit
def unpair(p, SRC: tl.constexpr):
    """Pair integer -> (even, odd) as fp32 (exact)."""
    if SRC == SRC_BF16:
        lo = (p << 16).to(tl.float32, bitcast=True)
        hi = (p & -65536).to(tl.float32, bitcast=True)
    elif SRC == SRC_FP16:
        lo = (p & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
        hi = (p >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    elif SRC == SRC_FP32:
        lo = (p & 0xFFFFFFFF).to(tl.int32).to(tl.float32, bitcast=True)
        hi = (p >> 32).to(tl.int32).to(tl.float32, bitcast=True)
    else:
        lo = (p & 0xFF).to(tl.int8).to(tl.float8e4nv, bitcast=True).to(tl.float32)
        hi = (p >> 8).to(tl.int8).to(tl.float8e4nv, bitcast=True).to(tl.float32)
    return lo, hi


@triton.jit
def pair(lo, hi, DST: tl.constexpr):
    """(even, odd) fp32 -> pair integer of DST (bf16 / fp16 / fp32), rounding RNE."""
    if DST == SRC_BF16:
        a = lo.to(tl.bfloat16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
        b = hi.to(tl.bfloat16).to(tl.int16, bitcast=True).to(tl.int32)
        return a | (b << 16)
    elif DST == SRC_FP16:
        a = lo.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
        b = hi.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32)
        return a | (b << 16)
    else:
        a = lo.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF
        b = hi.to(tl.int32, bitcast=True).to(tl.int64)
        return a | (b << 32)


@triton.jit
def nvfp4_block_scale(amax, gs):
    """(e4m3 scale bits as uint8, o) of the NVFP4 rule; see formats.nvfp4_block_scale."""
    s = gs * (amax * r6())
    s8 = s.to(tl.float8e4nv)
    sf = s8.to(tl.float32)
    o = rcp_rn(sf * rcp_rn(gs))
    return s8.to(tl.uint8, bitcast=True), tl.where(sf == 0, 0.0, o)


@triton.jit
def ue8m0_reciprocal(e):
    """2^(127-e) as fp32 for int32 e in [1, 255] (subnormal for e >= 254)."""
    normal = (254 - e) << 23
    subnormal = tl.full(e.shape, 1, tl.int32) << tl.minimum(tl.maximum(276 - e, 0), 22)
    return tl.where(e <= 253, normal, subnormal).to(tl.float32, bitcast=True)


@triton.jit
def mxfp4_block_scale(amax):
    """(ue8m0 scale bits as uint8, o) of the MXFP4 rule; see formats.mxfp4_block_scale."""
    v = amax * r6()
    bits = v.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    exp = bits >> 23
    man = bits & 0x7FFFFF
    e = tl.minimum(exp + (man != 0).to(tl.int32), 254)
    e = tl.where(exp == 0, (bits > 0x00400000).to(tl.int32), e)
    e = tl.where(v != v, 255, e)
    o = tl.where(e == 0, 1.0, ue8m0_reciprocal(tl.maximum(e, 1)))
    return e.to(tl.uint8), tl.where(amax == 0, 0.0, o)


@triton.jit
def mxfp4_limit2(e):
    """Twice formats.mxfp4_limit of a scale byte (int32): 6.0 for 253, 3.0 for 254, else 16.0
    (no limit below e2m1's saturation)."""
    return tl.where(e == 253, 6.0, tl.where(e == 254, 3.0, 16.0))


@triton.jit
def ue8m0_to_float(e):
    """UE8M0 byte (int32) -> 2^(e-127); 0 -> 2^-127, 255 -> NaN."""
    bits = tl.where(e == 0, 0x00400000, e << 23)
    bits = tl.where(e == 255, 0x7FC00000, bits)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def scale_offsets(rows, kbs, n_kb, kp, LAYOUT: tl.constexpr):
    """Byte offsets (int64) of scales (rows[i], kbs[i]) in one matrix of `LAYOUT` (spec 4)."""
    m = rows.to(tl.int64)
    kb = kbs.to(tl.int64)
    if LAYOUT == LAYOUT_128x4:
        off = ((m // 128) * (kp // 4) + kb // 4) * 512 + (m % 32) * 16 + ((m % 128) // 32) * 4 + kb % 4
    elif LAYOUT == LAYOUT_8x4:
        off = (m // 8) * (kp // 4) * 32 + (kb // 4) * 32 + (m % 8) * 4 + kb % 4
    else:
        off = m * n_kb + kb
    return off


@triton.jit
def scale_word_offsets(rows, kws, kp, LAYOUT: tl.constexpr):
    """Offsets, in 32-bit words, of the words holding scales (rows[i], 4*kws[i] .. 4*kws[i]+3)
    in one matrix of a swizzled `LAYOUT` (128x4 or 8x4), where those four scales are adjacent."""
    m = rows.to(tl.int64)
    kw = kws.to(tl.int64)
    if LAYOUT == LAYOUT_128x4:
        off = ((m // 128) * (kp // 4) + kw) * 128 + (m % 32) * 4 + (m % 128) // 32
    else:
        off = (m // 8) * (kp // 4) * 8 + kw * 8 + m % 8
    return off


@triton.jit
def grouped_tile(pid, M, N, BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr):
    """(M tile, N tile) of program `pid` in grouped order: GROUP_M M tiles run along each N
    column of tiles before the next, so programs that share a weight tile run together (L2)."""
    tiles_m, tiles_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
    group = GROUP_M * tiles_n
    first_m = (pid // group) * GROUP_M
    rows_in_group = tl.minimum(tiles_m - first_m, GROUP_M)
    return first_m + (pid % group) % rows_in_group, (pid % group) // rows_in_group
