"""fp4_dequantize: one thread per block (16 or 32 elements) of the [R = B*M, K] output.

Each thread loads its 8 or 16 packed bytes and its scale byte, forms LUT(q) * scale (exact in
fp32), multiplies by RN(1/gs) when a global scale is given, rounds to the output dtype (RNE)
and stores 16-byte vectors.
"""
from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64

from . import numerics as N
from . import ptx as P

THREADS = 256
OUT_BYTES = {"bf16": 2, "f16": 2, "f32": 4}


class Dequantize:
    def __init__(self, nvfp4: bool, layout: str, out: str, has_gs: bool, pdl: bool = False):
        self.nvfp4, self.layout, self.out, self.has_gs = nvfp4, layout, out, has_gs
        self.pdl = pdl
        self.block = 16 if nvfp4 else 32
        self.in_bytes = self.block // 2
        self.out_block_bytes = self.block * OUT_BYTES[out]

    @cute.jit
    def __call__(self, data: cute.Pointer, scale: cute.Pointer, gs: cute.Pointer,
                 out: cute.Pointer, rows: Int32, kb: Int32, kp: Int32, mp: Int32,
                 batches: Int32, gs_stride: Int32, stream: cuda.CUstream):
        total = batches * rows * kb
        grid = (total + (THREADS - 1)) // THREADS
        self.kernel(data, scale, gs, out, kb, kp, mp * kp, total, gs_stride,
                    cute.fast_divmod_create_divisor_v2(kb),
                    cute.fast_divmod_create_divisor_v2(rows)).launch(
            grid=[grid, 1, 1], block=[THREADS, 1, 1], stream=stream, use_pdl=self.pdl)

    @cute.kernel
    def kernel(self, data: cute.Pointer, scale: cute.Pointer, gs: cute.Pointer,
               out: cute.Pointer, kb: Int32, kp: Int32, per_batch: Int32, total: Int32,
               gs_stride: Int32, div_kb: cute.FastDivmodDivisorV2,
               div_rows: cute.FastDivmodDivisorV2):
        if cutlass.const_expr(self.pdl):
            cute.arch.griddepcontrol_wait()    # the previous grid's writes are visible
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        blk = bidx * THREADS + tidx
        if blk < total:
            row, k = divmod(blk, div_kb)
            b, m = divmod(row, div_rows)
            src = data.toint() + Int64(blk) * self.in_bytes
            if cutlass.const_expr(self.nvfp4):
                packed = list(P.ld_v2(src))
            else:
                packed = list(P.ld_v4(src))
            soff = b * per_batch + N.scale_offset(self.layout, m, k, kp)
            byte = P.ld_u8(scale.toint() + Int64(soff))
            if cutlass.const_expr(self.nvfp4):
                sf = N.e4m3_to_f32(byte)
            else:
                sf = N.ue8m0_to_f32(byte)
            rgs = None
            if cutlass.const_expr(self.has_gs):
                rgs = P.rcp_rn(P.ld_u32(gs.toint() + Int64(b * gs_stride) * 4))
            if cutlass.const_expr(self.pdl):
                cute.arch.griddepcontrol_launch_dependents()
            res = N.dequantize_words(packed, sf, rgs, self.out)
            dst = out.toint() + Int64(blk) * self.out_block_bytes
            for i in cutlass.range_constexpr(len(res) // 4):
                P.st_v4(dst + 16 * i, res[4 * i], res[4 * i + 1], res[4 * i + 2], res[4 * i + 3])
