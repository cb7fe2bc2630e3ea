"""compute_global_scale in one launch, without host synchronization.

Each thread takes the maximum of |x| bit patterns over a grid-stride run of 16-byte vectors
(plus one tail element), in the input's own width, then widens it to fp32 bits; unsigned
maxima of magnitude patterns are float maxima. The global scale ignores non-finite elements
(Inf, NaN: patterns from the type's Inf pattern up): a thread whose maximum is not finite takes
its elements again with those as 0 (the first pass has no per-element test). Lane 0 of each warp folds
its warp's maximum into workspace[0] with an atomic max. Each CTA then counts itself in
workspace[1]; the CTA that counts last reads workspace[0], writes
gs = RN(2688 / amax) (1.0 if amax == 0 or gs is not finite) and zeroes both workspace words
for the next launch on the stream. With PDL (pdl=True) every thread executes
griddepcontrol.wait before its first global access (input, workspace or output), so a launch
that starts early still sees the workspace zeroed by the previous launch; dependents are let
launch once the input loads are done (they wait for this grid's completion themselves).
"""
from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, Uint32

from . import numerics as N
from . import ptx as P

THREADS = 256
AMAX_TARGET = 0x45280000       # 2688.0


# The magnitude pattern of Inf per element type (e4m3fn has none: 0x7F is its NaN); patterns from
# it up are not finite.
NOT_FINITE = {"f32": 0x7F800000, "bf16": 0x7F80, "f16": 0x7C00, "e4m3": 0x7F}


def _finite(mag, dtype: str) -> Uint32:
    """One element's magnitude pattern, 0 when it is not finite."""
    return P.sel(mag < Uint32(NOT_FINITE[dtype]), mag, Uint32(0))


def _finite_pair(lanes, dtype: str) -> Uint32:
    """Two 16-bit magnitude lanes, each 0 when not finite."""
    return _finite(lanes & Uint32(0xFFFF), dtype) | (_finite(lanes >> Uint32(16), dtype) << Uint32(16))


def _vector_max(words, dtype: str, finite: bool) -> Uint32:
    """Max magnitude pattern of a 16-byte vector's elements (finite: its finite elements only),
    in the element width (in the low bits)."""
    if dtype == "f32":
        return N._tree(P.umax, [_finite(N.abs_bits(w), dtype) if finite else N.abs_bits(w) for w in words])
    if dtype == "e4m3":
        lanes = [w & Uint32(0x007F007F) for w in words] + \
                [(w >> Uint32(8)) & Uint32(0x007F007F) for w in words]
    else:
        lanes = [w & Uint32(0x7FFF7FFF) for w in words]
    m = N._tree(P.umax_u16x2, [_finite_pair(w, dtype) for w in lanes] if finite else lanes)
    return P.umax(m & Uint32(0xFFFF), m >> Uint32(16))


def _to_f32(mag, dtype: str) -> Uint32:
    """A magnitude pattern in the element width -> fp32 bits of that magnitude."""
    if dtype == "f32":
        return mag
    if dtype == "bf16":
        return mag << Uint32(16)
    if dtype == "f16":
        return N.f16_low_to_f32(mag)
    return N.e4m3_to_f32(mag)


class GlobalScale:
    def __init__(self, dtype: str, pdl: bool = False):
        self.dtype, self.pdl = dtype, pdl
        self.esize = N.ELEMENT_BYTES[dtype]
        self.per_vector = 16 // self.esize

    @cute.jit
    def __call__(self, x: cute.Pointer, out: cute.Pointer, ws: cute.Pointer, vectors: Int32,
                 tail: Int32, grid: Int32, stream: cuda.CUstream):
        self.kernel(x, out, ws, vectors, tail).launch(grid=[grid, 1, 1], block=[THREADS, 1, 1],
                                                      stream=stream, use_pdl=self.pdl)

    def _tail_element(self, base, vectors, gtid) -> Uint32:
        """The magnitude pattern of tail element gtid (after the 16-byte vectors)."""
        e = P.ld_elem(base + (Int64(vectors) * self.per_vector + Int64(gtid)) * self.esize, self.esize)
        if cutlass.const_expr(self.dtype == "f32"):
            return N.abs_bits(e)
        if cutlass.const_expr(self.dtype == "e4m3"):
            return e & Uint32(0x7F)
        return e & Uint32(0x7FFF)

    @cute.kernel
    def kernel(self, x: cute.Pointer, out: cute.Pointer, ws: cute.Pointer, vectors: Int32,
               tail: Int32):
        if cutlass.const_expr(self.pdl):
            cute.arch.griddepcontrol_wait()    # the previous grid's writes are visible
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        nctas, _, _ = cute.arch.grid_dim()
        base = x.toint()
        gtid = bidx * THREADS + tidx
        mag = Uint32(0)
        v = gtid
        while v < vectors:
            mag = P.umax(mag, _vector_max(P.ld_v4(base + Int64(v) * 16), self.dtype, False))
            v = v + nctas * THREADS
        if gtid < tail:
            mag = P.umax(mag, self._tail_element(base, vectors, gtid))
        if _to_f32(mag, self.dtype) >= Uint32(N.F32_INF):
            # this thread's elements hold Inf or NaN: again, without them
            mag = Uint32(0)
            v = gtid
            while v < vectors:
                mag = P.umax(mag, _vector_max(P.ld_v4(base + Int64(v) * 16), self.dtype, True))
                v = v + nctas * THREADS
            if gtid < tail:
                mag = P.umax(mag, _finite(self._tail_element(base, vectors, gtid), self.dtype))
        if cutlass.const_expr(self.pdl):
            cute.arch.griddepcontrol_launch_dependents()
        amax = P.warp_max(_to_f32(mag, self.dtype))
        lane = tidx % 32
        if lane == 0:
            P.atomic_max(ws.toint(), amax)
        cute.arch.sync_threads()
        if tidx == 0:
            P.fence_gpu()
            ticket = P.atomic_add(ws.toint() + 4, Uint32(1))
            if ticket == Uint32(nctas - 1):
                P.fence_gpu()
                total = P.atomic_max(ws.toint(), Uint32(0))
                gs = P.div_rn(AMAX_TARGET, total)
                ok = (N.abs_bits(total) != Uint32(0)) & (N.abs_bits(gs) < Uint32(N.F32_INF))
                P.st_u32(out.toint(), P.sel(ok, gs, N.F32_ONE))
                P.st_u32(ws.toint(), Uint32(0))
                P.st_u32(ws.toint() + 4, Uint32(0))
