"""The numerics contract (spec sections 1-4) as CuTe DSL device functions.

Values are fp32 bit patterns in Uint32 registers; every floating-point step is one `.rn` PTX
instruction from `ptx`, so results equal torch_fp4.formats bit for bit. The functions are
traced into the calling kernel (Python loops unroll at trace time).
"""
from __future__ import annotations

from cutlass import Int32, Uint32

from . import ptx as P

R6 = 0x3E2AAAAB            # RN(1/6)
F32_INF = 0x7F800000
F32_ONE = 0x3F800000
MAGIC = 0x4B000000         # 2^23: RN(y + 2^23) has RNE(y) in its low mantissa bits

# Input element types by name, with their size in bytes.
ELEMENT_BYTES = {"bf16": 2, "f16": 2, "f32": 4, "e4m3": 1}


def abs_bits(x) -> Uint32:
    return Uint32(x) & Uint32(0x7FFFFFFF)


def is_nan(x):
    return abs_bits(x) > Uint32(F32_INF)


def f16_low_to_f32(h) -> Uint32:
    return P.f16x2_to_f32(h)[0]


# --- loading and widening ------------------------------------------------------------------------
def as_half_words(words, dtype: str) -> list:
    """Raw 32-bit words of one block -> words holding packed 16-bit pairs (element order kept):
    bf16/f16 unchanged, e4m3 widened exactly to f16 pairs. Not used for f32."""
    if dtype == "e4m3":
        out = []
        for w in words:
            out.append(P.e4m3x2_to_f16x2(w & Uint32(0xFFFF)))
            out.append(P.e4m3x2_to_f16x2(w >> Uint32(16)))
        return out
    return list(words)


def widen(words, dtype: str) -> list:
    """Raw words of one block -> fp32 bit patterns of its elements, exactly, in element order."""
    if dtype == "f32":
        return list(words)
    vals = []
    for w in as_half_words(words, dtype):
        if dtype == "bf16":
            vals.append(w << Uint32(16))
            vals.append(w & Uint32(0xFFFF0000))
        else:
            lo, hi = P.f16x2_to_f32(w)
            vals.append(lo)
            vals.append(hi)
    return vals


def _tree(fn, items):
    items = list(items)
    while len(items) > 1:
        nxt = [fn(items[i], items[i + 1]) for i in range(0, len(items) - 1, 2)]
        if len(items) % 2:
            nxt.append(items[-1])
        items = nxt
    return items[0]


def block_amax(words, vals, dtype: str) -> Uint32:
    """fp32 bits of max |x| over a block. Maximum of magnitude bit patterns as unsigned
    integers: equals the float maximum, and any NaN (whose pattern exceeds Inf's) wins."""
    if dtype == "f32":
        return _tree(P.umax, [abs_bits(v) for v in vals])
    halves = as_half_words(words, dtype)
    m = _tree(P.umax_u16x2, [w & Uint32(0x7FFF7FFF) for w in halves])
    h = P.umax(m & Uint32(0xFFFF), m >> Uint32(16))
    return h << Uint32(16) if dtype == "bf16" else f16_low_to_f32(h)


# --- block scales --------------------------------------------------------------------------------
def e4m3_to_f32(byte) -> Uint32:
    return f16_low_to_f32(P.e4m3x2_to_f16x2(byte))


def nvfp4_scale(amax, gs, rgs):
    """(s8 byte, o) of formats.nvfp4_block_scale; rgs = RN(1/gs)."""
    s = P.fmul_rn(gs, P.fmul_rn(amax, R6))
    s8 = P.sel(is_nan(s), 0x7F, P.f32_to_e4m3(s))
    sf = e4m3_to_f32(s8)
    o = P.rcp_rn(P.fmul_rn(sf, rgs))
    return s8, P.sel(abs_bits(sf) == Uint32(0), 0, o)


def ue8m0_ceil(v) -> Uint32:
    """formats.ue8m0_ceil on fp32 bits."""
    bits = abs_bits(v)
    exp = bits >> Uint32(23)
    e = P.umin(exp + P.sel((bits & Uint32(0x7FFFFF)) != Uint32(0), 1, 0), 254)
    e = P.sel(exp == Uint32(0), P.sel(bits > Uint32(0x00400000), 1, 0), e)
    return P.sel(bits > Uint32(F32_INF), 255, e)


def mxfp4_scale(amax):
    """(e byte, o) of formats.mxfp4_block_scale: o = 2^(127-e) from its bits (subnormal for
    e >= 254), 1 for e == 0, 0 for amax == 0."""
    e = ue8m0_ceil(P.fmul_rn(amax, R6))
    normal = (Uint32(254) - P.umin(e, 254)) << Uint32(23)
    subnormal = Uint32(1) << (Uint32(276) - P.umax(e, 254))
    o = P.sel(e <= Uint32(253), normal, subnormal)
    o = P.sel(e == Uint32(0), F32_ONE, o)
    return e, P.sel(abs_bits(amax) == Uint32(0), 0, o)


# --- E2M1 ---------------------------------------------------------------------------------------
# Code of fp32 p (formats.e2m1_encode). With u = |p| the magnitude code is RNE(g(u)) saturated at
# 7, g(u) = min(2u, u + 2, u/2 + 4) (piecewise linear through the grid points, so its rounding
# ties are the encoder's ties). Each piece is one fma rounding t = RN(piece + 2^23), whose bits
# are 0x4B000000 + RNE(piece); min(t1, t2, t3, 2^23 + 7) - 2^23 is the magnitude code. Codes are
# packed by integer multiply-adds (wrapping 32-bit arithmetic cancels the 2^23 offsets).
_PACK_BIAS = (-(MAGIC * 0x11111111)) & 0xFFFFFFFF


def _magnitude_bits(p, cap) -> Uint32:
    t1 = P.fma_rn_abs(p, 0x40000000, MAGIC)
    t2 = P.fma_rn_abs(p, F32_ONE, MAGIC + 2)
    t3 = P.fma_rn_abs(p, 0x3F000000, MAGIC + 4)
    return P.umin(P.umin(P.umin(t1, t2), t3), cap)


def magnitude_cap(sbyte, nvfp4: bool):
    """MAGIC + the largest magnitude code a block may take: 7, or for MXFP4 formats.mxfp4_limit's
    code (5: magnitude 3 for e = 253; 3: magnitude 1.5 for e = 254), so that no code times the
    scale overflows fp32. Capping the code equals clamping x * o to that magnitude first."""
    if nvfp4:
        return MAGIC + 7
    return P.sel(sbyte == Uint32(253), MAGIC + 5, P.sel(sbyte == Uint32(254), MAGIC + 3, MAGIC + 7))


def _sign_word(p) -> Uint32:
    """Sign bits of 8 non-NaN fp32 values at bit 4i+3 (the sign of code i). prmt replicates
    each value's top bit over a byte: even values fill A's bytes, odd values B's, and
    bytes j of A and B hold codes 2j and 2j+1 (bits 8j+3 and 8j+7)."""
    even = P.prmt(P.prmt(p[0], p[2], 0xFB), P.prmt(p[4], p[6], 0xFB00), 0x7610)
    odd = P.prmt(P.prmt(p[1], p[3], 0xFB), P.prmt(p[5], p[7], 0xFB00), 0x7610)
    return (even & Uint32(0x08080808)) | (odd & Uint32(0x80808080))


def encode_words(products, safe: bool, cap=MAGIC + 7) -> list:
    """fp32 products x * o of one block -> packed E2M1 words (8 codes per word, element 0 in
    the low nibble), magnitude codes at most cap - MAGIC (magnitude_cap). safe=False is exact
    for every non-NaN product; safe=True first maps NaN to +Inf with min(p, +Inf) (code 7,
    sign 0; every other value unchanged)."""
    words = []
    for base in range(0, len(products), 8):
        p = products[base:base + 8]
        if safe:
            p = [P.fmin_inf(v) for v in p]
        w = _sign_word(p) + Uint32(_PACK_BIAS)
        for i in range(8):
            w = w + _magnitude_bits(p[i], cap) * Uint32(1 << (4 * i))
        words.append(w)
    return words


def block_scale(words, dtype: str, nvfp4: bool, gs=None, rgs=None):
    """One block's raw input words -> (fp32 elements, scale byte, encode factor o, special),
    special meaning a product x * o may be NaN (amax or o not finite)."""
    vals = widen(words, dtype)
    amax = block_amax(words, vals, dtype)
    if nvfp4:
        sbyte, o = nvfp4_scale(amax, gs, rgs)
        special = (amax >= Uint32(F32_INF)) | (abs_bits(o) >= Uint32(F32_INF))
    else:
        sbyte, o = mxfp4_scale(amax)
        special = amax >= Uint32(F32_INF)
    return vals, sbyte, o, special


def products(vals, o) -> list:
    return [P.fmul_rn(v, o) for v in vals]


# --- E2M1 decode (dequantize) ------------------------------------------------------------------
def e2m1_value(code) -> Uint32:
    """fp32 bits of the E2M1 value of a 4-bit code: magnitude c >= 2 is (c + 252) << 22
    (exponent (c >> 1) + 126, mantissa bit c & 1), c == 1 is 0.5, c == 0 is 0."""
    c = code & Uint32(7)
    mag = P.sel(c >= Uint32(2), (c + Uint32(252)) << Uint32(22),
                P.sel(c == Uint32(1), 0x3F000000, 0))
    return mag | ((code & Uint32(8)) << Uint32(28))


def ue8m0_to_f32(e) -> Uint32:
    """formats.ue8m0_to_float: 0 -> 2^-127 (0x00400000), 255 -> NaN, else e << 23."""
    v = P.sel(e == Uint32(0), 0x00400000, e << Uint32(23))
    return P.sel(e == Uint32(255), 0x7FC00000, v)


def dequantize_words(packed, sf, rgs, out: str) -> list:
    """Packed E2M1 words of one block, its scale sf (fp32 bits) and RN(1/gs) (or None) ->
    output words: RN_out(RN(LUT(q) * sf) * rgs) (the first product is exact), two 16-bit
    values or one fp32 value per word, element order kept."""
    vals = []
    for w in packed:
        for i in range(8):
            v = P.fmul_rn(e2m1_value(w >> Uint32(4 * i)), sf)
            if rgs is not None:
                v = P.fmul_rn(v, rgs)
            vals.append(v)
    if out == "f32":
        return vals
    cvt = P.f32_to_bf16x2 if out == "bf16" else P.f32_to_f16x2
    return [cvt(vals[i], vals[i + 1]) for i in range(0, len(vals), 2)]


# --- scale-factor layouts ----------------------------------------------------------------------
def scale_offset(layout: str, m, kb, kp) -> Int32:
    """Byte offset of scale (m, kb) inside one [Mp, Kp] matrix (formats.swizzled_offset)."""
    m, kb, kp = Int32(m), Int32(kb), Int32(kp)
    if layout == "128x4":
        return (((m >> 7) * (kp >> 2) + (kb >> 2)) << 9) + ((m & 31) << 4) \
            + (((m >> 5) & 3) << 2) + (kb & 3)
    if layout == "8x4":
        return (((m >> 3) * (kp >> 2) + (kb >> 2)) << 5) + ((m & 7) << 2) + (kb & 3)
    return m * kp + kb
