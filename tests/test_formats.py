"""CPU tests of torch_fp4.formats (layer 0) against oracles written independently in this file.

Every oracle here is derived from the spec (shared/spec/fp4-numerics.md, sections 1-4) and never
calls the formats.py function under test:
  * E2M1: brute-force nearest of the 8 LUT magnitudes with exact rational distances.
  * e4m3: brute-force nearest over every finite e4m3 value (decoded by torch's float8_e4m3fn
    conversion, itself checked against the bit-field formula below).
  * UE8M0: math.frexp on Python floats.
  * Layouts: the closed-form byte offsets of spec section 4, written out here.
"""
from __future__ import annotations

import bisect
import math
import struct
from fractions import Fraction

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torch_fp4 import formats as F

SETTINGS = settings(max_examples=80, deadline=None)

LUT = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
INF = float("inf")
NAN = float("nan")


def f32_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def bits_f32(b: int) -> float:
    return struct.unpack("<f", struct.pack("<I", b))[0]


def fp32(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def is_neg(x: float) -> bool:
    return math.copysign(1.0, x) < 0


# ---------------------------------------------------------------------------------------------
# Oracles
# ---------------------------------------------------------------------------------------------
def oracle_e2m1(x: float) -> int:
    """Spec 1: nearest LUT magnitude (ties to the even code), |x| > 6 and Inf -> 6, sign kept,
    NaN -> 0x7 (whatever its sign bit)."""
    if math.isnan(x):
        return 0x7
    sign = 0x8 if is_neg(x) else 0x0
    m = abs(x)
    if m > 6:
        return sign | 0x7
    fm = Fraction(m)
    best = min(range(8), key=lambda c: (abs(fm - Fraction(LUT[c])), c % 2))
    return sign | best


# Torch's decoding of every e4m3fn byte (the brief allows it as the oracle's table; it is itself
# checked against the bit-field definition in test_e4m3_decode_table_matches_bit_fields).
E4M3_ALL = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float().tolist()
E4M3_POS = E4M3_ALL[:0x7F]  # bytes 0x00..0x7E, increasing, 0 .. 448


def oracle_e4m3(x: float) -> int:
    """Spec 2: RN-even to e4m3fn, |x| > 448 and Inf saturate to +-448, NaN -> 0x7F."""
    if math.isnan(x):
        return 0x7F
    sign = 0x80 if is_neg(x) else 0x00
    m = abs(x)
    if m > 448:
        return sign | 0x7E
    i = bisect.bisect_left(E4M3_POS, m)
    cands = [b for b in (i - 1, i) if 0 <= b <= 0x7E]
    fm = Fraction(m)
    # Within a binade an even byte is an even mantissa; across a binade boundary the candidate
    # with mantissa 0 (even byte) is also the even-mantissa one.
    best = min(cands, key=lambda b: (abs(fm - Fraction(E4M3_POS[b])), b % 2))
    return sign | best


def oracle_ue8m0(v: float) -> int:
    """Spec 3: biased exponent of v rounded up to a power of two, saturating at 254; NaN -> 255."""
    if math.isnan(v):
        return 255
    if v == 0:
        return 0
    if math.isinf(v):
        return 254
    mant, ex = math.frexp(v)  # v = mant * 2**ex, 0.5 <= mant < 1
    k = ex - 1 if mant == 0.5 else ex  # ceil(log2(v))
    return min(254, max(0, k + 127))


def spec_padded(rows: int, kb: int, layout: str) -> tuple[int, int]:
    if layout == "128x4":
        return -(-rows // 128) * 128, -(-kb // 4) * 4
    if layout == "8x4":
        return -(-rows // 8) * 8, -(-kb // 4) * 4
    return rows, kb


def spec_offset(m: torch.Tensor, kb: torch.Tensor, kp: int, layout: str) -> torch.Tensor:
    """Spec section 4, byte offset of (m, kb) inside one [Mp, Kp] matrix."""
    if layout == "128x4":
        return ((m // 128) * (kp // 4) + kb // 4) * 512 + (m % 32) * 16 + ((m % 128) // 32) * 4 + kb % 4
    if layout == "8x4":
        return (m // 8) * (kp // 4) * 32 + (kb // 4) * 32 + (m % 8) * 4 + kb % 4
    return m * kp + kb


def neighbours(values) -> list[float]:
    """Each value and its fp32 neighbours on both sides."""
    t = fp32(values)
    up = torch.nextafter(t, fp32([INF]).expand_as(t))
    down = torch.nextafter(t, fp32([-INF]).expand_as(t))
    return torch.cat([t, up, down]).tolist()


# ---------------------------------------------------------------------------------------------
# E2M1
# ---------------------------------------------------------------------------------------------
def test_e2m1_encode_specials():
    cases = [  # (value, code); a list, since 0.0 == -0.0 as dict keys
        (0.0, 0x0), (-0.0, 0x8), (0.1, 0x0), (-0.1, 0x8), (2.0 ** -149, 0x0),
        (-(2.0 ** -149), 0x8), (6.0, 0x7), (-6.0, 0xF), (6.5, 0x7), (7.0, 0x7), (-1e30, 0xF),
        (3.4e38, 0x7), (INF, 0x7), (-INF, 0xF), (0.5, 0x1), (-3.0, 0xD),
    ]
    x = fp32([v for v, _ in cases])
    got = F.e2m1_encode(x)
    assert got.dtype == torch.uint8
    assert got.tolist() == [c for _, c in cases]
    assert [oracle_e2m1(v) for v, _ in cases] == [c for _, c in cases]
    # NaN of either sign -> 0x7
    nans = torch.stack([fp32(NAN), -fp32(NAN)])
    assert torch.signbit(nans).tolist() == [False, True]
    assert F.e2m1_encode(nans).tolist() == [0x7, 0x7]
    # bf16 and fp16 inputs widen exactly, so their codes are those of the fp32 values
    vals = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.0, 7.0, -2.75]
    for dt in (torch.bfloat16, torch.float16):
        x = torch.tensor(vals, dtype=dt)
        assert F.e2m1_encode(x).tolist() == [oracle_e2m1(v) for v in x.float().tolist()]


# Hand table of spec section 1: at each rounding threshold t, the code of t, of the next fp32
# above t and of the next fp32 below t.
THRESHOLDS = {
    #      t: (at t, above, below)
    0.25: (0, 1, 0),   # tie 0 / 0.5 -> 0 (even)
    0.75: (2, 2, 1),   # tie 0.5 / 1 -> 1.0 (code 2, even)
    1.25: (2, 3, 2),   # tie 1 / 1.5 -> 1.0
    1.75: (4, 4, 3),   # tie 1.5 / 2 -> 2.0
    2.5: (4, 5, 4),    # tie 2 / 3 -> 2.0
    3.5: (6, 6, 5),    # tie 3 / 4 -> 4.0
    5.0: (6, 7, 6),    # tie 4 / 6 -> 4.0
}


def test_e2m1_encode_thresholds_and_neighbours():
    for t, (at, above, below) in THRESHOLDS.items():
        tt = fp32([t, -t])
        up = torch.nextafter(tt, fp32([INF, -INF]))   # away from zero
        down = torch.nextafter(tt, fp32([0.0, 0.0]))  # toward zero
        assert F.e2m1_encode(tt).tolist() == [at, at | 8], t
        assert F.e2m1_encode(up).tolist() == [above, above | 8], t
        assert F.e2m1_encode(down).tolist() == [below, below | 8], t
    # and the brute-force oracle agrees on all of them plus the grid points themselves
    pts = neighbours(list(THRESHOLDS) + list(LUT) + [-v for v in THRESHOLDS] + [-v for v in LUT])
    assert F.e2m1_encode(fp32(pts)).tolist() == [oracle_e2m1(v) for v in pts]


f32_any = st.floats(width=32, allow_nan=True, allow_infinity=True)
f32_small = st.floats(min_value=-8, max_value=8, width=32)


@SETTINGS
@given(st.lists(st.one_of(f32_any, f32_small), min_size=1, max_size=64))
def test_e2m1_encode_matches_bruteforce(values):
    x = fp32(values)
    assert F.e2m1_encode(x).tolist() == [oracle_e2m1(v) for v in x.tolist()]


def test_e2m1_decode_all_codes():
    got = F.e2m1_decode(torch.arange(16, dtype=torch.uint8))
    expected = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
    assert got.dtype == torch.float32
    assert got.tolist() == expected
    assert torch.signbit(got).tolist() == [False] * 8 + [True] * 8  # code 8 is -0.0
    # decode(encode(v)) == v on the 16 grid values
    assert F.e2m1_encode(got).tolist() == list(range(16))


def test_pack_hand_example():
    codes = torch.tensor([[0x1, 0x2, 0xF, 0x3, 0x0, 0x8],
                          [0x7, 0x0, 0x0, 0x7, 0xA, 0x5]], dtype=torch.uint8)
    # byte i = code[2i] | code[2i+1] << 4 (even element in the low nibble)
    expected = [[0x21, 0x3F, 0x80], [0x07, 0x70, 0x5A]]
    packed = F.pack_e2m1(codes)
    assert packed.dtype == torch.uint8
    assert packed.tolist() == expected
    assert F.unpack_e2m1(packed).tolist() == codes.tolist()
    # the float4_e2m1fn_x2 view of the same bytes unpacks identically
    assert F.unpack_e2m1(packed.view(torch.float4_e2m1fn_x2)).tolist() == codes.tolist()


@SETTINGS
@given(st.lists(st.integers(1, 5), min_size=0, max_size=2), st.integers(1, 40),
       st.integers(0, 2 ** 31 - 1))
def test_pack_unpack_round_trip(batch, half_k, seed):
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (*batch, 2 * half_k), dtype=torch.uint8, generator=g)
    packed = F.pack_e2m1(codes)
    assert packed.shape == (*batch, half_k)
    lo, hi = codes[..., 0::2], codes[..., 1::2]
    assert torch.equal(packed, lo + 16 * hi)
    assert torch.equal(F.unpack_e2m1(packed), codes)
    assert torch.equal(F.unpack_e2m1(packed.view(torch.float4_e2m1fn_x2)), codes)


# ---------------------------------------------------------------------------------------------
# e4m3
# ---------------------------------------------------------------------------------------------
def e4m3_from_fields(b: int) -> float:
    """e4m3fn by its definition: 1 sign, 4 exponent (bias 7), 3 mantissa bits; S.1111.111 NaN."""
    s, e, m = b >> 7, (b >> 3) & 0xF, b & 7
    if e == 0xF and m == 7:
        return NAN
    mag = 2.0 ** -6 * (m / 8) if e == 0 else 2.0 ** (e - 7) * (1 + m / 8)
    return -mag if s else mag


def test_e4m3_decode_table_matches_bit_fields():
    for b in range(256):
        want, got = e4m3_from_fields(b), E4M3_ALL[b]
        if math.isnan(want):
            assert math.isnan(got), b
        else:
            assert got == want and is_neg(got) == is_neg(want), b
    # e4m3_to_float decodes the same way, from uint8 and from float8 views
    raw = torch.arange(256, dtype=torch.uint8)
    for t in (raw, raw.view(torch.float8_e4m3fn)):
        out = F.e4m3_to_float(t)
        assert out.dtype == torch.float32
        ok = [(math.isnan(a) and math.isnan(b)) or a == b for a, b in zip(out.tolist(), E4M3_ALL)]
        assert all(ok)


def test_e4m3_exhaustive_grid_and_midpoints():
    pos = E4M3_POS
    mids = [(a + b) / 2 for a, b in zip(pos[:-1], pos[1:])]  # exact in fp32
    pts = neighbours(pos + mids + [464.0, 480.0, 500.0])
    pts = pts + [-p for p in pts]
    got = F.e4m3_rn_satfinite(fp32(pts))
    assert got.dtype == torch.uint8
    assert got.tolist() == [oracle_e4m3(p) for p in pts]
    # every finite value maps to its own byte (sign kept on zero)
    allv = fp32([v for b, v in enumerate(E4M3_ALL) if b not in (0x7F, 0xFF)])
    assert F.e4m3_rn_satfinite(allv).tolist() == [b for b in range(256) if b not in (0x7F, 0xFF)]


def test_e4m3_saturation_and_nan():
    cases = {448.0: 0x7E, 449.0: 0x7E, 464.0: 0x7E, 480.0: 0x7E, 1e9: 0x7E, 3.4e38: 0x7E,
             INF: 0x7E, -448.0: 0xFE, -500.0: 0xFE, -INF: 0xFE, 416.0: 0x7D, 432.0: 0x7E,
             431.0: 0x7D, 240.0: 0x77, 1.0: 0x38}
    assert F.e4m3_rn_satfinite(fp32(list(cases))).tolist() == list(cases.values())
    nans = torch.stack([fp32(NAN), -fp32(NAN)])
    assert F.e4m3_rn_satfinite(nans).tolist() == [0x7F, 0x7F]


def test_e4m3_subnormals():
    u = 2.0 ** -9  # smallest subnormal, byte 0x01
    cases = {
        u: 0x01,
        u / 2: 0x00,                 # tie 0 / 2^-9 -> 0 (even)
        bits_f32(f32_bits(u / 2) + 1): 0x01,   # just above the tie
        1.5 * u: 0x02,               # tie 1 / 2 (x 2^-9) -> 2 (even)
        2.5 * u: 0x02,               # tie 2 / 3 -> 2
        3.5 * u: 0x04,               # tie 3 / 4 -> 4
        7 * u: 0x07,                 # largest subnormal
        7.5 * u: 0x08,               # tie 7*2^-9 / 2^-6 -> 2^-6 (mantissa 0, even)
        2.0 ** -6: 0x08,             # smallest normal
        -(u / 2): 0x80,              # negative tie -> -0
        -1.5 * u: 0x82,
        2.0 ** -12: 0x00,
    }
    assert F.e4m3_rn_satfinite(fp32(list(cases))).tolist() == list(cases.values())
    assert [oracle_e4m3(v) for v in cases] == list(cases.values())


@SETTINGS
@given(st.lists(st.one_of(f32_any, st.floats(-500, 500, width=32),
                          st.floats(-2.0 ** -5, 2.0 ** -5, width=32)), min_size=1, max_size=64))
def test_e4m3_matches_bruteforce(values):
    x = fp32(values)
    assert F.e4m3_rn_satfinite(x).tolist() == [oracle_e4m3(v) for v in x.tolist()]


# ---------------------------------------------------------------------------------------------
# UE8M0
# ---------------------------------------------------------------------------------------------
def test_ue8m0_ceil_spec_cases():
    p127 = bits_f32(0x00400000)  # 2^-127 (fp32 subnormal)
    assert p127 == 2.0 ** -127
    cases = [
        (0.0, 0),
        (2.0 ** -149, 0),
        (p127, 0),                                   # v <= 2^-127 -> 0
        (bits_f32(0x00400001), 1),                   # just above 2^-127 -> 1
        (bits_f32(0x007FFFFF), 1),                   # largest subnormal -> 1
        (2.0 ** -126, 1),                            # exact power: exponent 1
        (bits_f32(0x00800001), 2),                   # just above 2^-126
        (0.5, 126), (1.0, 127), (2.0, 128), (2.0 ** 100, 227),
        (bits_f32(0x3F800001), 128),                 # just above 1
        (1.5, 128), (bits_f32(0x3FFFFFFF), 128),     # just below 2 -> 2
        (bits_f32(0x40000001), 129),                 # just above 2
        (2.0 ** 126, 253),
        (bits_f32(0x7E800001), 254),                 # just above 2^126
        (2.0 ** 127, 254),
        (bits_f32(0x7F000001), 254),                 # above 2^127: saturates
        (bits_f32(0x7F7FFFFF), 254),                 # FLT_MAX
        (INF, 254),
        (NAN, 255),
    ]
    x = fp32([v for v, _ in cases])
    got = F.ue8m0_ceil(x)
    assert got.dtype == torch.uint8
    assert got.tolist() == [e for _, e in cases]
    assert [oracle_ue8m0(v) for v in x.tolist()] == [e for _, e in cases]


@SETTINGS
@given(st.lists(st.one_of(st.floats(min_value=0, width=32, allow_nan=False, allow_infinity=True),
                          st.floats(min_value=0, max_value=2.0 ** -120, width=32),
                          st.just(NAN)), min_size=1, max_size=64))
def test_ue8m0_ceil_matches_frexp(values):
    x = fp32(values)
    expected = [oracle_ue8m0(v) for v in x.tolist()]
    assert F.ue8m0_ceil(x).tolist() == expected
    # second, coarser oracle for normal finite values: ceil(log2(v)) in Python floats
    for v, e in zip(x.tolist(), expected):
        if 2.0 ** -126 <= v < INF and v <= 2.0 ** 127:
            assert e == math.ceil(math.log2(v)) + 127


def test_ue8m0_to_float():
    e = torch.tensor([0, 1, 127, 128, 200, 254, 255], dtype=torch.uint8)
    want = [2.0 ** -127, 2.0 ** -126, 1.0, 2.0, 2.0 ** 73, 2.0 ** 127]
    for t in (e, e.view(torch.float8_e8m0fnu)):
        out = F.ue8m0_to_float(t)
        assert out.dtype == torch.float32
        assert out[:-1].tolist() == want
        assert math.isnan(out[-1].item())
    # agrees with torch's own float8_e8m0fnu decoding on every byte
    allb = torch.arange(256, dtype=torch.uint8)
    ours = F.ue8m0_to_float(allb)
    theirs = allb.view(torch.float8_e8m0fnu).float()
    assert torch.equal(ours[:255], theirs[:255])
    assert ours[:255].tolist() == [2.0 ** (k - 127) for k in range(255)]


def test_r6_constant():
    r6 = F.r6()
    assert r6.dtype == torch.float32
    assert f32_bits(r6.item()) == 0x3E2AAAAB
    # 0x3E2AAAAB is the correctly rounded 1/6: within half an ulp (2^-26 at [1/8, 1/4))
    assert abs(Fraction(r6.item()) - Fraction(1, 6)) < Fraction(1, 2 ** 27)


# ---------------------------------------------------------------------------------------------
# Layouts
# ---------------------------------------------------------------------------------------------
LAYOUTS = ("128x4", "8x4", "linear")


def test_padded_and_scale_shape_hand_cases():
    assert F.padded_scale_shape(1, 1, "128x4") == (128, 4)
    assert F.padded_scale_shape(1, 1, "8x4") == (8, 4)
    assert F.padded_scale_shape(1, 1, "linear") == (1, 1)
    assert F.padded_scale_shape(128, 4, "128x4") == (128, 4)
    assert F.padded_scale_shape(129, 5, "128x4") == (256, 8)
    assert F.padded_scale_shape(9, 4, "8x4") == (16, 4)
    assert F.padded_scale_shape(300, 7, "linear") == (300, 7)
    assert F.padded_scale_shape(3, 9, F.SfLayout.LAYOUT_8x4) == (8, 12)
    # scale_shape of unpacked data shapes [*batch, M, K]
    assert F.scale_shape((1, 16), 16, "128x4") == (128, 4)
    assert F.scale_shape((1, 16), 16, "8x4") == (8, 4)
    assert F.scale_shape((1, 16), 16, "linear") == (1, 1)
    assert F.scale_shape((5, 64), 32, "linear") == (5, 2)
    assert F.scale_shape((3, 1, 32), 32, "8x4") == (3, 8, 4)
    assert F.scale_shape((2, 300, 256), 16, "128x4") == (2, 384, 16)
    assert F.scale_shape(torch.Size([200, 96]), 32, "128x4") == (256, 4)


def test_swizzle_hand_example():
    # M = 33, Kb = 5 in 128x4: Mp = 128, Kp = 8. (32, 4) -> ((0*2 + 1)*512 + 0*16 + 1*4 + 0) = 516;
    # (1, 2) -> 0*512 + 1*16 + 0 + 2 = 18; (0, 0) -> 0.
    sf = torch.zeros(33, 5, dtype=torch.uint8)
    sf[32, 4], sf[1, 2], sf[0, 0] = 7, 9, 11
    out = F.swizzle(sf, "128x4")
    assert out.shape == (128, 8)
    flat = out.reshape(-1)
    assert flat[516].item() == 7 and flat[18].item() == 9 and flat[0].item() == 11
    assert int((flat != 0).sum()) == 3
    # 8x4, M = 9, Kb = 5: Mp = 16, Kp = 8. (8, 4) -> 1*2*32 + 1*32 + 0 + 0 = 96;
    # (1, 2) -> 0 + 0 + 4 + 2 = 6
    sf2 = torch.zeros(9, 5, dtype=torch.uint8)
    sf2[8, 4], sf2[1, 2] = 5, 6
    out = F.swizzle(sf2, "8x4")
    assert out.shape == (16, 8)
    flat = out.reshape(-1)
    assert flat[96].item() == 5 and flat[6].item() == 6 and int((flat != 0).sum()) == 2


def _random_scales(batch, rows, kb, seed, dtype):
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(1, 256, (*batch, rows, kb), dtype=torch.uint8, generator=g)
    return raw.view(dtype)


shape_args = (st.lists(st.integers(1, 3), min_size=0, max_size=1), st.integers(1, 300),
              st.integers(1, 20), st.integers(0, 2 ** 31 - 1))


@settings(max_examples=60, deadline=None)
@given(*shape_args, st.sampled_from(LAYOUTS),
       st.sampled_from([torch.uint8, torch.float8_e4m3fn, torch.float8_e8m0fnu]))
def test_swizzle_bytes_at_spec_offsets(batch, rows, kb, seed, layout, dtype):
    sf = _random_scales(batch, rows, kb, seed, dtype)  # bytes 1..255: nonzero, padding detectable
    out = F.swizzle(sf, layout)
    mp, kp = spec_padded(rows, kb, layout)
    assert out.shape == (*batch, mp, kp)
    assert out.dtype == dtype
    m = torch.arange(rows).view(-1, 1)
    k = torch.arange(kb).view(1, -1)
    off = spec_offset(m, k, kp, layout)  # [rows, kb]
    assert off.unique().numel() == rows * kb  # a bijection onto its image
    flat = out.contiguous().view(torch.uint8).reshape(*batch, mp * kp)
    src = sf.view(torch.uint8)
    assert torch.equal(flat[..., off], src)
    # every other byte is padding and is zero
    written = torch.zeros(mp * kp, dtype=torch.bool)
    written[off.reshape(-1)] = True
    assert int((flat[..., ~written] != 0).sum()) == 0
    nb = 1 if not batch else batch[0]
    assert int((flat != 0).sum()) == nb * rows * kb


@settings(max_examples=60, deadline=None)
@given(*shape_args, st.sampled_from(LAYOUTS))
def test_swizzle_unswizzle_round_trip(batch, rows, kb, seed, layout):
    sf = _random_scales(batch, rows, kb, seed, torch.float8_e4m3fn)
    back = F.unswizzle(F.swizzle(sf, layout), rows, kb, layout)
    assert back.dtype == sf.dtype
    assert back.shape == sf.shape
    assert torch.equal(back.view(torch.uint8), sf.view(torch.uint8))
    # uint8 input round-trips too
    raw = sf.view(torch.uint8)
    assert torch.equal(F.unswizzle(F.swizzle(raw, layout), rows, kb, layout), raw)
