"""Quantize variant (a): one thread per scale slot, 16-byte vector loads straight from global
memory. Suits small and medium problems (no pipeline set-up, one wave of short-lived CTAs).

Threads walk the padded scale grid [B, Mp, Kp] in row-major order, so neighbouring threads read
neighbouring blocks of one row. A thread whose slot is padding (m >= M or kb >= Kb) writes a 0
scale byte and nothing else; every other thread loads its block, writes its packed E2M1 bytes
(8 or 16) and its scale byte.
"""
from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, Uint32

from . import numerics as N
from . import ptx as P
from .quantize_block import quantize_store

THREADS = 256


class VectorQuantize:
    def __init__(self, dtype: str, nvfp4: bool, layout: str, pdl: bool = False):
        self.dtype, self.nvfp4, self.layout, self.pdl = dtype, nvfp4, layout, pdl
        self.block = 16 if nvfp4 else 32
        self.block_bytes = self.block * N.ELEMENT_BYTES[dtype]     # input bytes per block
        self.out_bytes = self.block // 2                            # packed bytes per block

    @cute.jit
    def __call__(self, x: cute.Pointer, gs: cute.Pointer, q: cute.Pointer, s: cute.Pointer,
                 rows: Int32, kb: Int32, kp: Int32, mp: Int32, batches: Int32,
                 gs_stride: Int32, stream: cuda.CUstream):
        per_batch = mp * kp
        total = batches * per_batch
        div_batch = cute.fast_divmod_create_divisor_v2(per_batch)
        div_kp = cute.fast_divmod_create_divisor_v2(kp)
        grid = (total + (THREADS - 1)) // THREADS
        self.kernel(x, gs, q, s, rows, kb, kp, per_batch, total, gs_stride,
                    div_batch, div_kp).launch(grid=[grid, 1, 1], block=[THREADS, 1, 1],
                                              stream=stream, use_pdl=self.pdl)

    @cute.kernel
    def kernel(self, x: cute.Pointer, gs: cute.Pointer, q: cute.Pointer, s: cute.Pointer,
               rows: Int32, kb: Int32, kp: Int32, per_batch: Int32, total: Int32,
               gs_stride: Int32, div_batch: cute.FastDivmodDivisorV2,
               div_kp: cute.FastDivmodDivisorV2):
        if cutlass.const_expr(self.pdl):
            cute.arch.griddepcontrol_wait()    # the previous grid's writes are visible
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        slot = bidx * THREADS + tidx
        if slot < total:
            b, r = divmod(slot, div_batch)
            m, k = divmod(r, div_kp)
            soff = b * per_batch + N.scale_offset(self.layout, m, k, kp)
            sbyte = Uint32(0)
            if m < rows and k < kb:
                blk = Int64((b * rows + m) * kb + k)
                src = x.toint() + blk * self.block_bytes
                words = []
                for i in cutlass.range_constexpr(self.block_bytes // 16):
                    words.extend(P.ld_v4(src + 16 * i))
                if cutlass.const_expr(self.pdl):
                    cute.arch.griddepcontrol_launch_dependents()
                sbyte = quantize_store(words, self.dtype, self.nvfp4, gs, b, gs_stride,
                                       q.toint() + blk * self.out_bytes)
            P.st_u8(s.toint() + Int64(soff), sbyte)
