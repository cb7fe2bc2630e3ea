"""mm_fp4 W4A4 on sm_12x (RTX 50 / RTX PRO 6000 Blackwell): warp-level block-scaled MMA.

Status: compiled and SASS-checked in CI for sm_120a, never run (compiled, not run: no sm_12x
GPU was available).

sm_12x has no tcgen05/TMEM: the tensor cores are reached with warp-synchronous
`mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale` (CuTe DSL
`cute.nvgpu.warp.MmaMXF4NVF4Op` / `MmaMXF4Op`), with operands and scale factors in registers.
`BlockScaledGemmSm120` (tactics `mm_tactics.Sm120MmTactic`):
- 9 warps: warps 0-7 are the MMA warps (a 4x2 warp grid; the MMA permutation covers 128 rows,
  so tile_m=256 repeats it twice along M and each warp holds twice the accumulators), warp 8
  the TMA producer. A, B and their 128x4 scales are TMA-loaded into a `stages`-deep mbarrier
  pipeline; the MMA warps read A/B with ldmatrix and the scales with plain shared-memory
  loads, and accumulate in fp32 registers. With tile_m=256 the scale-A register fragment's two
  M modes (inside the permutation, and its repeat) are grouped into one, in the order of the
  A fragment's M mode, so each shared-memory scale copy and each MMA find their rows.
- Scheduling is one loop over "work units" (tile, k-tile). Each CTA takes the contiguous unit
  range [cta * per, min((cta + 1) * per, total)):
  * data_parallel: per = k-tiles per tile, grid = number of tiles (a CTA per output tile);
  * stream_k: grid = the SM count (one resident CTA per SM: shared memory allows no second),
    per = ceil(total / grid). A CTA whose range starts inside a tile (k > 0) writes its
    partial accumulators to workspace slot `cta` and raises flag[cta] (release); the CTA that
    owns the tile's k = 0 waits for the flags of the following CTAs (acquire), adds their
    partials in CTA order, resets the flags to 0 and stores. The summation order depends only
    on the grid, so results are deterministic for a device; no atomics. It relies on every
    CTA of the grid being resident at once (the grid is at most the SM count).
- The epilogue multiplies by alpha and stores each accumulator element with an (m < M, n < N)
  predicate (no shared-memory staging).
"""
from __future__ import annotations

import torch

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.blackwell_helpers as sm120_utils
import cutlass.utils.blockscaled_layout as bs_layout
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Int32
from cutlass.cute.arch import inline_ptx
from cutlass.cute.nvgpu import cpasync

from .._common import sm_count
from .mm_blockscaled import OUT_TYPES, SMEM_BYTES, format_types, operand_tensors
from .mm_tactics import STREAM_K, Sm120MmTactic

MMA_WARPS = 8
PERM_M = 128        # rows of the MMA permutation (get_permutation_mnk); tile_m 256 repeats it
FLAG_WORDS = 1024   # stream-K grids are at most this many CTAs
_workspaces: dict = {}
def schedule(tactic: Sm120MmTactic, m: int, n: int, k: int, device) -> tuple[int, int]:
    """(grid, units per CTA) of the unit range split; host arithmetic on shapes only."""
    tiles = -(-m // tactic.tile_m) * -(-n // tactic.tile_n)
    k_tiles = -(-k // tactic.tile_k)
    if tactic.scheduler != STREAM_K:
        return tiles, k_tiles
    total = tiles * k_tiles
    per = -(-total // min(sm_count(device), FLAG_WORDS))
    return -(-total // per), per


def workspace(tactic: Sm120MmTactic, m: int, n: int, k: int, device: torch.device):
    """Stream-K workspace of the current stream: int32 [FLAG_WORDS flags, zeroed (the kernel
    leaves them zeroed) | grid * tile_m * tile_n fp32 partials]. None for data_parallel."""
    if tactic.scheduler != STREAM_K:
        return None
    grid, _ = schedule(tactic, m, n, k, device)
    need = FLAG_WORDS + grid * tactic.tile_m * tactic.tile_n
    key = (device.index, torch.cuda.current_stream(device).cuda_stream)
    ws = _workspaces.get(key)
    if ws is None or ws.numel() < need:
        ws = torch.zeros(need, dtype=torch.int32, device=device)
        _workspaces[key] = ws
    return ws


@cute.jit
def _load_acquire(addr: cutlass.Int64) -> Int32:
    return inline_ptx("ld.acquire.gpu.global.b32 {$w0}, [{$r0}];", write_only_types=[Int32],
                      read_only_args=[addr])


@cute.jit
def _store_release(addr: cutlass.Int64, value: Int32):
    inline_ptx("st.release.gpu.global.b32 [{$r0}], {$r1};", write_only_types=[],
               read_only_args=[addr, value])


class BlockScaledGemmSm120:
    def __init__(self, tactic: Sm120MmTactic, nvfp4: bool, out: str, has_alpha: bool):
        self.tile = (tactic.tile_m, tactic.tile_n, tactic.tile_k)
        self.stream_k = tactic.scheduler == STREAM_K
        self.nvfp4 = nvfp4
        self.sf_dtype, self.sf_vec = format_types(nvfp4)
        self.c_dtype = OUT_TYPES[out]
        self.has_alpha = has_alpha
        self.tma_warp = MMA_WARPS
        self.threads = 32 * (MMA_WARPS + 1)
        self.mma_barrier = pipeline.NamedBarrier(barrier_id=1, num_threads=32 * MMA_WARPS)

    def _mma(self):
        if self.nvfp4:
            op = cute.nvgpu.warp.MmaMXF4NVF4Op(cutlass.Float4E2M1FN, cutlass.Float32, self.sf_dtype)
        else:
            op = cute.nvgpu.warp.MmaMXF4Op(cutlass.Float4E2M1FN, cutlass.Float32, self.sf_dtype)
        perm = sm120_utils.get_permutation_mnk(self.tile, self.sf_vec, False)
        return cute.make_tiled_mma(op, cute.make_layout((4, 2, 1)), permutation_mnk=perm)

    def _ab_layout(self, rows, stages):
        atom = cute.nvgpu.warpgroup.make_smem_layout_atom(
            sm90_utils.get_smem_layout_atom(utils.LayoutEnum.ROW_MAJOR, cutlass.Float4E2M1FN,
                                            self.tile[2]), cutlass.Float4E2M1FN)
        return cute.tile_to_shape(atom, (rows, self.tile[2], stages), order=(0, 1, 2))

    @cute.jit
    def __call__(self, a_ptr: cute.Pointer, b_ptr: cute.Pointer, sfa_ptr: cute.Pointer,
                 sfb_ptr: cute.Pointer, c_ptr: cute.Pointer, alpha_ptr: cute.Pointer,
                 ws_ptr: cute.Pointer, m: Int32, n: Int32, k: Int32, grid: Int32, per: Int32,
                 stream: cuda.CUstream):
        a, b, c, sfa, sfb = operand_tensors(a_ptr, b_ptr, sfa_ptr, sfb_ptr, c_ptr, m, n, k,
                                            self.sf_vec)
        tiled_mma = self._mma()
        sfa1 = bs_layout.sm120_make_smem_layout_sfa(tiled_mma, self.tile, self.sf_vec, 1)
        sfb1 = bs_layout.sm120_make_smem_layout_sfb(tiled_mma, self.tile, self.sf_vec, 1)
        stage_bytes = ((self.tile[0] + self.tile[1]) * self.tile[2] // 2
                       + cute.size_in_bytes(self.sf_dtype, cute.filter_zeros(sfa1))
                       + cute.size_in_bytes(self.sf_dtype, cute.filter_zeros(sfb1)))
        self.stages = min(8, (SMEM_BYTES["sm_120"] - 4096) // stage_bytes)
        a_sl = self._ab_layout(self.tile[0], self.stages)
        b_sl = self._ab_layout(self.tile[1], self.stages)
        sfa_sl = bs_layout.sm120_make_smem_layout_sfa(tiled_mma, self.tile, self.sf_vec, self.stages)
        sfb_sl = bs_layout.sm120_make_smem_layout_sfb(tiled_mma, self.tile, self.sf_vec, self.stages)

        def tma(t, sl, rows, internal=None):
            return cpasync.make_tiled_tma_atom(
                cpasync.CopyBulkTensorTileG2SOp(), t, cute.slice_(sl, (None, None, 0)),
                (rows, self.tile[2]), num_multicast=1, internal_type=internal)
        tma_a, g_a = tma(a, a_sl, self.tile[0])
        tma_b, g_b = tma(b, b_sl, self.tile[1])
        tma_sfa, g_sfa = tma(sfa, sfa_sl, self.tile[0], cutlass.Int16)
        tma_sfb, g_sfb = tma(sfb, sfb_sl, self.tile[1], cutlass.Int16)
        self.tx_bytes = ((self.tile[0] + self.tile[1]) * self.tile[2] // 2
                         + cute.size_in_bytes(self.sf_dtype, cute.slice_(sfa_sl, (None, None, 0)))
                         + cute.size_in_bytes(self.sf_dtype, cute.slice_(sfb_sl, (None, None, 0))))

        @cute.struct
        class Storage:
            bars: cute.struct.MemRange[cutlass.Int64, self.stages * 2]
            sA: cute.struct.Align[cute.struct.MemRange[cutlass.Float4E2M1FN, cute.cosize(a_sl.outer)], 1024]
            sB: cute.struct.Align[cute.struct.MemRange[cutlass.Float4E2M1FN, cute.cosize(b_sl.outer)], 1024]
            sSFA: cute.struct.Align[cute.struct.MemRange[self.sf_dtype, cute.cosize(sfa_sl)], 128]
            sSFB: cute.struct.Align[cute.struct.MemRange[self.sf_dtype, cute.cosize(sfb_sl)], 128]

        self.storage = Storage
        tiles_m = cute.ceil_div(m, self.tile[0])
        tiles_n = cute.ceil_div(n, self.tile[1])
        k_tiles = cute.ceil_div(k, self.tile[2])
        total = tiles_m * tiles_n * k_tiles
        self.kernel(tiled_mma, tma_a, g_a, tma_b, g_b, tma_sfa, g_sfa, tma_sfb, g_sfb, c,
                    alpha_ptr, ws_ptr, a_sl, b_sl, sfa_sl, sfb_sl, tiles_n, k_tiles, total,
                    per).launch(grid=(grid, 1, 1), block=[self.threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, tiled_mma: cute.TiledMma, tma_a: cute.CopyAtom, mA: cute.Tensor,
               tma_b: cute.CopyAtom, mB: cute.Tensor, tma_sfa: cute.CopyAtom, mSFA: cute.Tensor,
               tma_sfb: cute.CopyAtom, mSFB: cute.Tensor, mC: cute.Tensor,
               alpha_ptr: cute.Pointer, ws_ptr: cute.Pointer, a_sl: cute.ComposedLayout,
               b_sl: cute.ComposedLayout, sfa_sl: cute.Layout, sfb_sl: cute.Layout,
               tiles_n: Int32, k_tiles: Int32, total: Int32, per: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        cta, _, _ = cute.arch.block_idx()
        if warp == self.tma_warp:
            for atom in (tma_a, tma_b, tma_sfa, tma_sfb):
                cpasync.prefetch_descriptor(atom)

        smem = utils.SmemAllocator()
        st = smem.allocate(self.storage)
        ab = pipeline.PipelineTmaAsync.create(
            num_stages=self.stages, producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, MMA_WARPS),
            tx_count=self.tx_bytes, barrier_storage=st.bars.data_ptr(),
            cta_layout_vmnk=cute.make_layout((1, 1, 1, 1)))
        sA = st.sA.get_tensor(a_sl.outer, swizzle=a_sl.inner)
        sB = st.sB.get_tensor(b_sl.outer, swizzle=b_sl.inner)
        sSFA = st.sSFA.get_tensor(sfa_sl)
        sSFB = st.sSFB.get_tensor(sfb_sl)

        def tiles(t, mode):
            return cute.local_tile(t, cute.slice_(self.tile, mode), (None, None, None))
        gA, gB = tiles(mA, (None, 0, None)), tiles(mB, (0, None, None))
        gSFA, gSFB = tiles(mSFA, (None, 0, None)), tiles(mSFB, (0, None, None))
        gC = tiles(mC, (None, None, 0))
        cC = tiles(cute.make_identity_tensor(mC.shape), (None, None, 0))
        one = cute.make_layout(1)
        tAsA, tAgA = cpasync.tma_partition(tma_a, 0, one, cute.group_modes(sA, 0, 2), cute.group_modes(gA, 0, 2))
        tBsB, tBgB = cpasync.tma_partition(tma_b, 0, one, cute.group_modes(sB, 0, 2), cute.group_modes(gB, 0, 2))
        tAsSFA, tAgSFA = cpasync.tma_partition(tma_sfa, 0, one, cute.group_modes(sSFA, 0, 2),
                                               cute.group_modes(gSFA, 0, 2))
        tBsSFB, tBgSFB = cpasync.tma_partition(tma_sfb, 0, one, cute.group_modes(sSFB, 0, 2),
                                               cute.group_modes(gSFB, 0, 2))
        tAsSFA, tAgSFA = cute.filter_zeros(tAsSFA), cute.filter_zeros(tAgSFA)
        tBsSFB, tBgSFB = cute.filter_zeros(tBsSFB), cute.filter_zeros(tBgSFB)
        cute.arch.sync_threads()

        start = cta * per
        end = cutlass.min(start + per, total)

        if warp == self.tma_warp:
            prod = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
            for it in cutlass.range(start, end, unroll=1):
                t = it // k_tiles
                kt = it - t * k_tiles
                tm = t // tiles_n
                tn = t - tm * tiles_n
                ab.producer_acquire(prod)
                bar = ab.producer_get_barrier(prod)
                cute.copy(tma_a, tAgA[(None, tm, kt, 0)], tAsA[(None, prod.index)], tma_bar_ptr=bar)
                cute.copy(tma_b, tBgB[(None, tn, kt, 0)], tBsB[(None, prod.index)], tma_bar_ptr=bar)
                cute.copy(tma_sfa, tAgSFA[(None, tm, kt, 0)], tAsSFA[(None, prod.index)], tma_bar_ptr=bar)
                cute.copy(tma_sfb, tBgSFB[(None, tn, kt, 0)], tBsSFB[(None, prod.index)], tma_bar_ptr=bar)
                prod.advance()
            ab.producer_tail(prod)

        if warp < MMA_WARPS:
            thr = tiled_mma.get_slice(tidx)
            tCrA = tiled_mma.make_fragment_A(thr.partition_A(sA)[(None, None, None, 0)])
            tCrB = tiled_mma.make_fragment_B(thr.partition_B(sB)[(None, None, None, 0)])
            tCrSFA = sm120_utils.partition_fragment_SFA(sSFA[(None, None, 0)], thr, tidx)
            tCrSFB = sm120_utils.partition_fragment_SFB(sSFB[(None, None, 0)], thr, tidx)
            if cutlass.const_expr(self.tile[0] > PERM_M):
                # (V, M in the 128-row permutation, M rest, K...): both M modes together, in
                # the order of tCrA's M mode, so that MMA m uses the scales of rows m * 64.
                tCrSFA = cute.group_modes(tCrSFA, 1, 3)
            tCrSFA = cute.group_modes(tCrSFA, 2, cute.rank(tCrSFA))
            tCrSFB = cute.group_modes(tCrSFB, 2, cute.rank(tCrSFB))
            acc = cute.make_rmem_tensor(thr.partition_C(gC).shape[:3], cutlass.Float32)

            ld = cute.nvgpu.warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4)
            cp_a = cute.make_tiled_copy_A(cute.make_copy_atom(ld, cutlass.Float4E2M1FN), tiled_mma)
            cp_b = cute.make_tiled_copy_B(cute.make_copy_atom(ld, cutlass.Float4E2M1FN), tiled_mma)
            sf_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.sf_dtype)
            perm = tiled_mma.permutation_mnk
            cp_sfa = cute.make_tiled_copy(sf_atom, sm120_utils.get_layoutSFA_TV(tiled_mma),
                                          (cute.size(perm[0]), cute.size(perm[2])))
            cp_sfb = cute.make_tiled_copy(sf_atom, sm120_utils.get_layoutSFB_TV(tiled_mma),
                                          (cute.size(perm[1]), cute.size(perm[2])))
            t_a, t_b = cp_a.get_slice(tidx), cp_b.get_slice(tidx)
            t_sfa, t_sfb = cp_sfa.get_slice(tidx), cp_sfb.get_slice(tidx)
            sA_v, rA_v = t_a.partition_S(sA), t_a.retile(tCrA)
            sB_v, rB_v = t_b.partition_S(sB), t_b.retile(tCrB)
            sSFA_v = cute.filter_zeros(t_sfa.partition_S(sSFA))
            rSFA_v = cute.filter_zeros(t_sfa.retile(tCrSFA))
            sSFB_v = cute.filter_zeros(t_sfb.partition_S(sSFB))
            rSFB_v = cute.filter_zeros(t_sfb.retile(tCrSFB))
            k_blocks = cute.size(tCrA, mode=[2])

            alpha = cutlass.Float32(1.0)
            if cutlass.const_expr(self.has_alpha):
                alpha = cute.make_tensor(alpha_ptr, cute.make_layout(1))[0]
            cons = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
            it = start
            while it < end:
                t = it // k_tiles
                k0 = it - t * k_tiles
                k1 = cutlass.min(k_tiles, k0 + end - it)
                tm = t // tiles_n
                tn = t - tm * tiles_n
                acc.fill(0.0)
                for _ in cutlass.range(k0, k1, unroll=1):
                    ab.consumer_wait(cons)
                    s = cons.index
                    for kb in cutlass.range_constexpr(k_blocks):
                        cute.copy(cp_a, sA_v[(None, None, kb, s)], rA_v[(None, None, kb)])
                        cute.copy(cp_b, sB_v[(None, None, kb, s)], rB_v[(None, None, kb)])
                        cute.copy(cp_sfa, sSFA_v[(None, None, kb, s)], rSFA_v[(None, None, kb)])
                        cute.copy(cp_sfb, sSFB_v[(None, None, kb, s)], rSFB_v[(None, None, kb)])
                        cute.gemm(tiled_mma, acc, [tCrA[(None, None, kb)], tCrSFA[(None, None, kb)]],
                                  [tCrB[(None, None, kb)], tCrSFB[(None, None, kb)]], acc)
                    ab.consumer_release(cons)
                    cons.advance()
                it = it + (k1 - k0)
                store = True
                if cutlass.const_expr(self.stream_k):
                    store = self._fixup(acc, ws_ptr, cta, t, k0, k1, k_tiles, per, tidx)
                if store:
                    tCgC = thr.partition_C(gC[(None, None, tm, tn, 0)])
                    tCcC = thr.partition_C(cC[(None, None, tm, tn, 0)])
                    for i in cutlass.range_constexpr(cute.size(acc)):
                        crd = tCcC[i]
                        if crd[0] < mC.shape[0] and crd[1] < mC.shape[1]:
                            tCgC[i] = (acc[i] * alpha).to(self.c_dtype)

    @cute.jit
    def _fixup(self, acc: cute.Tensor, ws_ptr: cute.Pointer, cta: Int32, t: Int32, k0: Int32,
               k1: Int32, k_tiles: Int32, per: Int32, tidx: Int32) -> cutlass.Boolean:
        """Stream-K partial-tile exchange; True when this CTA stores the tile."""
        frag = cute.size(acc)
        threads = 32 * MMA_WARPS
        words = self.tile[0] * self.tile[1]
        flags = cute.make_tensor(ws_ptr, cute.make_layout(FLAG_WORDS))
        parts = cute.recast_ptr(ws_ptr + FLAG_WORDS, dtype=cutlass.Float32)
        store = k1 == k_tiles and k0 == 0
        if k0 > 0:
            # Contributor: publish the partial of the tile this CTA's range starts inside.
            mine = cute.make_tensor(parts + cta * words, cute.make_layout((frag, threads), stride=(threads, 1)))
            for i in cutlass.range_constexpr(frag):
                mine[i, tidx] = acc[i]
            cute.arch.fence_acq_rel_gpu()
            self.mma_barrier.arrive_and_wait()
            if tidx == 0:
                _store_release((flags.iterator + cta).toint(), Int32(1))
        elif k1 < k_tiles:
            # Owner of k = 0: add the partials of the CTAs that hold the rest of the tile.
            last = (t * k_tiles + k_tiles - 1) // per
            for peer in cutlass.range(cta + 1, last + 1, unroll=1):
                if tidx == 0:
                    while _load_acquire((flags.iterator + peer).toint()) == 0:
                        pass
                    flags[peer] = Int32(0)
                self.mma_barrier.arrive_and_wait()
                theirs = cute.make_tensor(parts + peer * words,
                                          cute.make_layout((frag, threads), stride=(threads, 1)))
                for i in cutlass.range_constexpr(frag):
                    acc[i] = acc[i] + theirs[i, tidx]
            store = True
        return store
