"""Single PTX instructions used by the CuTe DSL kernels, as device functions on 32-bit values.

Floating-point values travel as their fp32 bit patterns in Uint32 registers; every arithmetic
step names its rounding (`.rn`) so nothing can be contracted or approximated. Addresses are
Int64 global addresses.
"""
from __future__ import annotations

import cutlass
from cutlass import Int32, Int64, Uint32
from cutlass.cute.arch import inline_ptx


class _Operands:
    """Builds the operand list of one inline-PTX instruction: a Python int becomes a literal in
    the text (`0fXXXXXXXX` for an fp32 operand, decimal for an integer one), anything else a
    register operand. Literals keep NVVM from turning folded constants into integer immediates
    of float instructions."""

    def __init__(self):
        self.args = []

    def f32(self, v) -> str:
        if isinstance(v, int):
            return "0f%08X" % (v & 0xFFFFFFFF)
        return self.reg(Uint32(v))

    def u32(self, v) -> str:
        if isinstance(v, int):
            return str(v & 0xFFFFFFFF)
        return self.reg(Uint32(v))

    def reg(self, v) -> str:
        self.args.append(v)
        return "{$r%d}" % (len(self.args) - 1)


def _u32(ptx: str, *args) -> Uint32:
    return inline_ptx(ptx, write_only_types=[Uint32], read_only_args=list(args))


def _f32_op(fmt: str, *values) -> Uint32:
    ops = _Operands()
    text = fmt.format(*[ops.f32(v) for v in values])
    return inline_ptx(text, write_only_types=[Uint32], read_only_args=ops.args)


# --- fp32 arithmetic on bit patterns -----------------------------------------------------------
def fmul_rn(a, b) -> Uint32:
    return _f32_op("{{ .reg .f32 a, b, d; mov.b32 a, {0}; mov.b32 b, {1}; mul.rn.f32 d, a, b; "
                   "mov.b32 {{$w0}}, d; }}", a, b)


def fma_rn_abs(a, b, c) -> Uint32:
    """RN(|a| * b + c) with one rounding."""
    return _f32_op("{{ .reg .f32 a, b, c, d; mov.b32 a, {0}; mov.b32 b, {1}; mov.b32 c, {2}; "
                   "abs.f32 a, a; fma.rn.f32 d, a, b, c; mov.b32 {{$w0}}, d; }}", a, b, c)


def fmin_inf(a) -> Uint32:
    """min(a, +Inf): a unchanged unless a is NaN, which gives +Inf (PTX min returns the
    non-NaN operand)."""
    return _f32_op("{{ .reg .f32 a, d; mov.b32 a, {0}; min.f32 d, a, 0f7F800000; "
                   "mov.b32 {{$w0}}, d; }}", a)


def rcp_rn(a) -> Uint32:
    """Correctly rounded 1/a (IEEE, subnormals kept)."""
    return _f32_op("{{ .reg .f32 a, d; mov.b32 a, {0}; rcp.rn.f32 d, a; mov.b32 {{$w0}}, d; }}", a)


def div_rn(a, b) -> Uint32:
    """Correctly rounded a/b."""
    return _f32_op("{{ .reg .f32 a, b, d; mov.b32 a, {0}; mov.b32 b, {1}; div.rn.f32 d, a, b; "
                   "mov.b32 {{$w0}}, d; }}", a, b)


def _int_op(fmt: str, *values) -> Uint32:
    ops = _Operands()
    text = fmt.format(*[ops.u32(v) for v in values])
    return inline_ptx(text, write_only_types=[Uint32], read_only_args=ops.args)


def umin(a, b) -> Uint32:
    return _int_op("min.u32 {{$w0}}, {0}, {1};", a, b)


def umax(a, b) -> Uint32:
    return _int_op("max.u32 {{$w0}}, {0}, {1};", a, b)


def umax_u16x2(a, b) -> Uint32:
    """Lane-wise unsigned max of two packed 16-bit pairs (sm_90+)."""
    return _int_op("max.u16x2 {{$w0}}, {0}, {1};", a, b)


def prmt(a, b, selector: int) -> Uint32:
    """Byte permute of the 8 bytes {b, a}; selector nibbles pick bytes, bit 3 of a nibble
    replicates the picked byte's top bit."""
    return _int_op("prmt.b32 {{$w0}}, {0}, {1}, %d;" % selector, a, b)


def sel(pred, a, b) -> Uint32:
    """pred ? a : b on 32-bit values."""
    return Uint32(cutlass.select_(pred, Uint32(a), Uint32(b)))


# --- conversions ----------------------------------------------------------------------------------
def f16x2_to_f32(w) -> tuple[Uint32, Uint32]:
    """Packed fp16 pair (low half = element 0) -> two fp32 bit patterns (exact)."""
    return inline_ptx(
        "{ .reg .b16 l, h; .reg .f32 a, b; mov.b32 {l, h}, {$r0}; cvt.f32.f16 a, l; "
        "cvt.f32.f16 b, h; mov.b32 {$w0}, a; mov.b32 {$w1}, b; }",
        write_only_types=[Uint32, Uint32], read_only_args=[Uint32(w)])


def e4m3x2_to_f16x2(h) -> Uint32:
    """Two e4m3 bytes (low 16 bits of h, element 0 in the low byte) -> packed fp16 pair (exact)."""
    return _u32("{ .reg .b16 t; cvt.u16.u32 t, {$r0}; cvt.rn.f16x2.e4m3x2 {$w0}, t; }", Uint32(h))


def f32_to_e4m3(s) -> Uint32:
    """fp32 -> e4m3fn byte, RNE; |s| > 448 and Inf saturate to +-448, NaN gives 0x7F."""
    return _u32("{ .reg .b16 t; cvt.rn.satfinite.e4m3x2.f32 t, 0f00000000, {$r0}; "
                "cvt.u32.u16 {$w0}, t; }", Uint32(s)) & Uint32(0xFF)


def f32_to_bf16x2(lo, hi) -> Uint32:
    """Two fp32 -> packed bf16 pair (RNE), lo in the low half."""
    return _u32("cvt.rn.bf16x2.f32 {$w0}, {$r1}, {$r0};", Uint32(lo), Uint32(hi))


def f32_to_f16x2(lo, hi) -> Uint32:
    """Two fp32 -> packed fp16 pair (RNE, overflow to Inf), lo in the low half."""
    return _u32("cvt.rn.f16x2.f32 {$w0}, {$r1}, {$r0};", Uint32(lo), Uint32(hi))


# --- global memory --------------------------------------------------------------------------------
def ld_v4(addr) -> tuple[Uint32, Uint32, Uint32, Uint32]:
    """16-byte read-only global load (addr 16-byte aligned)."""
    return inline_ptx("ld.global.nc.v4.u32 {{$w0}, {$w1}, {$w2}, {$w3}}, [{$r0}];",
                      write_only_types=[Uint32] * 4, read_only_args=[Int64(addr)])


def ld_v2(addr) -> tuple[Uint32, Uint32]:
    return inline_ptx("ld.global.nc.v2.u32 {{$w0}, {$w1}}, [{$r0}];",
                      write_only_types=[Uint32] * 2, read_only_args=[Int64(addr)])


def ld_u32(addr) -> Uint32:
    return _u32("ld.global.nc.u32 {$w0}, [{$r0}];", Int64(addr))


def ld_u8(addr) -> Uint32:
    return _u32("ld.global.nc.u8 {$w0}, [{$r0}];", Int64(addr))


def st_v4(addr, a, b, c, d) -> None:
    inline_ptx("st.global.v4.u32 [{$r0}], {{$r1}, {$r2}, {$r3}, {$r4}};",
               read_only_args=[Int64(addr), Uint32(a), Uint32(b), Uint32(c), Uint32(d)])


def st_v2(addr, a, b) -> None:
    inline_ptx("st.global.v2.u32 [{$r0}], {{$r1}, {$r2}};",
               read_only_args=[Int64(addr), Uint32(a), Uint32(b)])


def st_u32(addr, a) -> None:
    inline_ptx("st.global.u32 [{$r0}], {$r1};", read_only_args=[Int64(addr), Uint32(a)])


def st_u8(addr, a) -> None:
    inline_ptx("st.global.u8 [{$r0}], {$r1};", read_only_args=[Int64(addr), Uint32(a)])


# --- shared memory --------------------------------------------------------------------------------
def ld_shared_v4(addr) -> tuple[Uint32, Uint32, Uint32, Uint32]:
    """16-byte load from a 32-bit shared-memory address."""
    return inline_ptx("ld.shared.v4.u32 {{$w0}, {$w1}, {$w2}, {$w3}}, [{$r0}];",
                      write_only_types=[Uint32] * 4, read_only_args=[Int32(addr)])


def ld_elem(addr, nbytes: int) -> Uint32:
    """One element of 1, 2 or 4 bytes, zero-extended."""
    return _u32("ld.global.nc.u%d {$w0}, [{$r0}];" % (8 * nbytes), Int64(addr))


# --- reductions, atomics, fences ------------------------------------------------------------------
def warp_max(a) -> Uint32:
    """Unsigned maximum over the 32 lanes of a full warp."""
    return _u32("redux.sync.max.u32 {$w0}, {$r0}, 0xffffffff;", Uint32(a))


def atomic_max(addr, a) -> Uint32:
    """atom.global.max.u32, returns the old value."""
    return _u32("atom.global.max.u32 {$w0}, [{$r0}], {$r1};", Int64(addr), Uint32(a))


def atomic_add(addr, a) -> Uint32:
    """atom.global.add.u32, returns the old value."""
    return _u32("atom.global.add.u32 {$w0}, [{$r0}], {$r1};", Int64(addr), Uint32(a))


def fence_gpu() -> None:
    inline_ptx("fence.acq_rel.gpu;")
