"""Device-side grouping of the (token, slot) pairs of a top-k routing by expert, for the grouped
GEMM (torch_fp4/kernels/triton/moe_gemm.py). No host synchronization: every size below follows
from the shapes, every count stays on the device, so a CUDA graph captures it and replays it
with other routings.

Pair p = t * k + j of topk_ids [T, k] belongs to local expert e = topk_ids[t, j] - offset when
0 <= e < E; other pairs (expert parallelism: experts of other ranks) are dropped. Expert e owns
the rows [start[e], start[e] + padded[e]) of the sorted order, padded[e] = count[e] rounded up
to a multiple of block_m, so each block of block_m rows belongs to one expert. Rows
[start[e], end[e] = start[e] + count[e]) hold the expert's pairs in increasing pair order
(stable, so results are deterministic); the padding rows after them are left undefined (the GEMM
masks them by end[e]).

The buffers are sized by the upper bound of the used rows: each expert with pairs adds at most
block_m - 1 padding rows and at most min(E, T k) experts have pairs, so
rows <= T k + (block_m - 1) min(E, T k) (max_blocks). block_expert[b] is the expert of block b,
or -1 for blocks past the used rows; the GEMM's programs for those blocks exit at once.

Kernels: pairs are cut into chunks of CHUNK. _count_kernel: per chunk, each expert's count and
each pair's rank among the chunk's earlier pairs of its expert (one-hot columns and a cumulative
sum). _layout_kernel (one program): per expert, the exclusive scan of the chunk counts, then
counts, start, end and the block map. _scatter_kernel: row = start[e] + (pairs of e in earlier
chunks) + rank. When every pair fits one chunk (decode), _align_small_kernel does all three in
one program, its chunk only as wide as the pairs and its one-hot steps as wide as that allows. No
atomics: the result is a function of topk_ids alone.

align() also zeroes an optional int32 buffer for a later kernel of the same call (the arrival
counters of FC2's fused finalize), so that needs no launch of its own: the count kernel's programs
(or the one program) each clear a slice.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from .._common import use_pdl

CHUNK = 128           # pairs per program of the count and scatter kernels
EXPERT_SLICE = 64     # experts per one-hot step of the count kernel
TILE = 4096           # elements per step of the layout kernel
ZERO_STEP = 1024      # elements per store step when clearing the `zero` buffer


@dataclass(frozen=True)
class ExpertBlocks:
    """The sorted, padded layout of one routing (all int32 device tensors)."""
    sorted_pairs: torch.Tensor   # [rows] pair index t * k + j of each row (padding: 0 with
                                 # align(zero_padding=True), else undefined)
    block_expert: torch.Tensor   # [rows // block_m] local expert of each block, -1 past the used rows
    expert_start: torch.Tensor   # [E] first row of each expert
    expert_end: torch.Tensor     # [E] end of each expert's pairs (start + count)
    counts: torch.Tensor         # [E] pairs per local expert
    block_m: int

    @property
    def rows(self) -> int:
        return self.sorted_pairs.shape[0]

    @property
    def num_blocks(self) -> int:
        return self.block_expert.shape[0]


def max_blocks(pairs: int, experts: int, block_m: int) -> int:
    """Blocks of block_m rows that any routing of `pairs` pairs to `experts` experts can use."""
    return triton.cdiv(pairs + (block_m - 1) * min(experts, pairs), block_m)


@triton.jit
def _chunk(ids_ptr, c, P, lo, E, C: tl.constexpr):
    """Pairs of chunk c: (pair ids, local expert or -1, in-range mask)."""
    p = c * C + tl.arange(0, C)
    ok = p < P
    raw = tl.load(ids_ptr + p, mask=ok, other=-1)
    local = ok & (raw >= lo) & (raw < lo + E)
    return p, tl.where(local, raw - lo, -1), local, ok


@triton.jit
def _count_chunk(e, counts_ptr, E, C: tl.constexpr, ES: tl.constexpr):
    """Stores the chunk's count of each expert at counts_ptr[0:E]; returns each pair's rank among
    the chunk's earlier pairs of its expert."""
    rank = tl.zeros([C], tl.int32)
    for e0 in range(0, E, ES):
        bins = e0 + tl.arange(0, ES)
        hit = (e[:, None] == bins[None, :]).to(tl.int32)             # [C, ES] one-hot
        rank += tl.sum(hit * (tl.cumsum(hit, axis=0) - 1), axis=1)
        tl.store(counts_ptr + bins, tl.sum(hit, axis=0), mask=bins < E)
    return rank


@triton.jit
def _layout(chunk_counts_ptr, n_chunks, E, base_ptr, counts_ptr, start_ptr, end_ptr,
            block_expert_ptr, n_blocks, BM: tl.constexpr, BLOCK_E: tl.constexpr,
            CH: tl.constexpr, NB: tl.constexpr):
    ev = tl.arange(0, BLOCK_E)
    e_ok = ev < E
    running = tl.zeros([BLOCK_E], tl.int32)
    for c0 in range(0, n_chunks, CH):
        cc = c0 + tl.arange(0, CH)
        m = (cc < n_chunks)[:, None] & e_ok[None, :]
        offs = cc[:, None] * E + ev[None, :]
        tile = tl.load(chunk_counts_ptr + offs, mask=m, other=0)
        tl.store(base_ptr + offs, tl.cumsum(tile, axis=0) - tile + running[None, :], mask=m)
        running += tl.sum(tile, axis=0)
    padded = (running + (BM - 1)) // BM * BM
    start = tl.cumsum(padded, axis=0) - padded
    used = tl.sum(padded, axis=0)
    tl.store(counts_ptr + ev, running, mask=e_ok)
    tl.store(start_ptr + ev, start, mask=e_ok)
    tl.store(end_ptr + ev, start + running, mask=e_ok)
    stop = start + padded
    for b0 in range(0, n_blocks, NB):
        bb = b0 + tl.arange(0, NB)
        row0 = bb * BM
        # the expert of row0 is the number of experts whose padded rows end at or before it
        ex = tl.sum(((stop[None, :] <= row0[:, None]) & e_ok[None, :]).to(tl.int32), axis=1)
        tl.store(block_expert_ptr + bb, tl.where(row0 < used, ex, -1), mask=bb < n_blocks)


@triton.jit
def _zero_slice(zero_ptr, n_zero, c, n_programs, Z: tl.constexpr):
    """Program c of n_programs clears its share of zero_ptr[0:n_zero], Z elements per step."""
    per = tl.cdiv(tl.cdiv(n_zero, n_programs), Z) * Z
    for z0 in range(c * per, tl.minimum(n_zero, c * per + per), Z):
        zz = z0 + tl.arange(0, Z)
        tl.store(zero_ptr + zz, tl.zeros([Z], tl.int32), mask=zz < n_zero)


@triton.jit(do_not_specialize=["P", "lo", "n_zero"])
def _count_kernel(ids_ptr, P, lo, E, chunk_counts_ptr, rank_ptr, zero_ptr, n_zero,
                  C: tl.constexpr, ES: tl.constexpr, Z: tl.constexpr, USE_GDC: tl.constexpr):
    if USE_GDC:
        tl.extra.cuda.gdc_wait()
    c = tl.program_id(0)
    _zero_slice(zero_ptr, n_zero, c, tl.num_programs(0), Z)
    p, e, local, ok = _chunk(ids_ptr, c, P, lo, E, C)
    rank = _count_chunk(e, chunk_counts_ptr + c.to(tl.int64) * E, E, C, ES)
    tl.store(rank_ptr + p, rank, mask=ok)


@triton.jit(do_not_specialize=["n_chunks", "n_blocks"])
def _layout_kernel(chunk_counts_ptr, n_chunks, E, base_ptr, counts_ptr, start_ptr, end_ptr,
                   block_expert_ptr, n_blocks, BM: tl.constexpr, BLOCK_E: tl.constexpr,
                   CH: tl.constexpr, NB: tl.constexpr, USE_GDC: tl.constexpr):
    if USE_GDC:
        tl.extra.cuda.gdc_wait()
    _layout(chunk_counts_ptr, n_chunks, E, base_ptr, counts_ptr, start_ptr, end_ptr,
            block_expert_ptr, n_blocks, BM, BLOCK_E, CH, NB)


@triton.jit(do_not_specialize=["P", "lo"])
def _scatter_kernel(ids_ptr, P, lo, E, rank_ptr, base_ptr, start_ptr, sorted_ptr,
                    C: tl.constexpr, USE_GDC: tl.constexpr):
    if USE_GDC:
        tl.extra.cuda.gdc_wait()
    c = tl.program_id(0)
    p, e, local, ok = _chunk(ids_ptr, c, P, lo, E, C)
    e0 = tl.where(local, e, 0)
    rank = tl.load(rank_ptr + p, mask=ok, other=0)
    row = (tl.load(start_ptr + e0, mask=local, other=0)
           + tl.load(base_ptr + c.to(tl.int64) * E + e0, mask=local, other=0) + rank)
    tl.store(sorted_ptr + row, p, mask=local)


@triton.jit(do_not_specialize=["P", "lo", "n_blocks", "n_zero"])
def _align_small_kernel(ids_ptr, P, lo, E, chunk_counts_ptr, base_ptr, counts_ptr, start_ptr,
                        end_ptr, block_expert_ptr, n_blocks, sorted_ptr, zero_ptr, n_zero,
                        C: tl.constexpr, ES: tl.constexpr, BM: tl.constexpr,
                        BLOCK_E: tl.constexpr, CH: tl.constexpr, NB: tl.constexpr,
                        Z: tl.constexpr, USE_GDC: tl.constexpr):
    """All pairs in one chunk: count, layout and scatter in one program (global memory written
    by one step is read by the next after a barrier)."""
    if USE_GDC:
        tl.extra.cuda.gdc_wait()
    _zero_slice(zero_ptr, n_zero, 0, 1, Z)
    p, e, local, ok = _chunk(ids_ptr, 0, P, lo, E, C)
    rank = _count_chunk(e, chunk_counts_ptr, E, C, ES)
    tl.debug_barrier()
    _layout(chunk_counts_ptr, 1, E, base_ptr, counts_ptr, start_ptr, end_ptr, block_expert_ptr,
            n_blocks, BM, BLOCK_E, CH, NB)
    tl.debug_barrier()
    row = tl.load(start_ptr + tl.where(local, e, 0), mask=local, other=0) + rank
    tl.store(sorted_ptr + row, p, mask=local)


def align(topk_ids: torch.Tensor, experts: int, local_expert_offset: int, block_m: int,
          zero: Optional[torch.Tensor] = None, zero_padding: bool = False) -> ExpertBlocks:
    """Group the pairs of topk_ids [T, k] (int32, contiguous) by local expert, each expert padded
    to a multiple of block_m rows; also set the int32 tensor `zero` (if given) to 0, or with
    zero_padding the padding rows' sorted_pairs entries (the whole buffer is cleared before the
    pairs are scattered into it). Launches only; reads nothing back."""
    if zero is not None and zero_padding:
        raise ValueError("align: zero and zero_padding clear through the same slot; pass one of them")
    dev = topk_ids.device
    pairs = topk_ids.numel()
    n_blocks = max_blocks(pairs, experts, block_m)
    n_chunks = max(1, triton.cdiv(pairs, CHUNK))
    i32 = dict(dtype=torch.int32, device=dev)
    out = ExpertBlocks(sorted_pairs=torch.empty(n_blocks * block_m, **i32),
                       block_expert=torch.empty(n_blocks, **i32),
                       expert_start=torch.empty(experts, **i32), expert_end=torch.empty(experts, **i32),
                       counts=torch.empty(experts, **i32), block_m=block_m)
    chunk_counts = torch.empty(n_chunks * experts, **i32)
    base = torch.empty(n_chunks * experts, **i32)
    block_e = triton.next_power_of_2(experts)
    ch = max(1, TILE // block_e)
    pdl = use_pdl(dev)
    launch = dict(USE_GDC=pdl, launch_pdl=pdl)
    layout_args = (out.counts, out.expert_start, out.expert_end, out.block_expert, n_blocks)
    shape = dict(BM=block_m, BLOCK_E=block_e, CH=ch, NB=ch)
    ids = topk_ids.reshape(-1)
    if zero_padding:
        zero = out.sorted_pairs
    zeroed = (zero, zero.numel()) if zero is not None else (ids, 0)
    if n_chunks == 1:
        # decode: a chunk as wide as the pairs (at least 16) and as many experts per one-hot step
        # as keep it at CHUNK x EXPERT_SLICE elements; the layout reads its one chunk row alone
        c = max(16, triton.next_power_of_2(pairs))
        es = max(EXPERT_SLICE, min(block_e, CHUNK * EXPERT_SLICE // c))
        _align_small_kernel[(1,)](ids, pairs, local_expert_offset, experts, chunk_counts, base,
                                  *layout_args, out.sorted_pairs, *zeroed, C=c, ES=es,
                                  BM=block_m, BLOCK_E=block_e, CH=1, NB=ch, Z=ZERO_STEP, **launch,
                                  num_warps=4)
        return out
    rank = torch.empty(pairs, **i32)
    _count_kernel[(n_chunks,)](ids, pairs, local_expert_offset, experts, chunk_counts, rank,
                               *zeroed, C=CHUNK, ES=EXPERT_SLICE, Z=ZERO_STEP, **launch,
                               num_warps=4)
    _layout_kernel[(1,)](chunk_counts, n_chunks, experts, base, *layout_args, **shape, **launch,
                         num_warps=8)
    _scatter_kernel[(n_chunks,)](ids, pairs, local_expert_offset, experts, rank, base,
                                 out.expert_start, out.sorted_pairs, C=CHUNK, **launch, num_warps=4)
    return out
