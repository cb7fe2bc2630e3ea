"""CPU tests of the reference quantize / dequantize ops through the public functions.

Expected bytes come from hand computation (comments) and from an oracle written in this file that
follows spec sections 2-4 step by step in float64 with one explicit fp32 rounding per step
(a product or quotient of fp32 numbers rounded once from float64 is the correctly rounded fp32
result), brute-force nearest-value encoders for E2M1 and e4m3, frexp for UE8M0 and the spec's
closed-form layout offsets. Nothing here calls torch_fp4.formats.
"""
from __future__ import annotations

import struct

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import torch_fp4

REF = "reference"
F64 = torch.float64
INF = float("inf")
NAN = float("nan")
FLT_MAX = struct.unpack("<f", struct.pack("<I", 0x7F7FFFFF))[0]
R6 = struct.unpack("<f", struct.pack("<I", 0x3E2AAAAB))[0]  # RN(1/6)
LAYOUTS = ("128x4", "8x4", "linear")


def f32_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def fp32(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def rn32(t: torch.Tensor) -> torch.Tensor:
    """Round a float64 tensor to fp32 (RN-even) and hold the result in float64 again."""
    return t.to(torch.float32).to(F64)


def f32(x: float) -> float:
    return torch.tensor(x, dtype=F64).float().item()


# ---------------------------------------------------------------------------------------------
# Oracle (spec sections 1-4), vectorized, float64 holding fp32 values
# ---------------------------------------------------------------------------------------------
LUT64 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=F64)
SIGNED_LUT64 = torch.cat([LUT64, -LUT64])  # code 8 is -0.0
E4M3_ALL64 = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).to(F64)
E4M3_POS64 = E4M3_ALL64[:0x7F]
UE8M0_ALL64 = torch.tensor([2.0 ** (e - 127) for e in range(255)] + [NAN], dtype=F64)


def _nearest_even(m: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    """Index of the nearest grid value to each m (grid increasing), ties to the even index.
    Distances are exact in float64 wherever two candidates can tie."""
    d = (m.unsqueeze(-1) - grid).abs()
    tied = d == d.min(-1, keepdim=True).values
    even = torch.arange(grid.numel()) % 2 == 0
    tied_even = tied & even
    return torch.where(tied_even.any(-1), tied_even.int().argmax(-1), tied.int().argmax(-1))


def oracle_e2m1(y: torch.Tensor) -> torch.Tensor:
    """fp32 values (as float64) -> codes (int64)."""
    m = y.abs()
    idx = torch.where(m > 6, torch.full_like(m, 7, dtype=torch.long), _nearest_even(m, LUT64))
    code = idx | (torch.signbit(y).long() << 3)
    return torch.where(torch.isnan(y), torch.full_like(code, 7), code)


def oracle_e4m3(s: torch.Tensor) -> torch.Tensor:
    """fp32 values (as float64) -> e4m3 satfinite bytes (int64)."""
    m = s.abs()
    idx = torch.where(m > 448, torch.full_like(m, 0x7E, dtype=torch.long),
                      _nearest_even(m, E4M3_POS64))
    b = idx | (torch.signbit(s).long() << 7)
    return torch.where(torch.isnan(s), torch.full_like(b, 0x7F), b)


def oracle_ue8m0(v: torch.Tensor) -> torch.Tensor:
    """Non-negative fp32 values (as float64) -> UE8M0 ceil bytes (int64)."""
    finite = torch.where(torch.isfinite(v), v, torch.ones_like(v))
    mant, ex = torch.frexp(finite)  # v = mant * 2^ex, mant in [0.5, 1)
    k = ex.long() - (mant == 0.5).long()  # ceil(log2 v)
    e = (k + 127).clamp(0, 254)
    e = torch.where(v == 0, torch.zeros_like(e), e)
    e = torch.where(torch.isinf(v), torch.full_like(e, 254), e)
    return torch.where(torch.isnan(v), torch.full_like(e, 255), e)


def _amax(blocks: torch.Tensor) -> torch.Tensor:
    amax = blocks.abs().max(-1).values
    return torch.where(torch.isnan(blocks).any(-1), torch.full_like(amax, NAN), amax)


def oracle_nvfp4(x: torch.Tensor, gs) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., M, K], gs a float or a float64 tensor broadcastable to [..., M, Kb]
    -> (scale bytes [..., M, Kb] int64, codes [..., M, K] int64)."""
    xb = x.to(F64).reshape(*x.shape[:-1], x.shape[-1] // 16, 16)
    gs = torch.as_tensor(gs, dtype=F64)
    t = rn32(_amax(xb) * R6)                            # RN(amax * R6)
    big_s = rn32(gs * t)                                # S = RN(gs * t)
    s8 = oracle_e4m3(big_s)
    sf = E4M3_ALL64[s8]
    rgs = rn32(1.0 / gs)                                # RN(1/gs)
    o = torch.where(sf == 0, torch.zeros_like(sf), rn32(1.0 / rn32(sf * rgs)))
    codes = oracle_e2m1(rn32(xb * o.unsqueeze(-1)))     # e2m1(RN(x * o))
    return s8, codes.reshape(x.shape)


def oracle_mxfp4(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    xb = x.to(F64).reshape(*x.shape[:-1], x.shape[-1] // 32, 32)
    amax = _amax(xb)
    e = oracle_ue8m0(rn32(amax * R6))
    o = torch.where(e == 0, torch.ones_like(amax), torch.exp2(127.0 - e.to(F64)))
    o = torch.where(amax == 0, torch.zeros_like(o), o)
    # the largest magnitude whose product with 2^(e-127) stays finite in fp32 (2^128 is not)
    limit = torch.full_like(amax, float("inf"))
    limit[e == 253] = 3.0
    limit[e == 254] = 1.5
    limit = limit.unsqueeze(-1)
    codes = oracle_e2m1(torch.clamp(rn32(xb * o.unsqueeze(-1)), -limit, limit))
    return e, codes.reshape(x.shape)


def oracle_dequant(codes: torch.Tensor, sbytes: torch.Tensor, block: int, gs=None) -> torch.Tensor:
    """Spec 2/3: RN(LUT(q) * scale [* RN(1/gs)]) in fp32 (returned as float64)."""
    vals = SIGNED_LUT64[codes].reshape(*codes.shape[:-1], codes.shape[-1] // block, block)
    sf = (E4M3_ALL64 if block == 16 else UE8M0_ALL64)[sbytes].unsqueeze(-1)
    out = rn32(vals * sf)
    if gs is not None:
        gs = torch.as_tensor(gs, dtype=F64)
        if gs.dim() == 1 and gs.numel() > 1:
            gs = gs.view(-1, 1, 1)
        out = rn32(out * rn32(1.0 / gs).unsqueeze(-1))
    return out.reshape(codes.shape)


def unpack(data: torch.Tensor) -> torch.Tensor:
    raw = data.view(torch.uint8).long()
    return torch.stack((raw & 0xF, raw >> 4), dim=-1).reshape(*raw.shape[:-1], raw.shape[-1] * 2)


def spec_unswizzle(scale: torch.Tensor, rows: int, kb: int, layout: str) -> torch.Tensor:
    """[*batch, Mp, Kp] bytes in `layout` -> [*batch, rows, kb] int64, by the spec's offsets."""
    raw = scale.contiguous().view(torch.uint8).long()
    if layout == "linear":
        assert raw.shape[-2:] == (rows, kb)
        return raw
    mp, kp = raw.shape[-2:]
    tile = 128 if layout == "128x4" else 8
    assert (mp, kp) == (-(-rows // tile) * tile, -(-kb // 4) * 4)
    m = torch.arange(rows).view(-1, 1)
    k = torch.arange(kb).view(1, -1)
    if layout == "128x4":
        off = ((m // 128) * (kp // 4) + k // 4) * 512 + (m % 32) * 16 + ((m % 128) // 32) * 4 + k % 4
    else:
        off = (m // 8) * (kp // 4) * 32 + (k // 4) * 32 + (m % 8) * 4 + k % 4
    flat = raw.reshape(*raw.shape[:-2], mp * kp)
    # padding must be zero
    mask = torch.ones(mp * kp, dtype=torch.bool)
    mask[off.reshape(-1)] = False
    assert int((flat[..., mask] != 0).sum()) == 0
    return flat[..., off]


def nv(x, gs, layout="linear"):
    return torch_fp4.nvfp4_quantize(x, gs, sf_layout=layout, backend=REF)


def mx(x, layout="linear"):
    return torch_fp4.mxfp4_quantize(x, sf_layout=layout, backend=REF)


def deq(data, scale, gs, block, layout="linear", out_dtype=torch.float32):
    return torch_fp4.fp4_dequantize(data, scale, gs, block_size=block, sf_layout=layout,
                                    out_dtype=out_dtype, backend=REF)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise-equal values, NaN == NaN, sign of zero compared."""
    a, b = a.double(), b.double()
    both_nan = torch.isnan(a) & torch.isnan(b)
    eq = (a == b) & (torch.signbit(a) == torch.signbit(b))
    return bool((both_nan | eq).all())


def check_nvfp4_block(xs, gs: float, s8: int, data_bytes: list[int], layout="linear"):
    """Quantize one [1, 16] block; compare with the hand-computed bytes and with the oracle."""
    x = fp32(xs).view(1, 16)
    g = fp32([gs])
    data, scale = nv(x, g, layout)
    assert data.dtype == torch.float4_e2m1fn_x2 and data.shape == (1, 8)
    assert scale.dtype == torch.float8_e4m3fn
    assert spec_unswizzle(scale, 1, 1, layout).item() == s8
    assert data.view(torch.uint8).view(-1).tolist() == data_bytes
    o_s8, o_codes = oracle_nvfp4(x, g.item())
    assert o_s8.item() == s8
    assert torch.equal(unpack(data), o_codes)
    out = deq(data, scale, g, 16, layout)
    assert out.dtype == torch.float32
    assert same(out, oracle_dequant(o_codes, o_s8, 16, g.item()))
    return out


def pack_codes(codes: list[int]) -> list[int]:
    return [codes[i] | codes[i + 1] << 4 for i in range(0, len(codes), 2)]


# ---------------------------------------------------------------------------------------------
# NVFP4 hand-computed blocks
# ---------------------------------------------------------------------------------------------
def test_nvfp4_identity_block():
    # gs = 1, amax = 6: RN(6 * R6) = RN(1 + 2^-25) = 1 (6 * 0x3E2AAAAB = 2^26 + 2 in units of
    # 2^-26), S = 1.0 -> e4m3 0x38, o = 1: the 16 grid values encode to codes 0..15.
    xs = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
    for layout in LAYOUTS:
        out = check_nvfp4_block(xs, 1.0, 0x38, [0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE],
                                layout)
        assert same(out, fp32(xs).view(1, 16))


def test_nvfp4_nontrivial_global_scale_block():
    # gs = RN(2688 / 10) = 268.79998779296875 (0x43866666); t = RN(10 * R6) = 1.6666667461395264
    # (0x3FD55556); S = RN(gs * t) = 448.0 exactly -> 0x7E (not saturated);
    # RN(1/gs) = 0x3B73CF3E; RN(448 * RN(1/gs)) = 0x3FD55556; o = RN(1/that) = 0x3F199999
    # = 0.59999996. Then y = RN(x * o) is just below the "exact" x * 0.6, e.g.
    # -1.25 -> -0.74999994 (< 0.75: rounds to 0.5, code 0x9, not to 1.0),
    # 2.5 -> 1.4999999 (code 3), -7.5 -> -4.4999995 (code 0xE), 8.75 -> 5.2499995 (code 7).
    xs = [10, -7.5, 5, 3.3, 2.5, -1.25, 1, 0.7, 0.3, 0.1, -0.0, 0, 8.75, -6.25, 4.375, 1.875]
    codes = [7, 0xE, 5, 4, 3, 9, 1, 1, 0, 0, 8, 0, 7, 0xE, 5, 2]
    gs = f32(2688 / 10)
    assert f32_bits(gs) == 0x43866666
    assert f32_bits(torch_fp4.compute_global_scale(fp32(xs).view(1, 16), backend=REF).item()) \
        == 0x43866666
    out = check_nvfp4_block(xs, gs, 0x7E, pack_codes(codes))
    # dequantized: LUT * 448 * RN(1/gs), e.g. code 7 -> RN(2688 * 0x3B73CF3E) ~ 10
    assert out[0, 0].item() == f32(2688 * struct.unpack("<f", struct.pack("<I", 0x3B73CF3E))[0])
    assert abs(out[0, 0].item() - 10) < 1e-5


@pytest.mark.parametrize("gs", [1.0, 268.79998779296875])
def test_nvfp4_zero_block(gs):
    # amax = 0 -> S = 0 -> s8 = 0, o = 0; RN(x * 0) keeps the sign: -0.0 -> code 8.
    xs = [0.0] * 16
    xs[3] = -0.0
    out = check_nvfp4_block(xs, gs, 0x00, [0x00, 0x80] + [0x00] * 6)
    assert out.abs().max().item() == 0


@pytest.mark.parametrize("gs,scale", [(1.0, 1e-3), (268.79998779296875, 1e-6)])
def test_nvfp4_tiny_block(gs, scale):
    # gs = 1, amax = 1e-3: S ~ 1.67e-4 < 2^-10 (half the smallest e4m3 subnormal) -> s8 = 0,
    # o = 0, every element -> +-0 (code 0 / 8). gs = 268.8, amax = 1e-6: S ~ 4.5e-5, same.
    signs = [1, -1] * 8
    xs = [s * scale * (i + 1) / 16 for i, s in enumerate(signs)]
    out = check_nvfp4_block(xs, gs, 0x00, [0x80] * 8)
    assert out.abs().max().item() == 0


def test_nvfp4_subnormal_block_scale():
    # gs = 1, amax = 9 * 2^-8: 9 * 0x3E2AAAAB = 100663299 * 2^-26 -> RN to 24 bits = 1.5 ->
    # t = 1.5 * 2^-8 = 3 * 2^-9 = S: the e4m3 subnormal 0x03 (kept; clamping to 2^-6 would give
    # 0x08). o = RN(512/3) = 170.66667175. 9*2^-8 -> 6 (code 7), 3*2^-8 -> 2 (code 4),
    # 0.75*2^-8 -> 0.5 (code 1), -4.5*2^-8 -> -3 (code 0xD), 2^-8 -> 0.6667 -> 0.5 (code 1).
    u = 2.0 ** -8
    xs = [9 * u, 3 * u, 0.75 * u, -4.5 * u, u, 0.0, -9 * u, 6 * u] + [0.0] * 8
    codes = [7, 4, 1, 0xD, 1, 0, 0xF, 6] + [0] * 8
    out = check_nvfp4_block(xs, 1.0, 0x03, pack_codes(codes))
    # dequantized exactly on the subnormal-scale grid: LUT * 3 * 2^-9
    assert out[0, :8].tolist() == [v * 3 * 2.0 ** -9 for v in (6, 2, 0.5, -3, 0.5, 0, -6, 4)]


def test_nvfp4_saturated_block_scale():
    # gs = 1, amax = 6000: S = RN(RN(6000 * R6)) ~ 1000 > 448 -> 448 (0x7E); o = RN(1/448).
    # 6000 -> 13.4 -> 6 (code 7), 1000 -> 2.23 -> 2 (code 4), 500 -> 1.12 -> 1 (code 2),
    # -6000 -> code 0xF, 2688 -> 6 (code 7), 1 -> 0.0022 -> 0.
    xs = [6000, 1000, 500, -6000, 2688, 1, 0, 0] + [0] * 8
    codes = [7, 4, 2, 0xF, 7, 0, 0, 0] + [0] * 8
    out = check_nvfp4_block(xs, 1.0, 0x7E, pack_codes(codes))
    assert out[0, :5].tolist() == [2688.0, 896.0, 448.0, -2688.0, 2688.0]


def test_nvfp4_inf_element():
    # amax = Inf -> S = Inf -> 448 (0x7E); o = RN(1/448) finite; +-Inf -> +-6 (codes 7 / 0xF),
    # 448 -> RN(448 * RN(1/448)) ~ 1 -> code 2, 1 -> 0. Dequantizes to +-2688, not Inf.
    xs = [INF, -INF, 448, 1, 2688, 0, 0, 0] + [0] * 8
    for gs in (1.0, 268.79998779296875):
        _, o_codes = oracle_nvfp4(fp32(xs).view(1, 16), gs)
        out = check_nvfp4_block(xs, gs, 0x7E, pack_codes(o_codes.view(-1).tolist()))
        assert torch.isfinite(out).all()
    out = check_nvfp4_block(xs, 1.0, 0x7E, pack_codes([7, 0xF, 2, 0, 7, 0, 0, 0] + [0] * 8))
    assert out[0, :2].tolist() == [2688.0, -2688.0]


def test_nvfp4_nan_element():
    # amax = NaN -> S = NaN -> 0x7F; o = NaN; every RN(x * o) is NaN -> code 0x7 (sign ignored),
    # and the block dequantizes to NaN. A second, finite block is unaffected.
    xs = [1.0, NAN, -2.0, INF, -0.0] + [0.5] * 11
    x = torch.cat([fp32(xs), fp32([6.0] + [0.0] * 15)]).view(1, 32)
    data, scale = nv(x, fp32([1.0]))
    assert scale.view(torch.uint8).view(-1).tolist() == [0x7F, 0x38]
    assert data.view(torch.uint8).view(-1).tolist() == [0x77] * 8 + [0x07] + [0x00] * 7
    for out_dtype in (torch.float32, torch.bfloat16, torch.float16):
        out = deq(data, scale, fp32([1.0]), 16, out_dtype=out_dtype)
        assert torch.isnan(out[0, :16]).all()
        assert out[0, 16].item() == 6.0 and (out[0, 17:] == 0).all()
    s8, codes = oracle_nvfp4(x, 1.0)
    assert s8.view(-1).tolist() == [0x7F, 0x38] and torch.equal(unpack(data), codes)


def test_nvfp4_rne_ties():
    # gs = 1, amax = 12: t = RN(12 * R6) = 2, S = 2 -> 0x40, o = RN(1/2) = 0.5. The elements hit
    # every E2M1 tie exactly: y = 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5 -> 0, 1, 1, 2, 2, 4, 4
    # (even codes 0, 2, 2, 4, 4, 6, 6), and their negatives.
    xs = [12, 0.5, 1.5, 2.5, 3.5, 5, 7, 10, -0.5, -1.5, -2.5, -3.5, -5, -7, -10, 0]
    codes = [7, 0, 2, 2, 4, 4, 6, 6, 8, 0xA, 0xA, 0xC, 0xC, 0xE, 0xE, 0]
    assert pack_codes(codes) == [0x07, 0x22, 0x44, 0x66, 0xA8, 0xCA, 0xEC, 0x0E]
    out = check_nvfp4_block(xs, 1.0, 0x40, pack_codes(codes))
    assert out[0].tolist() == [12, 0, 2, 2, 4, 4, 8, 8, -0.0, -2, -2, -4, -4, -8, -8, 0]


# ---------------------------------------------------------------------------------------------
# MXFP4 hand-computed blocks
# ---------------------------------------------------------------------------------------------
def check_mxfp4_block(xs, e: int, codes: list[int] | None, layout="linear"):
    x = fp32(xs).view(1, 32)
    data, scale = mx(x, layout)
    assert data.dtype == torch.float4_e2m1fn_x2 and data.shape == (1, 16)
    assert scale.dtype == torch.float8_e8m0fnu
    assert spec_unswizzle(scale, 1, 1, layout).item() == e
    o_e, o_codes = oracle_mxfp4(x)
    assert o_e.item() == e
    if codes is not None:
        assert unpack(data).view(-1).tolist() == codes
    assert torch.equal(unpack(data), o_codes)
    out = deq(data, scale, None, 32, layout)
    assert same(out, oracle_dequant(o_codes, o_e, 32))
    return out


def test_mxfp4_zero_block():
    xs = [0.0] * 32
    xs[5] = -0.0
    codes = [0] * 32
    codes[5] = 8
    for layout in LAYOUTS:
        out = check_mxfp4_block(xs, 0, codes, layout)
        assert (out == 0).all()


def test_mxfp4_power_of_two_vs_just_above():
    grid = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    xs = grid + [-v for v in grid] + grid + [-v for v in grid]
    # amax = 6: v = RN(6 * R6) = 1 exactly -> e = 127, o = 1: codes are the identity.
    out = check_mxfp4_block(xs, 127, list(range(16)) * 2)
    assert same(out, fp32(xs).view(1, 32))
    # amax = 6 * 2^-20: same with e = 107
    out = check_mxfp4_block([v * 2.0 ** -20 for v in xs], 107, list(range(16)) * 2)
    assert same(out, fp32([v * 2.0 ** -20 for v in xs]).view(1, 32))
    # amax = next fp32 above 6 (6 + 2^-21): v = RN(1 + 0.9167 * 2^-23) = 1 + 2^-23, mantissa != 0
    # -> e = 128, o = 0.5: 6+ -> 3.0000002 -> code 5 (3), 4 -> 2 (code 4), 3 -> 1.5 (code 3),
    # 1.5 -> 0.75 tie -> 1 (code 2), 0.5 -> 0.25 tie -> 0 (code 0).
    above6 = torch.nextafter(fp32(6.0), fp32(INF)).item()
    ys = [above6, 4.0, 3.0, 1.5, 0.5, -1.5, -0.5, 1.0] + [0.0] * 24
    out = check_mxfp4_block(ys, 128, [5, 4, 3, 2, 0, 0xA, 8, 1] + [0] * 24)
    assert out[0, :8].tolist() == [6.0, 4.0, 3.0, 2.0, 0.0, -2.0, -0.0, 1.0]
    # amax = next fp32 below 6: v = RN(1 - 0.4167 * 2^-23) = 1 - 2^-24 -> exponent 126 + 1 = 127
    below6 = torch.nextafter(fp32(6.0), fp32(0.0)).item()
    check_mxfp4_block([below6] + [0.0] * 31, 127, [7] + [0] * 31)


def test_mxfp4_tiny_amax():
    # amax = 6 * 2^-127 (= 1.5 * 2^-125, normal): v = RN(2^-127 * (1 + 2^-25)) = 2^-127 -> e = 0,
    # o = 1: elements stay tiny -> codes 0 / 8, dequantized as 0 * 2^-127 = 0.
    a = 6 * 2.0 ** -127
    out = check_mxfp4_block([a, -a] + [0.0] * 30, 0, [0, 8] + [0] * 30)
    assert (out == 0).all()
    # amax = 2^-126: v ~ 2^-128.6 -> e = 0 as well
    check_mxfp4_block([2.0 ** -126] + [0.0] * 31, 0, [0] * 32)
    # amax = 1.5 * 2^-125 + 2 * 2^-148: v = 2^-127 + 0.79 * 2^-149 -> rounds to 2^-127 + 2^-149
    # > 2^-127 -> e = 1, o = 2^126 (twice the scale of a block with amax 6 * 2^-126):
    # y = 3 + 2^-21 -> 3 (code 5); dequantizes to 3 * 2^-126
    b = struct.unpack("<f", struct.pack("<I", f32_bits(a) + 2))[0]
    out = check_mxfp4_block([b] + [0.0] * 31, 1, [5] + [0] * 31)
    assert out[0, 0].item() == 3 * 2.0 ** -126
    # amax = 6 * 2^-126: v = 2^-126 exactly -> e = 1, o = 2^126, exact round trip
    out = check_mxfp4_block([6 * 2.0 ** -126, 2.0 ** -127] + [0.0] * 30, 1, [7, 1] + [0] * 30)
    assert out[0, :2].tolist() == [6 * 2.0 ** -126, 2.0 ** -127]


def test_mxfp4_huge_amax():
    # Finite amax tops out at FLT_MAX: v = RN(FLT_MAX * R6) ~ 2^125.4 -> e = 253, o = 2^-126,
    # FLT_MAX -> 4 - 2^-21, which would be 4 (code 6) and dequantize to 4 * 2^126 = 2^128 = Inf;
    # clamped to 3 (code 5, the largest magnitude with a finite product): 3 * 2^126.
    # -2^126 -> -1 (code 0xA) -> -2^126.
    out = check_mxfp4_block([FLT_MAX, -2.0 ** 126] + [0.0] * 30, 253, [5, 0xA] + [0] * 30)
    assert out[0, :2].tolist() == [3 * 2.0 ** 126, -2.0 ** 126]
    # e = 254 (the saturated exponent) needs v > 2^126: only Inf gets there; see test_mxfp4_inf


def test_mxfp4_never_overflows_to_inf():
    # The example: 3e38 -> 3.52 on o = 2^-126 would round to 4 (2^128 = Inf); every
    # finite value of a block past 3.5 * 2^126 now saturates to +-3 * 2^126.
    x = torch.full((1, 32), 3.0e38)
    x[0, 1] = -3.0e38
    x[0, 2] = 2.9e38   # 3.41 -> 3 (code 5) anyway
    data, scale = mx(x)
    out = deq(data, scale, None, 32)
    assert torch.isfinite(out).all()
    assert out[0, :3].tolist() == [3 * 2.0 ** 126, -3 * 2.0 ** 126, 3 * 2.0 ** 126]
    # bf16's largest finite value as input, and the bf16 output of the dequantize
    xb = torch.full((2, 64), 3.3895313892515355e38, dtype=torch.bfloat16)
    xb[1] = -xb[1]
    data, scale = torch_fp4.mxfp4_quantize(xb)
    outb = torch_fp4.fp4_dequantize(data, scale, None, 32, out_dtype=torch.bfloat16)
    assert torch.isfinite(outb).all() and (outb.float().abs() == 3 * 2.0 ** 126).all()


@settings(max_examples=200, deadline=None)
@given(exps=st.lists(st.integers(100, 127), min_size=32, max_size=32),
       mants=st.lists(st.floats(1.0, 1.9999999), min_size=32, max_size=32),
       signs=st.lists(st.booleans(), min_size=32, max_size=32))
def test_mxfp4_finite_inputs_dequantize_finite(exps, mants, signs):
    """Any finite block (here: magnitudes 2^100 .. FLT_MAX) dequantizes to finite values, and
    the codes are the oracle's."""
    xs = [(-1.0 if s else 1.0) * m * 2.0 ** e for e, m, s in zip(exps, mants, signs)]
    x = fp32([min(v, FLT_MAX) if v > 0 else max(v, -FLT_MAX) for v in xs]).view(1, 32)
    data, scale = mx(x)
    e, codes = oracle_mxfp4(x)
    assert torch.equal(unpack(data), codes)
    assert torch.isfinite(deq(data, scale, None, 32)).all()


def test_mxfp4_inf():
    # amax = Inf -> v = Inf -> e = 254, o = 2^-127. Products are clamped to 1.5 (code 3), the
    # largest magnitude whose product with 2^127 is finite: Inf -> code 3, -Inf -> code 0xB
    # (+-1.5 * 2^127, as an NVFP4 Inf saturates to about its tensor's amax); 2^126 -> 0.5 (code 1),
    # 1.5 * 2^127 -> 1.5 (code 3), FLT_MAX -> 1.99.. -> 1.5 (code 3), 1 -> tiny -> 0.
    xs = [INF, -INF, 2.0 ** 126, 1.5 * 2.0 ** 127, 1.0, FLT_MAX] + [0.0] * 26
    out = check_mxfp4_block(xs, 254, [3, 0xB, 1, 3, 0, 3] + [0] * 26)
    big = 1.5 * 2.0 ** 127
    assert out[0, :6].tolist() == [big, -big, 2.0 ** 126, big, 0.0, big]


def test_mxfp4_nan():
    # amax = NaN -> e = 0xFF; NaN elements -> code 7; the block dequantizes to NaN.
    # (o = 2^(127-255) = 2^-128 for the others: 1.0 -> 0, -2 -> -0.)
    xs = [NAN, 1.0, -2.0, 3.0] + [0.0] * 28
    x = torch.cat([fp32(xs), fp32([6.0] + [0.0] * 31)]).view(1, 64)
    data, scale = mx(x)
    assert scale.view(torch.uint8).view(-1).tolist() == [0xFF, 127]
    assert unpack(data)[0, :4].tolist() == [7, 0, 8, 0]
    e, codes = oracle_mxfp4(x)
    assert torch.equal(unpack(data), codes)
    out = deq(data, scale, None, 32)
    assert torch.isnan(out[0, :32]).all()
    assert out[0, 32].item() == 6.0 and (out[0, 33:] == 0).all()


# ---------------------------------------------------------------------------------------------
# compute_global_scale
# ---------------------------------------------------------------------------------------------
def gsc(x):
    return torch_fp4.compute_global_scale(x, backend=REF)


def test_compute_global_scale_values():
    for amax, want in [(7.0, 384.0), (2688.0, 1.0), (1.0, 2688.0), (0.5, 5376.0), (10.0, None)]:
        x = fp32([[0.25 * amax, -amax, 0.5 * amax, 0.0]])
        gs = gsc(x)
        assert gs.shape == (1,) and gs.dtype == torch.float32
        expected = f32(2688.0 / amax) if want is None else want
        assert gs.item() == expected
    assert f32_bits(gsc(fp32([[10.0]])).item()) == 0x43866666  # RN(268.8)
    # half / fp8 inputs: amax of the widened values
    for dt in (torch.bfloat16, torch.float16, torch.float8_e4m3fn):
        x = fp32([[3.0, -0.5], [1.25, 2.0]]).to(dt)
        gs = gsc(x)
        assert gs.dtype == torch.float32 and gs.item() == 896.0  # 2688 / 3


def test_compute_global_scale_degenerate():
    assert gsc(torch.zeros(3, 16)).tolist() == [1.0]
    assert gsc(-torch.zeros(3, 16)).tolist() == [1.0]
    # subnormal amax: 2688 / 1e-40 ~ 2.7e43 overflows fp32 -> not finite -> 1.0
    assert gsc(fp32([[1e-40, -5e-41]])).tolist() == [1.0]
    assert gsc(fp32([[2.0 ** -149]])).tolist() == [1.0]
    # smallest amax whose quotient is finite: 2688 / 2^-117 = 1.3125 * 2^128 overflows, 2^-116 not
    assert gsc(fp32([[2.0 ** -116]])).item() == 2688.0 * 2.0 ** 116
    # Inf and NaN are ignored (docs/NUMERICS.md section 2); nothing finite but zero -> 1.0
    assert gsc(fp32([[1.0, NAN, 3.0]])).tolist() == [896.0]
    assert gsc(fp32([[1.0, float("inf"), -3.0, float("-inf")]])).tolist() == [896.0]
    for dt in (torch.bfloat16, torch.float16):
        assert gsc(fp32([[NAN, 2.0, float("inf")]]).to(dt)).tolist() == [1344.0]
    assert gsc(fp32([[NAN, 2.0]]).to(torch.float8_e4m3fn)).tolist() == [1344.0]
    assert gsc(fp32([[NAN]]).to(torch.bfloat16)).tolist() == [1.0]
    assert gsc(fp32([[float("inf"), float("-inf")]])).tolist() == [1.0]


def test_one_inf_changes_only_its_own_block():
    """Regression: one +Inf made the global scale 0 and every dequantized value NaN."""
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(0))
    clean = x.clone()
    x[0, 0] = float("inf")
    g = gsc(x)
    without = clean.clone()
    without[0, 0] = 0.0
    assert g.item() == gsc(without).item()                                # the Inf is ignored
    d, s = torch_fp4.nvfp4_quantize(x, g, backend=REF)
    out = torch_fp4.fp4_dequantize(d, s, g, out_dtype=torch.float32, backend=REF)
    assert torch.isfinite(out).all()
    assert out[0, 0].item() == (torch.tensor([2688.0]) * (1.0 / g)).item()   # code 6 at scale 448
    dc, sc = torch_fp4.nvfp4_quantize(clean, g, backend=REF)
    want = torch_fp4.fp4_dequantize(dc, sc, g, out_dtype=torch.float32, backend=REF)
    block = torch.zeros_like(out, dtype=torch.bool)
    block[0, :16] = True
    assert torch.equal(out[~block], want[~block])                         # every other block as without it


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 50), st.integers(1, 64), st.integers(-20, 20), st.integers(0, 2 ** 31 - 1))
def test_compute_global_scale_matches_division(m, k, j, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * 2.0 ** j
    amax = max(abs(v) for v in x.view(-1).tolist())
    assert gsc(x).item() == f32(2688.0 / amax)


# ---------------------------------------------------------------------------------------------
# Random properties
# ---------------------------------------------------------------------------------------------
def random_input(m, k, block, j, spread, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * 2.0 ** j
    if spread:  # a different power-of-two magnitude per block
        e = torch.randint(-spread, spread + 1, (m, k // block), generator=g).float()
        x = (x.view(m, k // block, block) * torch.exp2(e).unsqueeze(-1)).view(m, k)
    return x


def half_step(y: torch.Tensor) -> torch.Tensor:
    """Half the E2M1 grid spacing around a scaled magnitude y (y <= 7)."""
    return torch.where(y <= 2, 0.25, torch.where(y <= 4, 0.5, 1.0)).to(F64)


prop_args = (st.integers(1, 200), st.integers(1, 16), st.integers(-20, 20), st.integers(0, 6),
             st.integers(0, 2 ** 31 - 1))


@settings(max_examples=50, deadline=None)
@given(*prop_args, st.one_of(st.none(), st.floats(2.0 ** -10, 2.0 ** 14, width=32)),
       st.sampled_from(LAYOUTS))
def test_nvfp4_random_properties(m, kb16, j, spread, seed, fixed_gs, layout):
    k = 16 * kb16
    x = random_input(m, k, 16, j, spread, seed)
    gs = gsc(x) if fixed_gs is None else fp32([fixed_gs])
    g = gs.item()
    data, scale = nv(x, gs, layout)
    s8 = spec_unswizzle(scale, m, k // 16, layout)
    codes = unpack(data)
    # 1. bit-exact against the oracle
    o_s8, o_codes = oracle_nvfp4(x, g)
    assert torch.equal(s8, o_s8)
    assert torch.equal(codes, o_codes)
    # 2. every dequantized value is on the block's grid RN(+-LUT * sf * RN(1/gs))
    out = deq(data, scale, gs, 16, layout).double()
    assert same(out, oracle_dequant(codes, s8, 16, g))
    # 3. error bound on blocks whose scale is neither zero nor saturated (scaled amax <= 7)
    sf = E4M3_ALL64[s8]
    eff = sf * rn32(torch.tensor(1.0 / g, dtype=F64))  # dequantization scale of the block
    xb, ob = x.double().view(m, -1, 16), out.view(m, -1, 16)
    y = xb.abs() / eff.unsqueeze(-1)
    ok_block = (sf > 0) & (y.amax(-1) <= 7)
    err = (xb - ob).abs()
    bound = half_step(y) * eff.unsqueeze(-1) + 2.0 ** -20 * (xb.abs() + ob.abs())
    bad = ok_block.unsqueeze(-1) & ~(err <= bound)
    assert not bad.any(), (err[bad][:4], bound[bad][:4])
    if fixed_gs is None and spread == 0:
        # with the tensor's own global scale every block is in range: the bound is not vacuous
        s_exact = g * xb.abs().amax(-1) / 6
        assert bool(ok_block[(s_exact >= 2.0 ** -6) & (s_exact <= 448)].all())
        assert bool(ok_block.any())


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 200), st.integers(1, 8), st.integers(-20, 20), st.integers(0, 20),
       st.integers(0, 2 ** 31 - 1), st.sampled_from(LAYOUTS))
def test_mxfp4_random_properties(m, kb32, j, spread, seed, layout):
    k = 32 * kb32
    x = random_input(m, k, 32, j, spread, seed)
    data, scale = mx(x, layout)
    e = spec_unswizzle(scale, m, k // 32, layout)
    codes = unpack(data)
    o_e, o_codes = oracle_mxfp4(x)
    assert torch.equal(e, o_e)
    assert torch.equal(codes, o_codes)
    out = deq(data, scale, None, 32, layout).double()
    assert same(out, oracle_dequant(codes, e, 32))
    # error bound: scale 2^(e-127) >= amax/6, so every nonzero block is in range
    eff = torch.exp2(e.double() - 127)
    xb, ob = x.double().view(m, -1, 16 * 2), out.view(m, -1, 32)
    y = xb.abs() / eff.unsqueeze(-1)
    assert bool((y.amax(-1) <= 6 * (1 + 2.0 ** -20)).all())
    err = (xb - ob).abs()
    bound = half_step(y) * eff.unsqueeze(-1) + 2.0 ** -20 * (xb.abs() + ob.abs())
    assert bool((err <= bound).all())


def grid_exact(m, k, block, exps, seed):
    """Random codes with one +-6 per block; x = LUT(code) * 2^exps[block]."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (m, k // block, block), generator=g)
    pos = torch.randint(0, block, (m, k // block, 1), generator=g)
    six = 7 + 8 * torch.randint(0, 2, (m, k // block, 1), generator=g)
    codes.scatter_(-1, pos, six)
    x = (SIGNED_LUT64[codes] * torch.exp2(exps.double()).unsqueeze(-1)).float()
    return x.view(m, k), codes.view(m, k)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 64), st.integers(1, 16), st.integers(-100, 100), st.integers(0, 2 ** 31 - 1),
       st.sampled_from(LAYOUTS))
def test_nvfp4_grid_exact_round_trip(m, kb, g_exp, seed, layout):
    # gs = 2^g, block scale 2^p with p in [-9, 8] (e4m3 powers of two, subnormals included):
    # x = LUT * 2^(p - g) with amax 6 * 2^(p - g): t = 2^(p-g), S = 2^p exact, o = 2^(g-p) exact.
    k = 16 * kb
    gen = torch.Generator().manual_seed(seed)
    p = torch.randint(-9, 9, (m, kb), generator=gen)
    x, codes = grid_exact(m, k, 16, p - g_exp, seed + 1)
    gs = fp32([2.0 ** g_exp])
    data, scale = nv(x, gs, layout)
    s8 = spec_unswizzle(scale, m, kb, layout)
    # e4m3 of 2^p by hand: normal (p + 7) << 3, subnormal 2^(p + 9) (p = -7, -8, -9 -> 4, 2, 1)
    want = torch.where(p >= -6, (p + 7) << 3, 2 ** (p + 9).clamp(min=0))
    assert torch.equal(s8, want)
    assert torch.equal(unpack(data), codes)  # -0.0 included (code 8)
    out = deq(data, scale, gs, 16, layout)
    assert same(out, x)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 64), st.integers(1, 8), st.integers(0, 2 ** 31 - 1),
       st.sampled_from(LAYOUTS))
def test_mxfp4_grid_exact_round_trip(m, kb, seed, layout):
    # block exponent p in [-126, 125]: amax 6 * 2^p, v = 2^p exactly, e = p + 127, o = 2^-p.
    k = 32 * kb
    gen = torch.Generator().manual_seed(seed)
    p = torch.randint(-126, 126, (m, kb), generator=gen)
    x, codes = grid_exact(m, k, 32, p, seed + 1)
    data, scale = mx(x, layout)
    assert torch.equal(spec_unswizzle(scale, m, kb, layout), p + 127)
    assert torch.equal(unpack(data), codes)
    assert same(deq(data, scale, None, 32, layout), x)


# ---------------------------------------------------------------------------------------------
# Input dtypes, 3-D inputs, layouts, uint8 views
# ---------------------------------------------------------------------------------------------
def quantize(fmt, x, gs, layout="128x4"):
    return nv(x, gs, layout) if fmt == "nvfp4" else mx(x, layout)


def assert_same_quant(a, b):
    assert a[0].dtype == b[0].dtype and a[1].dtype == b[1].dtype
    assert torch.equal(a[0].view(torch.uint8), b[0].view(torch.uint8))
    assert torch.equal(a[1].view(torch.uint8), b[1].view(torch.uint8))


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32,
                                   torch.float8_e4m3fn])
def test_input_dtypes_match_fp32(fmt, dtype):
    g = torch.Generator().manual_seed(7)
    # values representable in every input dtype: finite e4m3 bytes (0x7F / 0xFF are NaN)
    raw = torch.randint(0, 256, (37, 128), dtype=torch.uint8, generator=g)
    raw = torch.where((raw & 0x7F) == 0x7F, raw - 1, raw)
    x32 = raw.view(torch.float8_e4m3fn).float()
    x = x32.to(dtype)
    assert torch.equal(x.float(), x32)
    gs = gsc(x)
    assert gs.item() == gsc(x32).item()
    got, want = quantize(fmt, x, gs), quantize(fmt, x32, gs)
    assert_same_quant(got, want)
    # and the fp32 path is itself right
    s, c = oracle_nvfp4(x32, gs.item()) if fmt == "nvfp4" else oracle_mxfp4(x32)
    assert torch.equal(unpack(want[0]), c)
    assert torch.equal(spec_unswizzle(want[1], 37, s.shape[-1], "128x4"), s)
    if dtype in (torch.bfloat16, torch.float16):
        # native half values (not from the e4m3 grid) too
        xh = (torch.randn(37, 128, generator=g) * 3).to(dtype)
        gh = gsc(xh)
        assert_same_quant(quantize(fmt, xh, gh), quantize(fmt, xh.float(), gh))


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_3d_matches_per_slice(fmt, layout):
    g = torch.Generator().manual_seed(11)
    E, M, K = 3, 45, 96
    # experts of very different magnitudes, so a broadcast or misindexed gs changes the bytes
    x = torch.randn(E, M, K, generator=g) * torch.tensor([1e-3, 1.0, 5e3]).view(E, 1, 1)
    gs = torch.cat([gsc(x[e]) for e in range(E)])  # [E]
    assert gs.shape == (E,)
    data, scale = quantize(fmt, x, gs, layout)
    block = 16 if fmt == "nvfp4" else 32
    assert data.shape == (E, M, K // 2)
    mp, kp = (M, K // block) if layout == "linear" else \
        (-(-M // (128 if layout == "128x4" else 8)) * (128 if layout == "128x4" else 8),
         -(-(K // block) // 4) * 4)
    assert scale.shape == (E, mp, kp)
    for e in range(E):
        d_e, s_e = quantize(fmt, x[e].contiguous(), gs[e:e + 1], layout)
        assert torch.equal(data[e].view(torch.uint8), d_e.view(torch.uint8))
        assert torch.equal(scale[e].view(torch.uint8), s_e.view(torch.uint8))
        s, c = oracle_nvfp4(x[e], gs[e].item()) if fmt == "nvfp4" else oracle_mxfp4(x[e])
        assert torch.equal(unpack(data[e]), c)
        assert torch.equal(spec_unswizzle(scale[e], M, K // block, layout), s)
    # dequantization of the 3-D tensor with the [E] global scale equals per-slice dequantization
    gsd = gs if fmt == "nvfp4" else None
    out = deq(data, scale, gsd, block, layout)
    assert out.shape == (E, M, K)
    for e in range(E):
        ge = gs[e:e + 1] if fmt == "nvfp4" else None
        assert same(out[e], deq(data[e].contiguous(), scale[e].contiguous(), ge, block, layout))
        want = oracle_dequant(unpack(data[e]), spec_unswizzle(scale[e], M, K // block, layout),
                              block, None if ge is None else ge.item())
        assert same(out[e], want)
    if fmt == "nvfp4":  # a [1] global scale broadcasts over the experts
        d1, s1 = nv(x, gs[1:2], layout)
        for e in range(E):
            assert_same_quant((d1[e], s1[e]), nv(x[e].contiguous(), gs[1:2], layout))


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_layouts_agree(fmt):
    g = torch.Generator().manual_seed(3)
    M, K = 133, 224 if fmt == "nvfp4" else 160  # Kb = 14 / 5: both need k-block padding
    block = 16 if fmt == "nvfp4" else 32
    x = torch.randn(M, K, generator=g) * torch.exp2(torch.randint(-6, 7, (M, 1), generator=g))
    gs = gsc(x)
    results = {lay: quantize(fmt, x, gs, lay) for lay in LAYOUTS}
    lin = results["linear"][1].view(torch.uint8).long()
    assert lin.shape == (M, K // block)
    assert results["128x4"][1].shape == (256, 16 if fmt == "nvfp4" else 8)
    assert results["8x4"][1].shape == (136, 16 if fmt == "nvfp4" else 8)
    for lay, (data, scale) in results.items():
        assert torch.equal(data.view(torch.uint8), results["linear"][0].view(torch.uint8))
        assert torch.equal(spec_unswizzle(scale, M, K // block, lay), lin)
        out = deq(data, scale, gs if fmt == "nvfp4" else None, block, lay)
        assert same(out, deq(*results["linear"], gs if fmt == "nvfp4" else None, block, "linear"))


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_dequantize_uint8_views_and_out_dtypes(fmt, layout):
    g = torch.Generator().manual_seed(5)
    M, K = 19, 64
    block = 16 if fmt == "nvfp4" else 32
    x = torch.randn(M, K, generator=g) * 100
    gs = gsc(x)
    data, scale = quantize(fmt, x, gs, layout)
    gsd = gs if fmt == "nvfp4" else None
    codes = unpack(data)
    sbytes = spec_unswizzle(scale, M, K // block, layout)
    want32 = oracle_dequant(codes, sbytes, block, None if gsd is None else gsd.item())
    for out_dtype in (torch.float32, torch.bfloat16, torch.float16):
        ref = deq(data, scale, gsd, block, layout, out_dtype)
        assert ref.dtype == out_dtype and ref.shape == (M, K)
        assert same(ref, want32.float().to(out_dtype))  # RN_out of the fp32 value
        for d, s in ((data.view(torch.uint8), scale), (data, scale.view(torch.uint8)),
                     (data.view(torch.uint8), scale.view(torch.uint8))):
            assert same(deq(d, s, gsd, block, layout, out_dtype), ref)
    if fmt == "nvfp4":  # NVFP4 without a global scale: LUT * sf only
        assert same(deq(data, scale, None, 16, layout), oracle_dequant(codes, sbytes, 16))


def test_expert_global_scales_give_one_scale_per_expert():
    w = torch.randn(5, 32, 64) * torch.arange(1, 6).view(5, 1, 1)
    gs = torch_fp4.expert_global_scales(w)
    assert gs.shape == (5,) and gs.dtype == torch.float32
    assert torch.equal(gs, torch.cat([torch_fp4.compute_global_scale(e) for e in w]))
    d, s = torch_fp4.nvfp4_quantize(w, gs)                  # a 3-D quantize takes them as they are
    assert d.shape == (5, 32, 32)
    with pytest.raises(ValueError, match=r"expert_global_scales: w: expected a 3-D \[E, rows, K\] tensor"):
        torch_fp4.expert_global_scales(torch.randn(4, 64))


# ---------------------------------------------------------------------------------------------
# fp4_quantized_values: the quantized values before the global scale is undone (spec 3b)
# ---------------------------------------------------------------------------------------------
@settings(max_examples=50, deadline=None)
@given(st.integers(1, 40), st.integers(1, 6), st.sampled_from([16, 32]), st.booleans(),
       st.sampled_from([torch.bfloat16, torch.float16, torch.float32]), st.integers(-30, 30),
       st.integers(0, 2 ** 31 - 1))
def test_quantized_values_are_quantize_then_dequantize(m, kb, block, batched, dtype, j, seed):
    """fp4_quantized_values == fp4_dequantize(*quantize(x), None) bit for bit, 2-D and 3-D (one
    global scale per entry), with NaN, Inf and zero blocks; every value is exact in bf16 (the
    fp32 dequantize without the global scale equals it)."""
    g = torch.Generator().manual_seed(seed)
    shape = (3, m, kb * block) if batched else (m, kb * block)
    x = torch.randn(shape, generator=g) * 2.0 ** j
    flat = x.view(-1, kb * block)
    flat[0, 0] = float("nan")
    if flat.shape[0] > 1:
        flat[1, -1] = float("inf")
        flat[-1].zero_()
    x = x.to(dtype)
    if block == 16:
        gs = torch.stack([torch_fp4.compute_global_scale(e) for e in x]).reshape(-1) if batched \
            else torch_fp4.compute_global_scale(x)
        q, s = torch_fp4.nvfp4_quantize(x, gs, "linear")
    else:
        gs = None
        q, s = torch_fp4.mxfp4_quantize(x, "linear")
    got = torch_fp4.fp4_quantized_values(x, gs, block)
    want = torch_fp4.fp4_dequantize(q, s, None, block, "linear", torch.bfloat16)
    wide = torch_fp4.fp4_dequantize(q, s, None, block, "linear", torch.float32)
    assert got.dtype == torch.bfloat16 and got.shape == x.shape
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(got.float(), wide, rtol=0, atol=0, equal_nan=True)   # exact in bf16


def test_quantized_values_errors_name_the_argument():
    x = torch.randn(4, 32)
    gs = torch_fp4.compute_global_scale(x)
    with pytest.raises(TypeError, match="fp4_quantized_values: global_scale: expected an fp32 tensor"):
        torch_fp4.fp4_quantized_values(x)
    with pytest.raises(ValueError, match="global_scale: expected None for MXFP4"):
        torch_fp4.fp4_quantized_values(x, gs, 32)
    with pytest.raises(ValueError, match="block_size: expected 16"):
        torch_fp4.fp4_quantized_values(x, gs, 8)
    with pytest.raises(ValueError, match="fp4_quantized_values: x"):
        torch_fp4.fp4_quantized_values(torch.randn(4, 24), gs)
    with pytest.raises(TypeError, match="fp4_quantized_values: x"):
        torch_fp4.fp4_quantized_values(torch.ones(4, 32, dtype=torch.int32), gs)
    with pytest.raises(ValueError, match="fp4_quantized_values: global_scale"):
        torch_fp4.fp4_quantized_values(x, torch.ones(2))
