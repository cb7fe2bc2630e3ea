"""mm_fp4 W4A4 on Blackwell block-scaled tensor cores, in CuTe DSL.

Status: compiled and SASS-checked in CI for sm_100a, sm_103a and sm_120a
(tests/test_cute_mm_compile.py), never run (compiled, not run): no Blackwell GPU was
available. Treat every result of these kernels as unverified until tests/test_gpu_* have
passed on a B200/B300/RTX 50.

sm_100a / sm_103a kernel (`BlockScaledGemmSm100`, tactics `mm_tactics.Sm100MmTactic`):
- One CTA (or one 2-CTA pair for tile_m=256) per output tile, 6 warps: warps 0-3 epilogue,
  warp 4 MMA, warp 5 TMA. Clusters (cluster_m x cluster_n) multicast A along N and B along M.
- TMA loads A [M, K/2] and B [N, K/2] (K-major packed E2M1) and their 128x4 scale factors
  (the SfKMajorAtom layout `tile_atom_to_shape_SF` describes; out-of-range boxes are
  zero-filled, so M, N not multiples of the tile and the last K tile need no special case),
  through a `num_stages`-deep mbarrier pipeline (PipelineTmaUmma).
- The MMA warp copies each stage's scale factors to tensor memory (`tcgen05.cp` 4x32x128b)
  and issues `tcgen05.mma.cta_group::{1,2}.kind::mxf4nvf4.block_scale` (NVFP4: e4m3 scales,
  16-element blocks) or `kind::mxf4.block_scale` (MXFP4: ue8m0, 32-element blocks; CuTe DSL
  maps sf_vec_size=32 to kind::mxf4, the same product as mxf4nvf4 with scale_vec::2X). The
  scale copies and MMAs are issued by one thread, so the tensor pipe orders each scale
  overwrite after the MMAs that read the previous stage's scales.
- fp32 accumulators live in tensor memory; the epilogue warps load 32-column slices
  (`tcgen05.ld` 32x32b), multiply by alpha (read once from device memory; 1 when None),
  convert and store element by element with an (m < M, n < N) predicate.
- The SM103 tactics (tile_k=768) run the same K=64 MMA over a 768-deep stage; the sm_103a
  K=96 "ultra" MMA and its split scale-factor pipeline are not used. A 768-deep stage is
  large: shared memory holds 2 stages for tile_n=128 and 1 for tile_n=192/256, so those
  tactics overlap loads and MMAs little (offered to the autotuner, never the default).
- tile_n=192 (N=192 is a valid kind::mxf4nvf4 MMA N; accumulator 192 + SFA 48 + SFB 96
  tensor-memory columns for NVFP4, 192 + 24 + 48 for MXFP4, of the 512 allocated): B's scale
  factors come in 128-row atoms, so each stage loads and copies to tensor memory a 256-row
  SFB box (the smem/TMEM SFB layouts round N up to 256) that contains the tile's 192 rows
  (`_sfb_boxes_for_n192`); for odd N tiles those start 64 rows into the box and the MMA's
  SFB address is moved 2 columns on (one tensor-memory column holds 32 rows of SFB).
  1-CTA tiles, clusters along M only.

The sm_12x kernel is in mm_blockscaled_sm120.py; both share `compile_mm` / `mm_fp4` below.
The grouped MoE GEMM (moe_blockscaled.py) subclasses BlockScaledGemmSm100: it reuses `setup`
and `run_tile` (the kernel body, B and SFB read at a batch coordinate: the block's expert) and
overrides the `load_alpha` / `store_tile` hooks.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Optional

import torch

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.blackwell_helpers as sm100_utils
import cutlass.utils.blockscaled_layout as bs_layout
from cutlass import Int32
from cutlass.cute.nvgpu import cpasync, tcgen05
from cutlass.cute.runtime import make_ptr
from cutlass.runtime import make_fake_stream
from cutlass.utils.gemm.sm100 import (epilogue_tmem_copy_and_partition,
                                      transform_partitioned_tensor_layout as mn_modes)

from ... import formats as F
from ... import meta
from ...tactics import Tactic
from ...problems import MmProblem
from .._common import formed_alpha, prepare_outputs, tactic_or_default, with_bias
from .mm_tactics import MM_SPACE, Sm100MmTactic, Sm120MmTactic

OUT_TYPES = {"bf16": cutlass.BFloat16, "f16": cutlass.Float16, "f32": cutlass.Float32}
OUT_NAMES = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}
SMEM_BYTES = {"sm_100": 232448, "sm_120": 101376}


def format_types(nvfp4: bool):
    """(scale-factor dtype, elements per scale) of the format."""
    return (cutlass.Float8E4M3FN, 16) if nvfp4 else (cutlass.Float8E8M0FNU, 32)


def operand_tensors(a_ptr, b_ptr, sfa_ptr, sfb_ptr, c_ptr, m, n, k, sf_vec):
    """GEMM-convention views (mode0, mode1, batch=1) of the raw pointers: A (M, K), B (N, K)
    K-major, C (M, N) row-major, and the scale factors in the 128x4 atom layout."""
    a = cute.make_tensor(a_ptr, cute.make_ordered_layout((m, cute.assume(k, 32), 1), order=(1, 0, 2)))
    b = cute.make_tensor(b_ptr, cute.make_ordered_layout((n, cute.assume(k, 32), 1), order=(1, 0, 2)))
    c = cute.make_tensor(c_ptr, cute.make_ordered_layout((m, n, 1), order=(1, 0, 2)))
    sfa = cute.make_tensor(sfa_ptr, bs_layout.tile_atom_to_shape_SF(a.shape, sf_vec))
    sfb = cute.make_tensor(sfb_ptr, bs_layout.tile_atom_to_shape_SF(b.shape, sf_vec))
    return a, b, c, sfa, sfb


@cute.jit
def store_predicated(values: cute.Tensor, coords: cute.Tensor, dst: cute.Tensor, m: Int32,
                     n: Int32, alpha: cutlass.Float32, out_type: cutlass.Constexpr):
    """dst[i] = out_type(values[i] * alpha) where coords[i] is inside (m, n)."""
    for i in cutlass.range_constexpr(cute.size(values)):
        crd = coords[i]
        if crd[0] < m and crd[1] < n:
            dst[i] = (values[i] * alpha).to(out_type)


class BlockScaledGemmSm100:
    """tcgen05 block-scaled GEMM, one instance per (tactic, format, out dtype, alpha?)."""
    EPI_WARPS = (0, 1, 2, 3)
    MMA_WARP = 4
    TMA_WARP = 5

    def __init__(self, tactic: Sm100MmTactic, nvfp4: bool, out: str, has_alpha: bool):
        self.tactic = tactic
        self.sf_dtype, self.sf_vec = format_types(nvfp4)
        self.c_dtype = OUT_TYPES[out]
        self.acc_dtype = cutlass.Float32
        self.c_layout = utils.LayoutEnum.ROW_MAJOR
        self.has_alpha = has_alpha
        self.use_2cta = tactic.two_cta
        self.cta_group = tcgen05.CtaGroup.TWO if self.use_2cta else tcgen05.CtaGroup.ONE
        self.cluster_mn = (tactic.cluster_m, tactic.cluster_n)
        self.mma_tiler = (tactic.tile_m, tactic.tile_n, tactic.tile_k)
        # Scale factors of B are staged for N rounded up to the 128-row atom.
        self.mma_tiler_sfb = (tactic.tile_m // (2 if self.use_2cta else 1),
                              -(-tactic.tile_n // 128) * 128, tactic.tile_k)
        self.cta_tile_shape_mnk = (128, tactic.tile_n, tactic.tile_k)
        self.threads = 32 * 6
        self.epi_barrier = pipeline.NamedBarrier(barrier_id=1, num_threads=32 * len(self.EPI_WARPS))
        self.tmem_barrier = pipeline.NamedBarrier(barrier_id=2, num_threads=32 * (len(self.EPI_WARPS) + 1))

    def _tiled_mma(self, cta_group, tiler_mn):
        return sm100_utils.make_blockscaled_trivial_tiled_mma(
            cutlass.Float4E2M1FN, cutlass.Float4E2M1FN, tcgen05.OperandMajorMode.K,
            tcgen05.OperandMajorMode.K, self.sf_dtype, self.sf_vec, cta_group, tiler_mn)

    def _smem_layouts(self, tiled_mma, stages):
        t = self.mma_tiler
        return (sm100_utils.make_smem_layout_a(tiled_mma, t, cutlass.Float4E2M1FN, stages),
                sm100_utils.make_smem_layout_b(tiled_mma, t, cutlass.Float4E2M1FN, stages),
                bs_layout.make_smem_layout_sfa(tiled_mma, t, self.sf_vec, stages),
                bs_layout.make_smem_layout_sfb(tiled_mma, t, self.sf_vec, stages))

    @cute.jit
    def __call__(self, a_ptr: cute.Pointer, b_ptr: cute.Pointer, sfa_ptr: cute.Pointer,
                 sfb_ptr: cute.Pointer, c_ptr: cute.Pointer, alpha_ptr: cute.Pointer,
                 m: Int32, n: Int32, k: Int32, stream: cuda.CUstream):
        a, b, c, sfa, sfb = operand_tensors(a_ptr, b_ptr, sfa_ptr, sfb_ptr, c_ptr, m, n, k,
                                            self.sf_vec)
        ops = self.setup(a, b, sfa, sfb, n)
        # One CTA (pair) per output tile; the grid is padded to whole clusters (the extra CTAs
        # load zero-filled boxes and store nothing).
        ctas_m = cute.ceil_div(m, self.mma_tiler[0]) * cute.size(ops[0].thr_id.shape)
        grid = (cute.round_up(ctas_m, self.cluster_mn[0]),
                cute.round_up(cute.ceil_div(n, self.mma_tiler[1]), self.cluster_mn[1]), 1)
        self.kernel(*ops, c, alpha_ptr, self.cluster_vmnk, self.cluster_sfb_vmnk,
                    *self.smem_layouts, self.epi_tile).launch(
            grid=grid, block=[self.threads, 1, 1], cluster=(*self.cluster_mn, 1), stream=stream)

    @cute.jit
    def setup(self, a: cute.Tensor, b: cute.Tensor, sfa: cute.Tensor, sfb: cute.Tensor, n: Int32):
        """Trace-time setup shared with the grouped MoE kernel (moe_blockscaled.py): tiled MMAs,
        stages, shared-memory layouts and storage, TMA atoms over the GEMM-convention tensors
        (A (M, K, L), B (N, K, L), scale factors in the 128x4 atom layout). Returns the kernel's
        (tiled_mma, tiled_mma_sfb, tma_a, g_a, tma_b, g_b, tma_sfa, g_sfa, tma_sfb, g_sfb)."""
        tiled_mma = self._tiled_mma(self.cta_group, self.mma_tiler[:2])
        tiled_mma_sfb = self._tiled_mma(tcgen05.CtaGroup.ONE, self.mma_tiler_sfb[:2])
        mma_k = cute.size(tiled_mma.shape_mnk, mode=[2])
        self.k_blocks = self.mma_tiler[2] // mma_k

        # Stages: whatever shared memory holds after 2 KiB of barriers and alignment.
        one = self._smem_layouts(tiled_mma, 1)
        stage_bytes = (cute.size_in_bytes(cutlass.Float4E2M1FN, one[0])
                       + cute.size_in_bytes(cutlass.Float4E2M1FN, one[1])
                       + cute.size_in_bytes(self.sf_dtype, one[2])
                       + cute.size_in_bytes(self.sf_dtype, one[3]))
        self.stages = min(8, (SMEM_BYTES["sm_100"] - 6144) // stage_bytes)
        a_sl, b_sl, sfa_sl, sfb_sl = self.smem_layouts = self._smem_layouts(tiled_mma, self.stages)

        self.cluster_vmnk = cute.tiled_divide(cute.make_layout((*self.cluster_mn, 1)),
                                              (tiled_mma.thr_id.shape,))
        self.cluster_sfb_vmnk = cute.tiled_divide(cute.make_layout((*self.cluster_mn, 1)),
                                                  (tiled_mma_sfb.thr_id.shape,))
        self.mcast_a = cute.size(self.cluster_vmnk.shape[2])
        self.mcast_b = cute.size(self.cluster_vmnk.shape[1])
        self.epi_tile = sm100_utils.compute_epilogue_tile_shape(
            self.cta_tile_shape_mnk, self.use_2cta, self.c_layout, self.c_dtype)

        cl = self.cluster_vmnk.shape
        a0 = cute.slice_(a_sl, (None, None, None, 0))
        b0 = cute.slice_(b_sl, (None, None, None, 0))
        sfa0 = cute.slice_(sfa_sl, (None, None, None, 0))
        sfb0 = cute.slice_(sfb_sl, (None, None, None, 0))
        op_a = sm100_utils.cluster_shape_to_tma_atom_A(self.cluster_mn, tiled_mma.thr_id)
        op_b = sm100_utils.cluster_shape_to_tma_atom_B(self.cluster_mn, tiled_mma.thr_id)
        op_sfb = sm100_utils.cluster_shape_to_tma_atom_SFB(self.cluster_mn, tiled_mma.thr_id)
        tma_a, g_a = cute.nvgpu.make_tiled_tma_atom_A(op_a, a, a0, self.mma_tiler, tiled_mma, cl)
        tma_b, g_b = cute.nvgpu.make_tiled_tma_atom_B(op_b, b, b0, self.mma_tiler, tiled_mma, cl)
        tma_sfa, g_sfa = cute.nvgpu.make_tiled_tma_atom_A(
            op_a, sfa, sfa0, self.mma_tiler, tiled_mma, cl, internal_type=cutlass.Int16)
        tma_sfb, g_sfb = cute.nvgpu.make_tiled_tma_atom_B(
            op_sfb, sfb, sfb0, self.mma_tiler_sfb, tiled_mma_sfb, self.cluster_sfb_vmnk.shape,
            internal_type=cutlass.Int16)
        if cutlass.const_expr(self.mma_tiler[1] == 192):
            g_sfb = self._sfb_boxes_for_n192(g_sfb, n)
        self.tx_bytes = (cute.size_in_bytes(cutlass.Float4E2M1FN, a0)
                         + cute.size_in_bytes(cutlass.Float4E2M1FN, b0)
                         + cute.size_in_bytes(self.sf_dtype, sfa0)
                         + cute.size_in_bytes(self.sf_dtype, sfb0)) * cute.size(tiled_mma.thr_id.shape)

        @cute.struct
        class Storage:
            ab_full: cute.struct.MemRange[cutlass.Int64, self.stages]
            ab_empty: cute.struct.MemRange[cutlass.Int64, self.stages]
            acc_full: cute.struct.MemRange[cutlass.Int64, 1]
            acc_empty: cute.struct.MemRange[cutlass.Int64, 1]
            tmem_dealloc: cutlass.Int64
            tmem_holder: cutlass.Int32
            sA: cute.struct.Align[cute.struct.MemRange[cutlass.Float4E2M1FN, cute.cosize(a_sl.outer)], 1024]
            sB: cute.struct.Align[cute.struct.MemRange[cutlass.Float4E2M1FN, cute.cosize(b_sl.outer)], 1024]
            sSFA: cute.struct.Align[cute.struct.MemRange[self.sf_dtype, cute.cosize(sfa_sl)], 128]
            sSFB: cute.struct.Align[cute.struct.MemRange[self.sf_dtype, cute.cosize(sfb_sl)], 128]

        self.storage = Storage
        return (tiled_mma, tiled_mma_sfb, tma_a, g_a, tma_b, g_b, tma_sfa, g_sfa, tma_sfb, g_sfb)

    @cute.kernel
    def kernel(self, tiled_mma: cute.TiledMma, tiled_mma_sfb: cute.TiledMma,
               tma_a: cute.CopyAtom, mA: cute.Tensor, tma_b: cute.CopyAtom, mB: cute.Tensor,
               tma_sfa: cute.CopyAtom, mSFA: cute.Tensor, tma_sfb: cute.CopyAtom,
               mSFB: cute.Tensor, mC: cute.Tensor, alpha_ptr: cute.Pointer,
               cluster_vmnk: cute.Layout, cluster_sfb_vmnk: cute.Layout,
               a_sl: cute.ComposedLayout, b_sl: cute.ComposedLayout, sfa_sl: cute.Layout,
               sfb_sl: cute.Layout, epi_tile: cute.Tile):
        bidx, bidy, _ = cute.arch.block_idx()
        tile = (bidx // cute.size(tiled_mma.thr_id.shape), bidy, 0)
        self.run_tile(tiled_mma, tiled_mma_sfb, tma_a, mA, tma_b, mB, tma_sfa, mSFA, tma_sfb,
                      mSFB, mC, alpha_ptr, cluster_vmnk, cluster_sfb_vmnk, a_sl, b_sl, sfa_sl,
                      sfb_sl, epi_tile, tile, 0)

    @cute.jit
    def run_tile(self, tiled_mma: cute.TiledMma, tiled_mma_sfb: cute.TiledMma,
                 tma_a: cute.CopyAtom, mA: cute.Tensor, tma_b: cute.CopyAtom, mB: cute.Tensor,
                 tma_sfa: cute.CopyAtom, mSFA: cute.Tensor, tma_sfb: cute.CopyAtom,
                 mSFB: cute.Tensor, mC: cute.Tensor, alpha_ptr: cute.Pointer,
                 cluster_vmnk: cute.Layout, cluster_sfb_vmnk: cute.Layout,
                 a_sl: cute.ComposedLayout, b_sl: cute.ComposedLayout, sfa_sl: cute.Layout,
                 sfb_sl: cute.Layout, epi_tile: cute.Tile, tile, batch):
        """The kernel body for output tile `tile` = (m tile, n tile, 0); B and its scale
        factors are read at batch coordinate `batch` (0 here, the expert in the grouped MoE
        kernel)."""
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        pair = cute.size(tiled_mma.thr_id.shape)
        v = bidx % pair
        is_leader = v == 0
        rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        crd = cluster_vmnk.get_flat_coord(rank)
        crd_sfb = cluster_sfb_vmnk.get_flat_coord(rank)

        if warp == self.TMA_WARP:
            for atom in (tma_a, tma_b, tma_sfa, tma_sfb):
                cpasync.prefetch_descriptor(atom)

        smem = utils.SmemAllocator()
        st = smem.allocate(self.storage)
        ab = pipeline.PipelineTmaUmma.create(
            barrier_storage=st.ab_full.data_ptr(), num_stages=self.stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread,
                                                     self.mcast_a + self.mcast_b - 1),
            tx_count=self.tx_bytes, cta_layout_vmnk=cluster_vmnk, defer_sync=True)
        acc = pipeline.PipelineUmmaAsync.create(
            barrier_storage=st.acc_full.data_ptr(), num_stages=1,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread,
                                                     32 * len(self.EPI_WARPS) * pair),
            cta_layout_vmnk=cluster_vmnk, defer_sync=True)
        tmem = utils.TmemAllocator(st.tmem_holder, barrier_for_retrieve=self.tmem_barrier,
                                   allocator_warp_id=self.EPI_WARPS[0], is_two_cta=self.use_2cta,
                                   two_cta_tmem_dealloc_mbar_ptr=st.tmem_dealloc)
        pipeline.pipeline_init_arrive(cluster_shape_mn=self.cluster_mn, is_relaxed=True)

        sA = st.sA.get_tensor(a_sl.outer, swizzle=a_sl.inner)
        sB = st.sB.get_tensor(b_sl.outer, swizzle=b_sl.inner)
        sSFA = st.sSFA.get_tensor(sfa_sl)
        sSFB = st.sSFB.get_tensor(sfb_sl)

        def tiles(t, tiler, mode):
            return cute.local_tile(t, cute.slice_(tiler, mode), (None, None, None))
        gA = tiles(mA, self.mma_tiler, (None, 0, None))
        gB = tiles(mB, self.mma_tiler, (0, None, None))
        gSFA = tiles(mSFA, self.mma_tiler, (None, 0, None))
        gSFB = tiles(mSFB, self.mma_tiler_sfb, (0, None, None))
        gC = tiles(mC, self.mma_tiler, (None, None, 0))
        cC = tiles(cute.make_identity_tensor(mC.shape), self.mma_tiler, (None, None, 0))
        k_tiles = cute.size(gA, mode=[3])

        thr_mma = tiled_mma.get_slice(v)
        thr_mma_sfb = tiled_mma_sfb.get_slice(v)
        a_cta = cute.make_layout(cute.slice_(cluster_vmnk, (0, 0, None, 0)).shape)
        b_cta = cute.make_layout(cute.slice_(cluster_vmnk, (0, None, 0, 0)).shape)
        sfb_cta = cute.make_layout(cute.slice_(cluster_sfb_vmnk, (0, None, 0, 0)).shape)
        tAsA, tAgA = cpasync.tma_partition(tma_a, crd[2], a_cta, cute.group_modes(sA, 0, 3),
                                           cute.group_modes(thr_mma.partition_A(gA), 0, 3))
        tBsB, tBgB = cpasync.tma_partition(tma_b, crd[1], b_cta, cute.group_modes(sB, 0, 3),
                                           cute.group_modes(thr_mma.partition_B(gB), 0, 3))
        tAsSFA, tAgSFA = cpasync.tma_partition(
            tma_sfa, crd[2], a_cta, cute.group_modes(sSFA, 0, 3),
            cute.group_modes(thr_mma.partition_A(gSFA), 0, 3))
        tBsSFB, tBgSFB = cpasync.tma_partition(
            tma_sfb, crd_sfb[1], sfb_cta, cute.group_modes(sSFB, 0, 3),
            cute.group_modes(thr_mma_sfb.partition_B(gSFB), 0, 3))
        tAsSFA, tAgSFA = cute.filter_zeros(tAsSFA), cute.filter_zeros(tAgSFA)
        tBsSFB, tBgSFB = cute.filter_zeros(tBsSFB), cute.filter_zeros(tBgSFB)

        tCrA = tiled_mma.make_fragment_A(sA)
        tCrB = tiled_mma.make_fragment_B(sB)
        acc_shape = tiled_mma.partition_shape_C(self.mma_tiler[:2])
        tCtAcc_fake = tiled_mma.make_fragment_C(cute.append(acc_shape, 1))
        pipeline.pipeline_init_wait(cluster_shape_mn=self.cluster_mn)

        if warp == self.TMA_WARP:
            mask_a = mask_b = mask_sfb = None
            if cutlass.const_expr(cute.size(cluster_vmnk) > 1):
                mask_a = cpasync.create_tma_multicast_mask(cluster_vmnk, crd, mcast_mode=2)
                mask_b = cpasync.create_tma_multicast_mask(cluster_vmnk, crd, mcast_mode=1)
                mask_sfb = cpasync.create_tma_multicast_mask(cluster_sfb_vmnk, crd_sfb, mcast_mode=1)
            gA_t = tAgA[(None, tile[0], None, 0)]
            gB_t = tBgB[(None, tile[1], None, batch)]
            gSFA_t = tAgSFA[(None, tile[0], None, 0)]
            gSFB_t = tBgSFB[(None, tile[1], None, batch)]
            prod = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
            for kt in cutlass.range(k_tiles, unroll=1):
                ab.producer_acquire(prod)
                bar = ab.producer_get_barrier(prod)
                cute.copy(tma_a, gA_t[(None, kt)], tAsA[(None, prod.index)], tma_bar_ptr=bar, mcast_mask=mask_a)
                cute.copy(tma_b, gB_t[(None, kt)], tBsB[(None, prod.index)], tma_bar_ptr=bar, mcast_mask=mask_b)
                cute.copy(tma_sfa, gSFA_t[(None, kt)], tAsSFA[(None, prod.index)], tma_bar_ptr=bar,
                          mcast_mask=mask_a)
                cute.copy(tma_sfb, gSFB_t[(None, kt)], tBsSFB[(None, prod.index)], tma_bar_ptr=bar,
                          mcast_mask=mask_sfb)
                prod.advance()
            ab.producer_tail(prod)

        if warp == self.MMA_WARP:
            tmem.wait_for_alloc()
            acc_ptr = tmem.retrieve_ptr(self.acc_dtype)
            tCtAcc = cute.make_tensor(acc_ptr, tCtAcc_fake.layout)[(None, None, None, 0)]
            sfa_ptr = cute.recast_ptr(acc_ptr + tcgen05.find_tmem_tensor_col_offset(tCtAcc),
                                      dtype=self.sf_dtype)
            tCtSFA = cute.make_tensor(sfa_ptr, bs_layout.make_tmem_layout_sfa(
                tiled_mma, self.mma_tiler, self.sf_vec, cute.slice_(sfa_sl, (None, None, None, 0))))
            sfb_col = (tcgen05.find_tmem_tensor_col_offset(tCtAcc)
                       + tcgen05.find_tmem_tensor_col_offset(tCtSFA))
            sfb_tmem = bs_layout.make_tmem_layout_sfb(
                tiled_mma, self.mma_tiler, self.sf_vec, cute.slice_(sfb_sl, (None, None, None, 0)))
            tCtSFB = cute.make_tensor(cute.recast_ptr(acc_ptr + sfb_col, dtype=self.sf_dtype), sfb_tmem)
            cp_sfa, s2t_sfa, t2_sfa = self._s2t(sSFA, tCtSFA)
            cp_sfb, s2t_sfb, t2_sfb = self._s2t(sSFB, tCtSFB)
            # The MMA reads SFB from here: the staged 256 rows, or for tile_n=192 an odd tile's
            # rows 64..255 of them (one tensor-memory column holds 32 rows of SFB).
            tCtSFB_mma = tCtSFB
            if cutlass.const_expr(self.mma_tiler[1] == 192):
                shift = (tile[1] % 2) * 2
                tCtSFB_mma = cute.make_tensor(
                    cute.recast_ptr(acc_ptr + sfb_col + shift, dtype=self.sf_dtype), sfb_tmem)

            cons = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
            acc_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
            if is_leader:
                acc.producer_acquire(acc_state)
            tiled_mma.set(tcgen05.Field.ACCUMULATE, False)
            for kt in cutlass.range(k_tiles, unroll=1):
                if is_leader:
                    ab.consumer_wait(cons)
                    stage = (None, None, None, None, cons.index)
                    cute.copy(cp_sfa, s2t_sfa[stage], t2_sfa)
                    cute.copy(cp_sfb, s2t_sfb[stage], t2_sfb)
                    for kb in cutlass.range(self.k_blocks, unroll_full=True):
                        tiled_mma.set(tcgen05.Field.SFA, tCtSFA[(None, None, kb)].iterator)
                        tiled_mma.set(tcgen05.Field.SFB, tCtSFB_mma[(None, None, kb)].iterator)
                        cute.gemm(tiled_mma, tCtAcc, tCrA[(None, None, kb, cons.index)],
                                  tCrB[(None, None, kb, cons.index)], tCtAcc)
                        tiled_mma.set(tcgen05.Field.ACCUMULATE, True)
                    ab.consumer_release(cons)
                cons.advance()
            if is_leader:
                acc.producer_commit(acc_state)
            acc_state.advance()
            acc.producer_tail(acc_state)

        if warp < self.MMA_WARP:
            tmem.allocate(cute.arch.get_max_tmem_alloc_cols("sm_100"))
            tmem.wait_for_alloc()
            acc_ptr = tmem.retrieve_ptr(self.acc_dtype)
            # ((ATOM_M, MMA_M), (ATOM_N, MMA_N), ...): tiles of the epilogue divide M and N.
            tCtAcc = mn_modes(cute.make_tensor(acc_ptr, tCtAcc_fake.layout))
            tCgC = mn_modes(thr_mma.partition_C(gC))
            tCcC = mn_modes(thr_mma.partition_C(cC))
            t2r, tTR_tAcc, tTR_rAcc = epilogue_tmem_copy_and_partition(
                self, tidx, tCtAcc, tCgC, epi_tile, self.use_2cta)
            thr_t2r = t2r.get_slice(tidx)
            tTR_gC = thr_t2r.partition_D(cute.flat_divide(tCgC, epi_tile))
            tTR_cC = thr_t2r.partition_D(cute.flat_divide(tCcC, epi_tile))
            tTR_gC = tTR_gC[(None, None, None, None, None, *tile)]
            tTR_cC = tTR_cC[(None, None, None, None, None, *tile)]
            tTR_tAcc = tTR_tAcc[(None, None, None, None, None, 0)]
            alpha = self.load_alpha(alpha_ptr, batch)
            acc_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
            acc.consumer_wait(acc_state)
            self.store_tile(t2r, tTR_tAcc, tTR_rAcc, tTR_gC, tTR_cC, mC, alpha)
            cute.arch.fence_view_async_tmem_load()
            acc.consumer_release(acc_state)
            tmem.relinquish_alloc_permit()
            self.epi_barrier.arrive_and_wait()
            tmem.free(acc_ptr)

    def load_alpha(self, alpha_ptr, batch):
        """alpha from device memory (1 when the call has none)."""
        alpha = cutlass.Float32(1.0)
        if self.has_alpha:
            alpha = cute.make_tensor(alpha_ptr, cute.make_layout(1))[0]
        return alpha

    @cute.jit
    def store_tile(self, t2r: cute.TiledCopy, tTR_tAcc: cute.Tensor, tTR_rAcc: cute.Tensor,
                   tTR_gC: cute.Tensor, tTR_cC: cute.Tensor, mC: cute.Tensor,
                   alpha: cutlass.Float32):
        """Epilogue: each 32-column slice of the accumulator to registers, times alpha,
        converted and stored under the (m < M, n < N) predicate."""
        for em in cutlass.range_constexpr(cute.size(tTR_tAcc, mode=[3])):
            for en in cutlass.range_constexpr(cute.size(tTR_tAcc, mode=[4])):
                cute.copy(t2r, tTR_tAcc[(None, None, None, em, en)], tTR_rAcc)
                store_predicated(tTR_rAcc, tTR_cC[(None, None, None, em, en)],
                                 tTR_gC[(None, None, None, em, en)], mC.shape[0], mC.shape[1],
                                 alpha, self.c_dtype)

    @staticmethod
    def _sfb_boxes_for_n192(g_sfb: cute.Tensor, n: Int32) -> cute.Tensor:
        """tile_n=192: re-stride the SFB TMA coordinates so that N tile j loads the 256 SFB rows
        (two 128-row atoms) that contain its 192 rows, i.e. atoms a0, a0 + 1 with
        a0 = floor(192 j / 128) = 3 (j // 2) + j % 2; odd tiles then start 64 rows into the box.
        The rest-N mode (atom index, stride s) becomes ((2, 2), ceil(N / 384)) with strides
        ((s, s), 3 s): the first 2 is the box's atom pair, the second the tile parity and the
        last the pair of tiles. Boxes reaching past the last atom are zero-filled by TMA."""
        s = g_sfb.stride[0][1]
        shape = ((g_sfb.shape[0][0], ((2, 2), cute.ceil_div(n, 384))), g_sfb.shape[1],
                 g_sfb.shape[2])
        stride = ((g_sfb.stride[0][0], ((s, s), 3 * s)), g_sfb.stride[1], g_sfb.stride[2])
        return cute.make_tensor(g_sfb.iterator, cute.make_layout(shape, stride=stride))

    def _s2t(self, sSF, tSF):
        """tcgen05.cp (4x32x128b) of one stage of scale factors: smem -> tensor memory."""
        s_compact, t_compact = cute.filter_zeros(sSF), cute.filter_zeros(tSF)
        atom = cute.make_copy_atom(tcgen05.Cp4x32x128bOp(self.cta_group), self.sf_dtype)
        copy = tcgen05.make_s2t_copy(atom, t_compact)
        thr = copy.get_slice(0)
        src = tcgen05.get_s2t_smem_desc_tensor(copy, thr.partition_S(s_compact))
        return copy, src, thr.partition_D(t_compact)


# ---------------------------------------------------------------------------------------------
# Compile cache and launcher (shared with the sm_12x kernel)
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MmKey:
    tactic: Tactic
    fmt: str          # "nvfp4" / "mxfp4"
    out: str          # "bf16" / "f16" / "f32"
    has_alpha: bool
    arch: str         # "sm_100a", "sm_103a", "sm_120a", ...

    def build(self):
        nv = self.fmt == "nvfp4"
        if isinstance(self.tactic, Sm120MmTactic):
            from .mm_blockscaled_sm120 import BlockScaledGemmSm120
            return BlockScaledGemmSm120(self.tactic, nv, self.out, self.has_alpha)
        return BlockScaledGemmSm100(self.tactic, nv, self.out, self.has_alpha)


_compiled: dict = {}
_lock = threading.Lock()


def _ptr(dtype, t: Optional[torch.Tensor], align: int = 16):
    return make_ptr(dtype, 0 if t is None else t.data_ptr(), cute.AddressSpace.gmem,
                    assumed_align=align)


def _args(key: MmKey, a, b, sfa, sfb, c, alpha, ws, m, n, k, stream, sched=(1, 1)):
    sf = format_types(key.fmt == "nvfp4")[0]
    args = [_ptr(cutlass.Float4E2M1FN, a, 16), _ptr(cutlass.Float4E2M1FN, b, 16),
            _ptr(sf, sfa, 16), _ptr(sf, sfb, 16), _ptr(OUT_TYPES[key.out], c, 16),
            _ptr(cutlass.Float32, alpha, 4)]
    if isinstance(key.tactic, Sm120MmTactic):
        args.append(_ptr(cutlass.Int32, ws, 16))
        return (*args, Int32(m), Int32(n), Int32(k), Int32(sched[0]), Int32(sched[1]), stream)
    return (*args, Int32(m), Int32(n), Int32(k), stream)


def compile_mm(key: MmKey, *args, options: str = ""):
    fn = _compiled.get(key)
    if fn is None:
        with _lock:
            fn = _compiled.get(key)
            if fn is None:
                fn = cute.compile(key.build(), *args, options=options)
                _compiled[key] = fn
    return fn


def compile_only(key: MmKey):
    """Compile `key` with placeholder pointers (no GPU; target = CUTE_DSL_ARCH) and return the
    compiled function with its __ptx__ and __cubin__."""
    args = _args(key, None, None, None, None, None, None, None, 256, 256, 256, make_fake_stream())
    return cute.compile(key.build(), *args, options="--keep-ptx --keep-cubin")


def _arch(device: torch.device) -> str:
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}a"


def _aligned(t: torch.Tensor) -> torch.Tensor:
    t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


def mm_fp4(a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor, b_scale: torch.Tensor,
           alpha: Optional[torch.Tensor], out_dtype: torch.dtype, fmt: F.Fp4Format,
           layout: F.SfLayout, wlayout: F.WeightLayout = F.WeightLayout.ROW,
           quantize_a: bool = False, a_global_scale: Optional[torch.Tensor] = None,
           b_global_scale: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None,
           tactic: Optional[Tactic] = None, problem: Optional[MmProblem] = None) -> torch.Tensor:
    """W4A4 out [M, N] = alpha * A @ B^T on the current stream (b = w.T, b_scale = w_scale.T,
    both views of row-major [N, K/2] / [Np, Kp]). tactic None: MM_SPACE.default. Dispatch has
    checked the problem (the backend's requirement) and the tactic: FP4 codes with scales, never
    quantize_a. A bias is added to the fp32 result (_common.with_bias)."""
    if bias is not None:
        return with_bias(lambda d, q: mm_fp4(a, b, a_scale, b_scale, alpha, d, fmt, layout, wlayout, quantize_a,
                                             a_global_scale, b_global_scale, tactic=tactic, problem=q),
                         problem, out_dtype, bias)
    if quantize_a:
        raise ValueError("mm_fp4: the cute-dsl backend multiplies FP4 codes with scales, not quantize_a")
    if wlayout is not F.WeightLayout.ROW:
        raise ValueError(f"mm_fp4: the cute-dsl backend reads row-major weights, got {wlayout.value!r}")
    p = problem or MmProblem.of(a, b, a_scale, b_scale, alpha, out_dtype, fmt, layout, wlayout,
                                b_global_scale=b_global_scale)
    alpha = formed_alpha(alpha, a_global_scale, b_global_scale)
    tactic = tactic_or_default(tactic, MM_SPACE, p)
    out = prepare_outputs(meta.mm_fp4(a, b, out_dtype))
    m, n, k = p.m, p.n, p.k
    if out.numel() == 0:
        return out
    device = a.device
    a_u8 = _aligned(F.as_uint8(a))
    w_u8 = _aligned(F.as_uint8(b).T)                   # [N, K/2] row-major
    sfa = _aligned(F.as_uint8(a_scale))
    sfb = _aligned(F.as_uint8(b_scale).T)              # [Np, Kp] 128x4
    alpha_t = None if alpha is None else _aligned(alpha.float().reshape(1))
    key = MmKey(tactic, fmt.name, OUT_NAMES[out_dtype], alpha_t is not None, _arch(device))
    ws, sched = None, (1, 1)
    if isinstance(tactic, Sm120MmTactic):
        from .mm_blockscaled_sm120 import schedule, workspace
        ws, sched = workspace(tactic, m, n, k, device), schedule(tactic, m, n, k, device)
    stream = cuda.CUstream(torch.cuda.current_stream(device).cuda_stream)
    call = _args(key, a_u8, w_u8, sfa, sfb, out, alpha_t, ws, m, n, k, stream, sched)
    fn = compile_mm(key, *call)
    with torch.cuda.device(device):
        fn(*call)
    return out
