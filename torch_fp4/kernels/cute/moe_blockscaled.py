"""Grouped NVFP4 x NVFP4 (W4A4) block-scaled GEMMs of the fused MoE on tcgen05, in CuTe DSL, and
their MXFP4 x MXFP4 twins (MoeKey.nvfp4 False: e8m0 scales per 32 elements, `.block32`; MXFP4
experts with MXFP4 activations).

Status: compiled and SASS-checked in CI for sm_100a and sm_103a (tests/test_cute_moe_compile.py),
never run (compiled, not run): no Blackwell GPU was available. Treat every result as unverified
until it has been compared with torch_fp4.reference.fused_moe on a B200/B300. Wired as the
opt-in `cute-dsl` fused_moe backend by moe_fused.py (W4A4; "auto" never picks it); that wiring
is tested on a CPU with an emulation of this module's contract in place of the kernel.

One launch covers every expert. A (the activations) is row-grouped by expert: rows
[128 b, 128 b + 128) belong to expert block_expert[b // (block_m / 128)] (-1: unused block,
its CTAs exit at once), FP4 data [rows, K/2] and 128x4 scales [rows, Kp], so each 128-row
block is one scale-atom row tile. B is the per-expert weight [E, N, K/2] with per-expert 128x4
scales [E, Np, Kp]; its TMA descriptors span the 3-D tensors and the CTA picks its expert's
tile with the expert as the outer (batch) coordinate. alpha is fp32 [E] on the device.
Output: bf16 [rows, N_out], every row of a used block written (padding rows hold garbage).

The kernel is mm_blockscaled.BlockScaledGemmSm100 (warp-specialized TMA / MMA / epilogue,
`tcgen05.mma.cta_group::1.kind::mxf4nvf4.block_scale.block16`, scale factors copied to tensor
memory) with these changes only: the B and SFB tensors carry the expert mode, the CTA reads its
block's expert id and runs the dense tile body at batch coordinate = expert, alpha is
alpha[expert], and FC1 has its own epilogue:
- FC2 (plain): out[r, n] = RN_bf16(alpha[e] * acc[r, n]), predicated on n < N.
- FC1 (SwiGLU, w1 [E, 2I, H/2] with [gate; up] rows, I a multiple of 128, tile_n = 256): B is
  viewed with a hierarchical N mode (128, 2, I/128): virtual row (r, h, j) is w1 row
  h I + 128 j + r, so the 256-row B box of N tile j holds gate rows [128 j, 128 j + 128) then
  the matching up rows (TMA box over two gmem dimensions; the SFB atoms are re-strided the same
  way). One N=256 MMA per k-block therefore accumulates gate in tensor-memory columns 0..127 and
  up in 128..255; the epilogue pairs column c with c + 128 and writes
  out[r, 128 j + c] = RN_bf16(silu(g) * u), g = RN_bf16(alpha[e] * gate), u = RN_bf16(alpha[e]
  * up), silu(g) = g / (1 + exp(-g)) in fp32 with `.rn` multiply/add/divide (inline PTX) and
  libdevice expf, as torch_fp4.reference.silu_mul.

Wiring (moe_fused.py; its glue is tested on a CPU, the kernels have not run): grouping =
moe_align.align(topk_ids, E, offset, block_m=128) (the 2x1-cluster tactics would need
block_m=256 grouping; the launcher uses the 1x1 default tactics); A = the activation rows
gathered in sorted order, x[clamp(sorted_pairs, 0, T k - 1) // k] (the clamp covers the
undefined sorted_pairs entries of padding rows), quantized to NVFP4 (a1_global_scale, the
Triton quantize kernel, 128x4 layout) so that each 128-row block's scales are one atom row
tile; FC1 = grouped_gemm(..., swiglu=True) with alpha1 = nvfp4_alpha(a1_gs, w1_gs) [E]; its bf16
[rows, I] output quantized to NVFP4 with a2_global_scale ([1]: one quantize; [E]: a batched
quantize of [blocks, 128, I] with per-block scales a2[block_expert]); FC2 = grouped_gemm(...,
swiglu=False) with alpha2; then a finalize that reads the row of pair p through the inverse of
sorted_pairs (FC2's rows are in sorted order, not pair order). Padding rows (past expert_end)
hold undefined values in A and therefore in both outputs; they are confined to their own rows
(NVFP4 blocks run along K) and are never read by the finalize.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.utils.blockscaled_layout as bs_layout
from cutlass import Float32, Int32
from cutlass.cute.arch import inline_ptx
from cutlass.runtime import make_fake_stream

from ... import formats as F
from .mm_blockscaled import BlockScaledGemmSm100, _aligned, _arch, _ptr, compile_mm
from .mm_tactics import Sm100MmTactic
from .moe_tactics import MOE_SPACE, TILE_M, Sm100MoeTactic


def _f32(ptx: str, *args) -> Float32:
    return inline_ptx(ptx, write_only_types=[Float32], read_only_args=list(args))


def mul_rn(a, b):
    return _f32("mul.rn.f32 {$w0}, {$r0}, {$r1};", Float32(a), Float32(b))


def add_rn(a, b):
    return _f32("add.rn.f32 {$w0}, {$r0}, {$r1};", Float32(a), Float32(b))


def div_rn(a, b):
    return _f32("div.rn.f32 {$w0}, {$r0}, {$r1};", Float32(a), Float32(b))


def rn_bf16(a):
    """fp32 -> nearest bf16 (ties to even), returned as fp32."""
    return _f32("{ .reg .b16 h; cvt.rn.bf16.f32 h, {$r0}; cvt.f32.bf16 {$w0}, h; }", Float32(a))


def gate_up_sf_layout(inter, k, experts, sf_vec: int) -> cute.Layout:
    """128x4 scale factors of w1 [E, 2I, K] (I a multiple of 128) indexed by the virtual B row
    (r, h, j) -> w1 row h I + 128 j + r: the 128-row atom index (h, j) maps to atom h I/128 + j."""
    sf = bs_layout.tile_atom_to_shape_SF((2 * inter, k, experts), sf_vec)
    j = inter // 128
    s = sf.stride[0][1]        # bytes between 128-row scale atoms
    return cute.make_layout(((sf.shape[0][0], (2, j)), sf.shape[1], sf.shape[2]),
                            stride=((sf.stride[0][0], (j * s, s)), sf.stride[1], sf.stride[2]))


class GroupedBlockScaledGemmSm100(BlockScaledGemmSm100):
    """Grouped MoE GEMM (FC1 with SwiGLU, or FC2): one instance per (tactic, swiglu, block_m)."""

    def __init__(self, tactic: Sm100MoeTactic, swiglu: bool, block_m: int, nvfp4: bool = True):
        dense = Sm100MmTactic(TILE_M, tactic.tile_n, tactic.tile_k, tactic.cluster_m, 1)
        super().__init__(dense, nvfp4=nvfp4, out="bf16", has_alpha=True)
        self.swiglu = swiglu
        self.blocks_per_id = block_m // TILE_M

    @cute.jit
    def __call__(self, a_ptr: cute.Pointer, b_ptr: cute.Pointer, sfa_ptr: cute.Pointer,
                 sfb_ptr: cute.Pointer, c_ptr: cute.Pointer, alpha_ptr: cute.Pointer,
                 expert_ptr: cute.Pointer, rows: Int32, n_out: Int32, k: Int32, experts: Int32,
                 stream: cuda.CUstream):
        kk = cute.assume(k, 32)
        a = cute.make_tensor(a_ptr, cute.make_ordered_layout((rows, kk, 1), order=(1, 0, 2)))
        sfa = cute.make_tensor(sfa_ptr, bs_layout.tile_atom_to_shape_SF(a.shape, self.sf_vec))
        if cutlass.const_expr(self.swiglu):
            inter = cute.assume(n_out, 128)
            j = inter // 128
            n_b = 2 * inter
            # virtual B row (r, h, j) = w1 row h I + 128 j + r: gate tile j, then its up tile
            b = cute.make_tensor(b_ptr, cute.make_layout(
                ((128, 2, j), kk, experts), stride=((kk, inter * kk, 128 * kk), 1, n_b * kk)))
            sfb = cute.make_tensor(sfb_ptr, gate_up_sf_layout(inter, kk, experts, self.sf_vec))
            # out column 128 j + c for both the gate (h = 0) and up (h = 1) halves
            c = cute.make_tensor(c_ptr, cute.make_layout(
                (rows, (128, 2, j), 1), stride=(inter, (1, 0, 128), 0)))
        else:
            n_b = n_out
            b = cute.make_tensor(b_ptr, cute.make_ordered_layout((n_out, kk, experts),
                                                                 order=(1, 0, 2)))
            sfb = cute.make_tensor(sfb_ptr, bs_layout.tile_atom_to_shape_SF(b.shape, self.sf_vec))
            c = cute.make_tensor(c_ptr, cute.make_ordered_layout((rows, n_out, 1), order=(1, 0, 2)))
        ops = self.setup(a, b, sfa, sfb, n_b)
        grid = (cute.round_up(cute.ceil_div(rows, TILE_M), self.cluster_mn[0]),
                cute.ceil_div(n_b, self.mma_tiler[1]), 1)
        self.grouped_kernel(*ops, c, alpha_ptr, self.cluster_vmnk, self.cluster_sfb_vmnk,
                            *self.smem_layouts, self.epi_tile, expert_ptr).launch(
            grid=grid, block=[self.threads, 1, 1], cluster=(*self.cluster_mn, 1), stream=stream)

    @cute.kernel
    def grouped_kernel(self, tiled_mma: cute.TiledMma, tiled_mma_sfb: cute.TiledMma,
                       tma_a: cute.CopyAtom, mA: cute.Tensor, tma_b: cute.CopyAtom,
                       mB: cute.Tensor, tma_sfa: cute.CopyAtom, mSFA: cute.Tensor,
                       tma_sfb: cute.CopyAtom, mSFB: cute.Tensor, mC: cute.Tensor,
                       alpha_ptr: cute.Pointer, cluster_vmnk: cute.Layout,
                       cluster_sfb_vmnk: cute.Layout, a_sl: cute.ComposedLayout,
                       b_sl: cute.ComposedLayout, sfa_sl: cute.Layout, sfb_sl: cute.Layout,
                       epi_tile: cute.Tile, expert_ptr: cute.Pointer):
        bidx, bidy, _ = cute.arch.block_idx()
        # Every CTA of a cluster sees the same expert (block_m is a multiple of 128 cluster_m),
        # so whole clusters exit together.
        expert = cute.make_tensor(expert_ptr + bidx // self.blocks_per_id, cute.make_layout(1))[0]
        if expert >= 0:
            self.run_tile(tiled_mma, tiled_mma_sfb, tma_a, mA, tma_b, mB, tma_sfa, mSFA,
                          tma_sfb, mSFB, mC, alpha_ptr, cluster_vmnk, cluster_sfb_vmnk, a_sl,
                          b_sl, sfa_sl, sfb_sl, epi_tile, (bidx, bidy, 0), expert)

    def load_alpha(self, alpha_ptr, batch):
        return cute.make_tensor(alpha_ptr + batch, cute.make_layout(1))[0]

    @cute.jit
    def store_tile(self, t2r: cute.TiledCopy, tTR_tAcc: cute.Tensor, tTR_rAcc: cute.Tensor,
                   tTR_gC: cute.Tensor, tTR_cC: cute.Tensor, mC: cute.Tensor, alpha: Float32):
        if cutlass.const_expr(not self.swiglu):
            BlockScaledGemmSm100.store_tile(self, t2r, tTR_tAcc, tTR_rAcc, tTR_gC, tTR_cC, mC,
                                            alpha)
        else:
            # Epilogue slices en (gate columns) and en + half (the up columns 128 further).
            half = cute.size(tTR_tAcc, mode=[4]) // 2
            up = cute.make_rmem_tensor_like(tTR_rAcc)
            for em in cutlass.range_constexpr(cute.size(tTR_tAcc, mode=[3])):
                for en in cutlass.range_constexpr(half):
                    cute.copy(t2r, tTR_tAcc[(None, None, None, em, en)], tTR_rAcc)
                    cute.copy(t2r, tTR_tAcc[(None, None, None, em, en + half)], up)
                    dst = tTR_gC[(None, None, None, em, en)]
                    for i in cutlass.range_constexpr(cute.size(tTR_rAcc)):
                        g = rn_bf16(mul_rn(tTR_rAcc[i], alpha))
                        u = rn_bf16(mul_rn(up[i], alpha))
                        silu = div_rn(g, add_rn(1.0, cute.math.exp(-g, fastmath=False)))
                        dst[i] = mul_rn(silu, u).to(cutlass.BFloat16)


# ---------------------------------------------------------------------------------------------
# Compile key and launcher
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MoeKey:
    tactic: Sm100MoeTactic
    swiglu: bool      # FC1 (SwiGLU epilogue) or FC2 (plain)
    block_m: int      # rows per block_expert entry (128, or 256 for cluster_m = 2)
    arch: str         # "sm_100a" / "sm_103a"
    nvfp4: bool = True  # NVFP4 operands (e4m3 / 16, kind::mxf4nvf4), else MXFP4 (e8m0 / 32, kind::mxf4)

    def build(self):
        return GroupedBlockScaledGemmSm100(self.tactic, self.swiglu, self.block_m, self.nvfp4)


def _args(a, sfa, w, sfw, out, alpha, ids, rows, n_out, k, experts, stream, nvfp4=True):
    f4, sf = cutlass.Float4E2M1FN, (cutlass.Float8E4M3FN if nvfp4 else cutlass.Float8E8M0FNU)
    return (_ptr(f4, a), _ptr(f4, w), _ptr(sf, sfa), _ptr(sf, sfw), _ptr(cutlass.BFloat16, out),
            _ptr(cutlass.Float32, alpha, 4), _ptr(cutlass.Int32, ids, 4), Int32(rows),
            Int32(n_out), Int32(k), Int32(experts), stream)


def compile_only(key: MoeKey):
    """Compile `key` with placeholder pointers (no GPU; target = CUTE_DSL_ARCH) and return the
    compiled function with its __ptx__ and __cubin__."""
    args = _args(None, None, None, None, None, None, None, 512, 256, 512, 8, make_fake_stream(), key.nvfp4)
    return cute.compile(key.build(), *args, options="--keep-ptx --keep-cubin")


def grouped_gemm(a: torch.Tensor, a_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor,
                 alpha: torch.Tensor, block_expert: torch.Tensor, swiglu: bool,
                 block_m: int = 128, tactic: Optional[Sm100MoeTactic] = None, mx: bool = False) -> torch.Tensor:
    """Grouped W4A4 GEMM over expert-grouped rows (compiled, not run).

    a: NVFP4 [rows, K/2] (MXFP4 with mx: both operands, e8m0 scales per 32 elements, kind::mxf4;
    uint8 or float4 packed), rows = block_expert.numel() * block_m, with
    128x4 scales a_scale [rows, Kp]; w: [E, N, K/2] with scales w_scale [E, Np, Kp] (128x4 per
    expert); alpha: fp32 [E]; block_expert: int32 [rows / block_m], -1 for unused blocks.
    swiglu=True (FC1, w = w1 with [gate; up] rows, N = 2I): returns bf16 [rows, I] =
    RN_bf16(silu(RN_bf16(alpha h_gate)) * RN_bf16(alpha h_up)); swiglu=False (FC2): bf16
    [rows, N] = RN_bf16(alpha[e] * a @ w[e]^T). Rows of unused blocks are not written."""
    args = (a, a_scale, w, w_scale, alpha, block_expert, swiglu, block_m)
    if tactic is None:
        tactic = MOE_SPACE.default(*args)
    reason = MOE_SPACE.why_not(tactic, *args)
    if reason is not None:
        raise ValueError(f"grouped_gemm: tactic {tactic.label()} cannot run this problem: {reason}")
    rows, k = a.shape[0], 2 * a.shape[1]
    experts, n_w = w.shape[0], w.shape[1]
    n_out = n_w // 2 if swiglu else n_w
    out = torch.empty((rows, n_out), dtype=torch.bfloat16, device=a.device)
    key = MoeKey(tactic, swiglu, block_m, _arch(a.device), not mx)
    stream = cuda.CUstream(torch.cuda.current_stream(a.device).cuda_stream)
    call = _args(_aligned(F.as_uint8(a)), _aligned(F.as_uint8(a_scale)), _aligned(F.as_uint8(w)),
                 _aligned(F.as_uint8(w_scale)), out, _aligned(alpha.float().reshape(-1)),
                 _aligned(block_expert.int()), rows, n_out, k, experts, stream, not mx)
    fn = compile_mm(key, *call)
    with torch.cuda.device(a.device):
        fn(*call)
    return out
