"""The FP4 numerics and layout contract in code (layer 0).

Everything here is elementwise or reshaping PyTorch, runs on any device, and is the single source
of truth for the E2M1 grid, the NVFP4/MXFP4 block-scale rules and the scale-factor layouts.
The reference backend is built from these functions; fast backends are tested against it.

All arithmetic is IEEE fp32 with round-to-nearest-even (one torch op per rounding step, so no
fused multiply-add can change a result).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

# ---------------------------------------------------------------------------------------------
# Constants
# ---------------------------------------------------------------------------------------------
E2M1_LUT = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_MAX = 6.0
E4M3_MAX = 448.0
NVFP4_AMAX_TARGET = E4M3_MAX * E2M1_MAX  # 2688: the global scale maps the tensor amax here
R6_BITS = 0x3E2AAAAB  # RN(1/6) in fp32
E4M3_NAN_BITS = 0x7F
UE8M0_NAN_BITS = 0xFF

# Rounding thresholds of the E2M1 encoder: code c (magnitude) is the number of thresholds passed.
# (threshold, inclusive): "m > t" for ties that round down to the even code, "m >= t" for ties
# that round up to the even code.
_E2M1_THRESHOLDS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True),
                    (2.5, False), (3.5, True), (5.0, False))

FP4_DATA_DTYPES = (torch.float4_e2m1fn_x2, torch.uint8)


def r6(device: torch.device | str | None = None) -> torch.Tensor:
    """RN(1/6) as a 0-d fp32 tensor (bit pattern 0x3E2AAAAB), made on the device by a fill
    (no host-to-device copy, so it is legal during CUDA-graph capture)."""
    return torch.full((), R6_BITS, dtype=torch.int32, device=device).view(torch.float32)


# ---------------------------------------------------------------------------------------------
# Formats
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Fp4Format:
    """An FP4 block format: block size along K, scale dtype, and whether a global scale exists."""
    name: str
    block_size: int
    scale_dtype: torch.dtype
    has_global_scale: bool


NVFP4 = Fp4Format("nvfp4", 16, torch.float8_e4m3fn, True)
MXFP4 = Fp4Format("mxfp4", 32, torch.float8_e8m0fnu, False)
FORMATS = (NVFP4, MXFP4)


def format_for_block_size(block_size: int) -> Fp4Format:
    for fmt in FORMATS:
        if fmt.block_size == block_size:
            return fmt
    raise ValueError(f"block_size: expected 16 (NVFP4) or 32 (MXFP4), got {block_size!r}")


def _parse_named(cls, table: dict, value, arg: str):
    """`value` if it is a member of the enum `cls`, else the member named `value` in `table`.
    Plain dict lookups (no iteration over the enum class) so torch.compile traces this."""
    if isinstance(value, cls):
        return value
    found = table.get(value) if isinstance(value, str) else None
    if found is None:
        names = ", ".join(repr(name) for name in table)
        raise ValueError(f"{arg}: expected one of {names}, got {value!r}")
    return found


class SfLayout(enum.Enum):
    """Scale-factor layouts (spec section 4). Values are the names accepted by the public API."""
    LAYOUT_128x4 = "128x4"
    LAYOUT_8x4 = "8x4"
    LINEAR = "linear"

    @classmethod
    def parse(cls, value: "SfLayout | str", arg: str = "sf_layout") -> "SfLayout":
        return _parse_named(cls, _LAYOUTS, value, arg)

    @property
    def row_tile(self) -> int:
        return _ROW_TILE[self.value]

    @property
    def col_tile(self) -> int:
        return 1 if self is SfLayout.LINEAR else 4


_LAYOUTS = {layout.value: layout for layout in SfLayout.__members__.values()}
_ROW_TILE = {"128x4": 128, "8x4": 8, "linear": 1}


def _ceil_to(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def padded_scale_shape(rows: int, k_blocks: int, layout: SfLayout | str) -> tuple[int, int]:
    """(Mp, Kp) of the scale matrix of a [rows, k_blocks] block grid in `layout`."""
    layout = SfLayout.parse(layout)
    return _ceil_to(rows, layout.row_tile), _ceil_to(k_blocks, layout.col_tile)


def scale_shape(data_shape: tuple[int, ...] | torch.Size, block_size: int,
                layout: SfLayout | str) -> tuple[int, ...]:
    """Shape of the scale tensor for an unpacked tensor of shape [*batch, M, K]."""
    *batch, rows, k = data_shape
    return (*batch, *padded_scale_shape(rows, k // block_size, layout))


def swizzled_offset(m: int, kb: int, k_blocks: int, layout: SfLayout | str) -> int:
    """Byte offset of scale (m, kb) inside one [Mp, Kp] swizzled matrix (spec section 4)."""
    layout = SfLayout.parse(layout)
    kp = _ceil_to(k_blocks, layout.col_tile)
    if layout is SfLayout.LAYOUT_128x4:
        return ((m // 128) * (kp // 4) + kb // 4) * 512 + (m % 32) * 16 + ((m % 128) // 32) * 4 + kb % 4
    if layout is SfLayout.LAYOUT_8x4:
        return (m // 8) * (kp // 4) * 32 + (kb // 4) * 32 + (m % 8) * 4 + kb % 4
    return m * k_blocks + kb


def swizzle(sf: torch.Tensor, layout: SfLayout | str) -> torch.Tensor:
    """[*batch, M, Kb] scales (any 1-byte dtype) -> [*batch, Mp, Kp] in `layout`, zero padded."""
    layout = SfLayout.parse(layout)
    if layout is SfLayout.LINEAR:
        return sf.contiguous()
    *batch, rows, kb = sf.shape
    mp, kp = padded_scale_shape(rows, kb, layout)
    raw = sf.view(torch.uint8)
    padded = raw.new_zeros(*batch, mp, kp)
    padded[..., :rows, :kb] = raw
    nb = len(batch)
    if layout is SfLayout.LAYOUT_128x4:
        tiled = padded.view(*batch, mp // 128, 4, 32, kp // 4, 4)
        tiled = tiled.permute(*range(nb), nb, nb + 3, nb + 2, nb + 1, nb + 4)
    else:
        tiled = padded.view(*batch, mp // 8, 8, kp // 4, 4)
        tiled = tiled.permute(*range(nb), nb, nb + 2, nb + 1, nb + 3)
    return tiled.reshape(*batch, mp, kp).view(sf.dtype)


def unswizzle(sf: torch.Tensor, rows: int, k_blocks: int, layout: SfLayout | str) -> torch.Tensor:
    """Inverse of `swizzle`: [*batch, Mp, Kp] -> [*batch, rows, k_blocks] (drops the padding)."""
    layout = SfLayout.parse(layout)
    if layout is SfLayout.LINEAR:
        return sf
    *batch, mp, kp = sf.shape
    nb = len(batch)
    raw = sf.view(torch.uint8) if sf.is_contiguous() else sf.contiguous().view(torch.uint8)
    if layout is SfLayout.LAYOUT_128x4:
        tiled = raw.reshape(*batch, mp // 128, kp // 4, 32, 4, 4)
        tiled = tiled.permute(*range(nb), nb, nb + 3, nb + 2, nb + 1, nb + 4)
    else:
        tiled = raw.reshape(*batch, mp // 8, kp // 4, 8, 4)
        tiled = tiled.permute(*range(nb), nb, nb + 2, nb + 1, nb + 3)
    return tiled.reshape(*batch, mp, kp)[..., :rows, :k_blocks].view(sf.dtype)


# ---------------------------------------------------------------------------------------------
# Weight (FP4 data) layouts (spec section 4b)
# ---------------------------------------------------------------------------------------------
class WeightLayout(enum.Enum):
    """Byte orders of an FP4 weight [N, K/2]. Values are the names accepted by the public API."""
    ROW = "row"      # row-major: byte i of row n = codes (n, 2i) | (n, 2i + 1) << 4
    SM90 = "sm90"    # the register fragments of the Hopper GEMM (128 x 64 tiles), same shape

    @classmethod
    def parse(cls, value: "WeightLayout | str", arg: str = "weight_layout") -> "WeightLayout":
        return _parse_named(cls, _WEIGHT_LAYOUTS, value, arg)


_WEIGHT_LAYOUTS = {layout.value: layout for layout in WeightLayout.__members__.values()}
SM90_TILE_ROWS, SM90_TILE_K = 128, 64
# Bit positions of the eight codes of an "sm90" word, indexed [row half h][K half hk][element e]:
# (magnitude bits' lowest position, sign bit position). Register h + 2 hk of an MMA k16 step
# holds (row r + 8 h, K 2c + 8 hk + e); these places let the kernel build each register with one
# to four integer instructions (torch_fp4/csrc/mm_wgmma.cu, decode_packed_bf16).
SM90_CODE_BITS = (((6, 15), (22, 31)), ((3, 0), (19, 16))), (((25, 2), (9, 18)), ((12, 17), (28, 1)))


def sm90_layout_reason(n: int, k: int) -> str | None:
    """Why a weight [n, k] (k codes per row) cannot be stored in the "sm90" layout, or None."""
    if n % SM90_TILE_ROWS or k % SM90_TILE_K:
        return (f"the 'sm90' weight layout needs N % {SM90_TILE_ROWS} == 0 and K % {SM90_TILE_K} == 0, "
                f"got N={n}, K={k}")
    return None


def _sm90_codes_view(codes: torch.Tensor) -> torch.Tensor:
    """Codes [N, K] -> [N/128, K/64, mwg 2, warp 4, g 8, c 4, j 4, h 2, hk 2, e 2]: a tile's row
    64 mwg + 16 warp + 8 h + g and K 16 j + 8 hk + 2 c + e, in the order the words are stored."""
    n, k = codes.shape
    v = codes.view(n // 128, 2, 4, 2, 8, k // 64, 4, 2, 4, 2)  # R mwg warp h g | S j hk c e
    return v.permute(0, 5, 1, 2, 4, 8, 6, 3, 7, 9)


def to_weight_layout(w: torch.Tensor, layout: WeightLayout | str) -> torch.Tensor:
    """A row-major FP4 weight [N, K/2] (uint8 or float4_e2m1fn_x2) in `layout`, as uint8 [N, K/2].
    "sm90": the weight is cut into 128-row x 64-K tiles stored one after another (row tiles
    outer, 4096 bytes each); inside a tile, MMA thread t (0..255) owns the 16 bytes at 16 t, four
    little-endian 32-bit words, word j holding the eight codes of its K step j (spec section 4b).
    A stack of weights [..., N, K/2] (fused_moe's experts [E, N, K/2]): each [N, K/2] alone."""
    layout = WeightLayout.parse(layout)
    raw = as_uint8(w)
    if layout is WeightLayout.ROW:
        return raw.contiguous()
    *lead, n, half_k = raw.shape
    reason = sm90_layout_reason(n, 2 * half_k)
    if reason is not None:
        raise ValueError(f"to_weight_layout: w: {reason}")
    if lead:   # N % 128 == 0: the stack's rows are whole tiles of one matrix each
        return to_weight_layout(raw.reshape(-1, half_k), layout).view(raw.shape)
    codes = _sm90_codes_view(unpack_e2m1(raw.contiguous())).to(torch.int64)
    word = torch.zeros(codes.shape[:-3], dtype=torch.int64, device=raw.device)
    for h in range(2):
        for hk in range(2):
            for e in range(2):
                mag_at, sign_at = SM90_CODE_BITS[h][hk][e]
                c = codes[..., h, hk, e]
                word |= ((c & 7) << mag_at) | ((c >> 3) << sign_at)
    word = torch.where(word >= 2**31, word - 2**32, word).to(torch.int32)
    return word.reshape(n, half_k // 4).view(torch.uint8)


def from_weight_layout(w: torch.Tensor, layout: WeightLayout | str) -> torch.Tensor:
    """Inverse of `to_weight_layout`: an FP4 weight [..., N, K/2] in `layout` -> row-major uint8."""
    layout = WeightLayout.parse(layout)
    raw = as_uint8(w)
    if layout is WeightLayout.ROW:
        return raw
    *lead, n, half_k = raw.shape
    reason = sm90_layout_reason(n, 2 * half_k)
    if reason is not None:
        raise ValueError(f"from_weight_layout: w: {reason}")
    if lead:
        return from_weight_layout(raw.reshape(-1, half_k), layout).view(raw.shape)
    word = raw.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    word = word.view(n // 128, half_k // 32, 2, 4, 8, 4, 4)
    codes = torch.empty(*word.shape, 2, 2, 2, dtype=torch.uint8, device=raw.device)
    for h in range(2):
        for hk in range(2):
            for e in range(2):
                mag_at, sign_at = SM90_CODE_BITS[h][hk][e]
                codes[..., h, hk, e] = (((word >> mag_at) & 7) | (((word >> sign_at) & 1) << 3)).to(torch.uint8)
    out = torch.empty(n, 2 * half_k, dtype=torch.uint8, device=raw.device)
    _sm90_codes_view(out).copy_(codes)
    return pack_e2m1(out)


# ---------------------------------------------------------------------------------------------
# E2M1 elements
# ---------------------------------------------------------------------------------------------
def e2m1_encode(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> E2M1 codes (uint8 in [0, 15]): RNE with saturation; sign kept on zero; NaN -> 7."""
    x = x.float()
    m = x.abs()
    code = torch.zeros(x.shape, dtype=torch.uint8, device=x.device)
    for threshold, inclusive in _E2M1_THRESHOLDS:
        code += (m >= threshold if inclusive else m > threshold).to(torch.uint8)
    code |= torch.signbit(x).to(torch.uint8) << 3
    return torch.where(torch.isnan(x), torch.full_like(code, 7), code)


def e2m1_decode(code: torch.Tensor) -> torch.Tensor:
    """E2M1 codes (uint8) -> fp32 values (exact; integer arithmetic, no lookup-table copy)."""
    c = code.to(torch.int32)
    exp, man = (c >> 1) & 3, c & 1
    twice = torch.where(exp == 0, man, (2 + man) << (exp - 1).clamp(min=0))  # 2 * |value|
    mag = twice.float() * 0.5
    return torch.where((c & 8) != 0, -mag, mag)


def pack_e2m1(code: torch.Tensor) -> torch.Tensor:
    """Codes [..., K] -> packed bytes [..., K/2]: byte i = code[2i] | code[2i+1] << 4."""
    pairs = code.view(*code.shape[:-1], code.shape[-1] // 2, 2)
    return pairs[..., 0] | (pairs[..., 1] << 4)


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """Packed bytes [..., K/2] (uint8 or float4_e2m1fn_x2) -> codes [..., K] (uint8)."""
    raw = as_uint8(packed)
    return torch.stack((raw & 0xF, raw >> 4), dim=-1).view(*raw.shape[:-1], raw.shape[-1] * 2)


def as_uint8(t: torch.Tensor) -> torch.Tensor:
    """A uint8 view of a 1-byte tensor (never a copy)."""
    return t if t.dtype == torch.uint8 else t.view(torch.uint8)


# ---------------------------------------------------------------------------------------------
# Scale encodings
# ---------------------------------------------------------------------------------------------
def e4m3_rn_satfinite(s: torch.Tensor) -> torch.Tensor:
    """fp32 -> e4m3fn bits (uint8): RNE, |s| > 448 and Inf saturate to +-448, NaN -> 0x7F."""
    bits = s.float().clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
    return torch.where(torch.isnan(s), torch.full_like(bits, E4M3_NAN_BITS), bits)


def e4m3_to_float(bits: torch.Tensor) -> torch.Tensor:
    """e4m3fn bits (uint8 or float8_e4m3fn) -> fp32 (exact)."""
    return bits.view(torch.float8_e4m3fn).float()


def ue8m0_ceil(v: torch.Tensor) -> torch.Tensor:
    """Non-negative fp32 -> UE8M0 exponent byte of v rounded up to a power of two (saturating).

    0 or v <= 2^-127 -> 0; 2^-127 < v < 2^-126 -> 1; normal v -> exponent + (mantissa != 0),
    at most 254; Inf -> 254; NaN -> 255 (`cvt.rp.satfinite.ue8m0x2.f32`).
    """
    bits = v.float().view(torch.int32) & 0x7FFFFFFF
    exp = bits >> 23
    mant = bits & 0x7FFFFF
    e = (exp + (mant != 0).to(torch.int32)).clamp(max=254)
    e = torch.where(exp == 0, (bits > 0x00400000).to(torch.int32), e)
    e = torch.where(torch.isnan(v), torch.full_like(e, UE8M0_NAN_BITS), e)
    return e.to(torch.uint8)


def ue8m0_to_float(e: torch.Tensor) -> torch.Tensor:
    """UE8M0 byte (uint8 or float8_e8m0fnu) -> 2^(e-127) in fp32; 0 -> 2^-127, 255 -> NaN."""
    ei = as_uint8(e).to(torch.int32)
    bits = torch.where(ei == 0, torch.full_like(ei, 0x00400000), ei << 23)
    bits = torch.where(ei == 255, torch.full_like(ei, 0x7FC00000), bits)
    return bits.view(torch.float32)


def ue8m0_reciprocal(e: torch.Tensor) -> torch.Tensor:
    """2^(127-e) in fp32 for e in [1, 255] (int32): exact, subnormal for e >= 254."""
    normal = (254 - e).clamp(min=0) << 23
    subnormal = torch.ones_like(e) << (276 - e).clamp(0, 22)
    return torch.where(e <= 253, normal, subnormal).view(torch.float32)


def scale_to_float(scale: torch.Tensor, fmt: Fp4Format) -> torch.Tensor:
    """Block-scale bytes of `fmt` -> fp32 values."""
    return e4m3_to_float(as_uint8(scale)) if fmt is NVFP4 else ue8m0_to_float(scale)


# ---------------------------------------------------------------------------------------------
# Block-scale rules
# ---------------------------------------------------------------------------------------------
def global_scale_from_amax(amax: torch.Tensor) -> torch.Tensor:
    """NVFP4 encode global scale: RN(2688 / amax) (amax of the finite elements, docs/NUMERICS.md
    section 2); 1.0 where amax == 0 or the result is not finite."""
    amax = amax.float()
    gs = torch.full_like(amax, NVFP4_AMAX_TARGET) / amax
    ok = (amax != 0) & torch.isfinite(gs)
    return torch.where(ok, gs, torch.ones_like(gs))


def nvfp4_alpha(gs_a: torch.Tensor | None, gs_b: torch.Tensor) -> torch.Tensor:
    """GEMM epilogue scale for NVFP4 operands with encode global scales: RN(1 / RN(gs_a * gs_b)).

    With no activation scale (W4A16) it is RN(1 / gs_b).
    """
    prod = gs_b.float() if gs_a is None else gs_a.float() * gs_b.float()
    return torch.reciprocal(prod)


def nvfp4_block_scale(amax: torch.Tensor, gs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """NVFP4 rule (spec section 2): block amax (fp32) and global scale -> (s8 bits uint8, o fp32).

    S = RN(gs * RN(amax * R6)); s8 = e4m3_rn_satfinite(S);
    o = 0 if float(s8) == 0 else RN(1 / RN(float(s8) * RN(1/gs))).
    """
    s = gs * (amax.float() * r6(amax.device))
    s8 = e4m3_rn_satfinite(s)
    sf = e4m3_to_float(s8)
    o = torch.reciprocal(sf * torch.reciprocal(gs))
    return s8, torch.where(sf == 0, torch.zeros_like(o), o)


def mxfp4_block_scale(amax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP4 rule (spec section 3): block amax (fp32) -> (e bits uint8, o fp32).

    v = RN(amax * R6); e = ue8m0_ceil(v); o = 0 if amax == 0, 1 if e == 0, else 2^(127-e).
    """
    amax = amax.float()
    e = ue8m0_ceil(amax * r6(amax.device))
    ei = e.to(torch.int32)
    o = torch.where(ei == 0, torch.ones_like(amax), ue8m0_reciprocal(ei.clamp(min=1)))
    return e, torch.where(amax == 0, torch.zeros_like(o), o)


def mxfp4_limit(e: torch.Tensor) -> torch.Tensor:
    """The largest E2M1 magnitude L whose product with the MXFP4 scale 2^(e-127) is finite in
    fp32 (spec section 3): 3 for e = 253, 1.5 for e = 254, 6 otherwise. The quantizer clamps
    x_i * o to [-L, L] before encoding, so no quantized element dequantizes to +-Inf."""
    ei = as_uint8(e).to(torch.int32)
    six = torch.full(ei.shape, 6.0, dtype=torch.float32, device=ei.device)
    return torch.where(ei == 253, six * 0.5, torch.where(ei == 254, six * 0.25, six))
