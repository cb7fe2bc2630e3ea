"""The `cute-dsl` fused_moe backend (opt-in, W4A4 only): the grouped tcgen05 GEMMs of
moe_blockscaled.py wired into a launcher with torch_fp4.reference.fused_moe's signature.

Status: the grouped GEMM kernels are compiled for sm_100a / sm_103a and never run (no Blackwell
GPU was available). The glue below (grouping, gather, quantizations, alphas, inverse
permutation, finalize) is checked on a CPU against the reference bit for bit, with Triton's
interpreter for the Triton kernels and a PyTorch emulation of the grouped GEMM's contract in
place of the CuTe kernel (tests/test_cute_moe_wiring.py). `"auto"` never picks this backend
(torch_fp4.tuning.OP_ORDER); ask for it with `backend="cute-dsl"`.

Launches, all on the current stream, none reading anything back (CUDA-graph safe by
construction: every buffer is sized from upper bounds of the shapes):
1. moe_align.align(topk_ids, E, offset, block_m=128): pairs grouped by local expert, each
   expert padded to 128-row blocks; block_expert[b] (-1 past the used rows).
2. A = x[clamp(sorted_pairs, 0, T k - 1) // k]: x's rows in sorted order (torch index_select).
   Padding rows' sorted_pairs entries are undefined, hence the clamp; those rows then hold some
   token's row, are never read back, and stay confined to their own rows (NVFP4 blocks run
   along K).
3. nvfp4_quantize(A, a1_global_scale, 128x4) (the Triton quantize kernel) over the whole
   [rows, H] matrix: its 128-row scale tiles are exactly the grouping's blocks, which is the
   layout the grouped GEMM reads. Quantizing after the gather equals gathering the rows of
   nvfp4_quantize(x) (the quantization is row-wise), i.e. the reference's x~.
4. FC1 = grouped_gemm(A, w1, alpha1, swiglu=True) with alpha1 = formats.nvfp4_alpha(a1_gs,
   w1_gs) [E] formed on the device: bf16 [rows, I] = RN_bf16(silu(gate) * up).
5. The intermediate quantized with a2_global_scale: a [1] scale quantizes [rows, I] in one go;
   a per-expert [E] scale quantizes per block: [rows, I] viewed as [blocks, 128, I] (a batched
   quantize, one global scale per batch entry) with the per-block scales
   a2[max(block_expert, 0)]. The batched 128x4 scales of [blocks, 128, I] are byte-for-byte the
   128x4 scales of [rows, I], so FC2 reads them unchanged. The batch is the kernel's grid z:
   at most 65535 blocks (the requirement says so).
6. FC2 = grouped_gemm(A2, w2, alpha2, swiglu=False), alpha2 = nvfp4_alpha(a2_gs, w2_gs) [E]:
   bf16 [rows, H] in sorted order.
7. _inverse_kernel: inv[sorted_pairs[r]] = r for every row r holding a pair (r < expert_end of
   its block's expert); pairs routed to no local expert keep an undefined entry that nothing
   reads.
8. triton.moe_fused.finalize (through inv): out[t] = RN_out(sum_j topk_weights[t, j] * y[inv[t k + j]]) in fp32, j in
   order, starting from 0, pairs routed to no local expert adding w * 0 (the Triton backend's
   finalize, reading rows through inv; no atomics, deterministic).

Under Triton's interpreter (TRITON_INTERPRET=1, CPU tensors) the quantizations use the reference
(the interpreter's fp8 conversion does not round to nearest), as the Triton MoE launcher does.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from ... import formats as F
from ... import meta
from ...problems import MoeProblem
from .._common import prepare_outputs, use_pdl
from ..triton.moe_align import align, max_blocks
from ..triton.moe_fused import finalize
from ..triton.moe_numerics import interpreting
from .moe_tactics import TILE_M

BLOCK_M = TILE_M      # rows per block_expert entry: the 1x1-cluster tactics' grouping
MAX_QUANTIZE_BATCH = 65535   # grid z of the batched (per-block) quantize of the intermediate
_ROWS_PER_PROGRAM = 1024



@triton.jit(do_not_specialize=["n_rows"])
def _inverse_kernel(sorted_ptr, block_expert_ptr, end_ptr, inv_ptr, n_rows, BM: tl.constexpr,
                    BR: tl.constexpr, USE_GDC: tl.constexpr):
    """inv[sorted_pairs[r]] = r for the rows r that hold a pair (each pair has one such row)."""
    if USE_GDC:
        tl.extra.cuda.gdc_wait()
    r = tl.program_id(0) * BR + tl.arange(0, BR)
    in_range = r < n_rows
    e = tl.load(block_expert_ptr + r // BM, mask=in_range, other=-1)
    end = tl.load(end_ptr + tl.maximum(e, 0), mask=in_range, other=0)
    holds_pair = in_range & (e >= 0) & (r < end)
    pair = tl.load(sorted_ptr + r, mask=holds_pair, other=0)
    tl.store(inv_ptr + pair, r, mask=holds_pair)


def _nvfp4_quantize(x: torch.Tensor, gs: torch.Tensor, portable: bool):
    if portable:
        from ...reference.quantize import nvfp4_quantize
    else:
        from ..triton.quantize import nvfp4_quantize
    return nvfp4_quantize(x, gs, F.SfLayout.LAYOUT_128x4)


def _quantize_intermediate(h: torch.Tensor, a2_gs: torch.Tensor, block_expert: torch.Tensor,
                           portable: bool):
    """NVFP4 of FC1's output [rows, I] with a2 [1] (one launch) or a2 [E] (per 128-row block)."""
    if a2_gs.numel() == 1:
        return _nvfp4_quantize(h, a2_gs, portable)
    rows, inter = h.shape
    per_block = a2_gs.index_select(0, block_expert.clamp(min=0))
    data, scale = _nvfp4_quantize(h.view(rows // BLOCK_M, BLOCK_M, inter), per_block, portable)
    return data.reshape(rows, inter // 2), scale.reshape(rows, scale.shape[-1])


def _grouped_gemm(a, a_scale, w, w_scale, alpha, block_expert, swiglu: bool):
    """moe_blockscaled.grouped_gemm (imported on first use: it imports cutlass). The CPU tests
    replace this function by an emulation of the grouped GEMM's contract."""
    from .moe_blockscaled import grouped_gemm
    return grouped_gemm(a, a_scale, w, w_scale, alpha, block_expert, swiglu, block_m=BLOCK_M)


def shape_reason(p: MoeProblem) -> Optional[str]:
    """None when the grouped GEMMs' default tactics (moe_tactics.default_for) can run this
    problem on its device's compute capability, else why not (moe_tactics.why_not)."""
    from .moe_tactics import default_for, why_not
    n_blocks = max_blocks(p.tokens * p.top_k, p.experts, BLOCK_M)
    rows = n_blocks * BLOCK_M
    block_expert = torch.empty(n_blocks, dtype=torch.int32, device="meta")
    for name, k, n_w, swiglu, n_out in (("FC1", p.hidden, 2 * p.inter, True, p.inter),
                                        ("FC2", p.inter, p.hidden, False, p.hidden)):
        a = torch.empty((rows, k // 2), dtype=torch.uint8, device="meta")
        w = torch.empty((p.experts, n_w, k // 2), dtype=torch.uint8, device="meta")
        reason = why_not(default_for(p.capability, swiglu, n_out), a, None, w, None, None, block_expert,
                         swiglu, BLOCK_M, cap=p.capability)
        if reason is not None:
            return f"{name}: {reason}"
    if p.a2_per_expert and n_blocks > MAX_QUANTIZE_BATCH:
        return (f"a per-expert a2_global_scale quantizes the intermediate per 128-row block, at "
                f"most {MAX_QUANTIZE_BATCH} blocks (grid z); this problem can use {n_blocks}")
    return None


def fused_moe(x: torch.Tensor, w1: torch.Tensor, w1_scale: torch.Tensor, w1_global_scale: torch.Tensor,
              w2: torch.Tensor, w2_scale: torch.Tensor, w2_global_scale: torch.Tensor,
              topk_ids: torch.Tensor, topk_weights: torch.Tensor,
              a1_global_scale: Optional[torch.Tensor], a2_global_scale: Optional[torch.Tensor],
              local_expert_offset: int, out_dtype: torch.dtype, strict_ids: bool = False) -> torch.Tensor:
    """Launcher with torch_fp4.reference.fused_moe's signature (W4A4 only). Launches only; reads
    nothing back."""
    if a1_global_scale is None or a2_global_scale is None:
        raise ValueError("cute-dsl fused_moe needs W4A4 (a1_global_scale and a2_global_scale)")
    out = prepare_outputs(meta.fused_moe(x, out_dtype))
    tokens, hidden = x.shape
    experts = w1.shape[0]
    top_k = topk_ids.shape[1]
    if tokens == 0 or top_k == 0:
        return out.zero_() if tokens else out
    portable = interpreting()
    ids, tw = topk_ids.contiguous(), topk_weights.contiguous()
    pairs = ids.numel()
    blocks = align(ids, experts, local_expert_offset, BLOCK_M)
    # A: x's rows in sorted order (padding rows: clamped undefined entries, never read back)
    src = blocks.sorted_pairs.clamp(0, pairs - 1) // top_k
    aq, a_sf = _nvfp4_quantize(x.index_select(0, src), a1_global_scale, portable)
    alpha1 = F.nvfp4_alpha(a1_global_scale, w1_global_scale)
    h = _grouped_gemm(aq, a_sf, w1, w1_scale, alpha1, blocks.block_expert, True)
    hq, h_sf = _quantize_intermediate(h, a2_global_scale, blocks.block_expert, portable)
    alpha2 = F.nvfp4_alpha(a2_global_scale, w2_global_scale)
    y = _grouped_gemm(hq, h_sf, w2, w2_scale, alpha2, blocks.block_expert, False)
    inv = torch.empty(pairs, dtype=torch.int32, device=x.device)
    pdl = use_pdl(x.device)
    launch = dict(USE_GDC=pdl, launch_pdl=pdl, num_warps=4)
    _inverse_kernel[(triton.cdiv(blocks.rows, _ROWS_PER_PROGRAM),)](
        blocks.sorted_pairs, blocks.block_expert, blocks.expert_end, inv, blocks.rows,
        BM=BLOCK_M, BR=_ROWS_PER_PROGRAM, **launch)
    finalize(y, ids, tw, out, experts, local_expert_offset, portable, inv=inv, strict=strict_ids)
    return out
