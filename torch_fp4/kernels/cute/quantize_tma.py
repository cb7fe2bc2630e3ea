"""Quantize variant (b): TMA producer/consumer warp specialization for large problems.

The input is a 2-D [R = B*M, K] tensor. A persistent grid walks tiles of [rows, cols] elements
(one pipeline stage, 8 KB by default). In each CTA one producer warp issues a bulk tensor copy
(TMA, `cp.async.bulk.tensor`) per tile into a ring of shared-memory stages guarded by full/empty
mbarriers (PipelineTmaAsync); the consumer warps wait on a stage, quantize its blocks from
shared memory (each consumer thread owns whole blocks), write packed data and scale bytes to
global memory, and release the stage. TMA fills the parts of a tile beyond R or K with zeros;
consumers skip those blocks. Scale padding is written by the consumers: columns Kb..Kp-1 by
the thread that owns a row's last block, rows M..Mp-1 of each batch entry after the tile loop.
With PDL (pdl=True) every thread executes griddepcontrol.wait first, and the producer warp
executes griddepcontrol.launch_dependents once it has issued its last TMA load.
"""
from __future__ import annotations

from dataclasses import dataclass

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Int32, Int64, Uint32
from cutlass.cute.nvgpu import cpasync

from . import numerics as N
from . import ptx as P
from .quantize_block import quantize_store

MAX_BOX = 256          # largest TMA box extent per dimension
EVICT_FIRST = 0x12F0000000000000   # L2 cache policy operand: evict first (CUTLASS's value)
_CUTLASS_DTYPES = {"bf16": "BFloat16", "f16": "Float16", "f32": "Float32",
                   "e4m3": "Float8E4M3FN"}


@dataclass(frozen=True)
class TmaShape:
    """Static sizes of one TMA kernel: tile [rows, cols] (one stage), consumer warps, stages,
    and whether loads carry the L2 evict-first policy (the input is read once)."""
    rows: int
    cols: int
    consumer_warps: int
    stages: int
    evict_first: bool = True


def tma_shape(k: int, dtype: str, block: int, consumer_warps: int = 8, stages: int = 0,
              stage_bytes: int = 8192, evict_first: int = 1, max_cols: int = 0) -> TmaShape:
    """Tile rows of min(256 B (or max_cols elements), next power of two of a K-row) so short
    rows waste little of a stage; as many rows as fill `stage_bytes` (raised until every
    consumer thread owns a whole number of blocks), at most 256 (the TMA box limit).
    stages=0: as many stages as fit 32 KB per CTA, 2 to 4."""
    esize = N.ELEMENT_BYTES[dtype]
    col_bytes = min(max_cols * esize or 256, 1 << max(4, (k * esize - 1).bit_length()))
    stage_bytes = max(stage_bytes, 32 * consumer_warps * block * esize)
    rows = min(MAX_BOX, stage_bytes // col_bytes)
    stages = stages or min(4, max(2, 32768 // (rows * col_bytes)))
    return TmaShape(rows, col_bytes // esize, consumer_warps, stages, bool(evict_first))


def ctas_per_sm(shape: TmaShape, dtype: str, nvfp4: bool) -> int:
    """CTAs per SM of the persistent grid on sm_90: 228 KB shared memory, 2048 threads, and four
    16K-register sub-partitions holding whole warps (ptxas needs 40 registers per thread for
    NVFP4 consumers, 56 for MXFP4). The kernel declares it as its minimum CTAs per SM, so
    ptxas keeps the register count low enough for all of them to be resident."""
    registers = 40 if nvfp4 else 56
    warps = shape.consumer_warps + 1
    smem = shape.stages * (shape.rows * shape.cols * N.ELEMENT_BYTES[dtype] + 16) + 128 + 1024
    by_registers = 4 * (16384 // (32 * registers)) // warps
    return max(1, min(233472 // smem, 64 // warps, by_registers))


class TmaQuantize:
    def __init__(self, dtype: str, nvfp4: bool, layout: str, shape: TmaShape, pdl: bool = False):
        self.dtype, self.nvfp4, self.layout, self.pdl = dtype, nvfp4, layout, pdl
        self.block = 16 if nvfp4 else 32
        self.esize = N.ELEMENT_BYTES[dtype]
        self.block_bytes = self.block * self.esize
        self.out_bytes = self.block // 2
        self.tile_rows, self.tile_cols = shape.rows, shape.cols
        self.consumer_warps, self.stages = shape.consumer_warps, shape.stages
        self.consumers = 32 * shape.consumer_warps
        self.row_blocks = self.tile_cols // self.block            # blocks per tile row (pow2)
        self.tile_blocks = self.tile_rows * self.row_blocks
        assert self.tile_blocks % self.consumers == 0, shape
        self.stage_bytes = self.tile_rows * self.tile_cols * self.esize
        self.element = getattr(cutlass, _CUTLASS_DTYPES[dtype])
        self.ctas_per_sm = ctas_per_sm(shape, dtype, nvfp4)
        self.evict_first = shape.evict_first

    @cute.jit
    def __call__(self, x: cute.Pointer, gs: cute.Pointer, q: cute.Pointer, s: cute.Pointer,
                 rows: Int32, kb: Int32, kp: Int32, mp: Int32, batches: Int32,
                 gs_stride: Int32, grid: Int32, stream: cuda.CUstream):
        total_rows = batches * rows
        k = cute.assume(kb * self.block, divby=self.block)
        gx = cute.make_tensor(cute.recast_ptr(x, dtype=self.element),
                              cute.make_layout((total_rows, k), stride=(k, 1)))
        smem_tile = cute.make_layout((self.tile_rows, self.tile_cols), stride=(self.tile_cols, 1))
        atom, tma_x = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), gx, smem_tile, (self.tile_rows, self.tile_cols))
        col_tiles = (k + (self.tile_cols - 1)) // self.tile_cols
        tiles = ((total_rows + (self.tile_rows - 1)) // self.tile_rows) * col_tiles
        pad_rows = mp - rows
        pad_slots = batches * pad_rows * kp
        self.kernel(atom, tma_x, gs, q, s, rows, kb, kp, mp * kp, total_rows, col_tiles, tiles,
                    pad_slots, gs_stride,
                    cute.fast_divmod_create_divisor_v2(rows),
                    cute.fast_divmod_create_divisor_v2(col_tiles),
                    cute.fast_divmod_create_divisor_v2(cutlass.max(pad_rows * kp, 1)),
                    cute.fast_divmod_create_divisor_v2(kp)).launch(
            grid=[grid, 1, 1], block=[self.consumers + 32, 1, 1], stream=stream,
            min_blocks_per_mp=self.ctas_per_sm, preferred_smem_carveout=100, use_pdl=self.pdl)

    @cute.kernel
    def kernel(self, atom: cute.CopyAtom, tma_x: cute.Tensor, gs: cute.Pointer, q: cute.Pointer,
               s: cute.Pointer, rows: Int32, kb: Int32, kp: Int32, per_batch: Int32,
               total_rows: Int32, col_tiles: Int32, tiles: Int32, pad_slots: Int32,
               gs_stride: Int32, div_rows: cute.FastDivmodDivisorV2,
               div_col_tiles: cute.FastDivmodDivisorV2, div_pad_batch: cute.FastDivmodDivisorV2,
               div_kp: cute.FastDivmodDivisorV2):
        if cutlass.const_expr(self.pdl):
            cute.arch.griddepcontrol_wait()    # the previous grid's writes are visible
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        nctas, _, _ = cute.arch.grid_dim()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())

        alloc = cutlass.memory.SmemAllocator()
        barriers = alloc.allocate_array(cutlass.Int64, 2 * self.stages, byte_alignment=8)
        staged = cute.make_layout((self.tile_rows, self.tile_cols, self.stages),
                                  stride=(self.tile_cols, 1, self.tile_rows * self.tile_cols))
        sx = alloc.allocate_tensor(self.element, staged, byte_alignment=128)
        pipe = pipeline.PipelineTmaAsync.create(
            barrier_storage=barriers, num_stages=self.stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, self.consumer_warps),
            tx_count=self.stage_bytes, cta_layout_vmnk=cute.make_layout((1, 1, 1, 1)))

        gtiles = cute.local_tile(tma_x, (self.tile_rows, self.tile_cols), (None, None))
        tsx, tgx = cpasync.tma_partition(atom, 0, cute.make_layout(1),
                                         cute.group_modes(sx, 0, 2), cute.group_modes(gtiles, 0, 2))

        if warp == self.consumer_warps:
            # Producer warp: one TMA load per tile into the next free stage.
            cpasync.prefetch_descriptor(atom)
            state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
            t = bidx
            while t < tiles:
                tr, tc = divmod(t, div_col_tiles)
                pipe.producer_acquire(state)
                if cutlass.const_expr(self.evict_first):
                    cute.copy(atom, tgx[(None, tr, tc)], tsx[(None, state.index)],
                              tma_bar_ptr=pipe.producer_get_barrier(state),
                              cache_policy=Int64(EVICT_FIRST))
                else:
                    cute.copy(atom, tgx[(None, tr, tc)], tsx[(None, state.index)],
                              tma_bar_ptr=pipe.producer_get_barrier(state))
                state.advance()
                t = t + nctas
            if cutlass.const_expr(self.pdl):
                cute.arch.griddepcontrol_launch_dependents()   # every load of this CTA issued
            pipe.producer_tail(state)
        else:
            state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
            t = bidx
            while t < tiles:
                tr, tc = divmod(t, div_col_tiles)
                pipe.consumer_wait(state)
                stage_addr = Int32(sx.iterator.toint()) + state.index * self.stage_bytes
                self.consume_tile(stage_addr, tidx, tr, tc, gs, q, s, rows, kb, kp, per_batch,
                                  total_rows, gs_stride, div_rows)
                cute.arch.sync_warp()
                pipe.consumer_release(state)
                state.advance()
                t = t + nctas
            if cutlass.const_expr(self.layout != "linear"):
                self.zero_padding_rows(bidx * self.consumers + tidx, nctas * self.consumers, s,
                                       rows, kp, per_batch, pad_slots, div_pad_batch, div_kp)

    @cute.jit
    def consume_tile(self, stage_addr, tidx, tr, tc, gs, q, s, rows, kb, kp, per_batch,
                     total_rows, gs_stride, div_rows):
        for j in cutlass.range(self.tile_blocks // self.consumers, unroll=1):
            i = tidx + j * self.consumers
            r = i // self.row_blocks
            c = i % self.row_blocks
            grow = tr * self.tile_rows + r
            gkb = tc * self.row_blocks + c
            if grow < total_rows and gkb < kb:
                src = Int32(stage_addr) + r * (self.tile_cols * self.esize) + c * self.block_bytes
                words = []
                for v in cutlass.range_constexpr(self.block_bytes // 16):
                    words.extend(P.ld_shared_v4(src + 16 * v))
                b, m = divmod(grow, div_rows)
                blk = Int64(grow) * Int64(kb) + Int64(gkb)
                sb = quantize_store(words, self.dtype, self.nvfp4, gs, b, gs_stride,
                                    q.toint() + blk * self.out_bytes)
                sbase = s.toint() + Int64(b * per_batch)
                P.st_u8(sbase + Int64(N.scale_offset(self.layout, m, gkb, kp)), sb)
                if cutlass.const_expr(self.layout != "linear"):
                    if gkb == kb - 1:
                        for e in cutlass.range_constexpr(1, 4):
                            if gkb + e < kp:
                                P.st_u8(sbase + Int64(N.scale_offset(self.layout, m, gkb + e, kp)),
                                        Uint32(0))

    @cute.jit
    def zero_padding_rows(self, first, step, s, rows, kp, per_batch, pad_slots, div_pad_batch,
                          div_kp):
        """Scale bytes of rows M..Mp-1 of every batch entry are 0."""
        idx = first
        while idx < pad_slots:
            b, r = divmod(idx, div_pad_batch)
            mm, kk = divmod(r, div_kp)
            off = b * per_batch + N.scale_offset(self.layout, rows + mm, kk, kp)
            P.st_u8(s.toint() + Int64(off), Uint32(0))
            idx = idx + step
