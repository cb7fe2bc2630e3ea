"""Grouped FP4 GEMMs of the fused MoE: one launch per GEMM over every local expert.

Rows are the (token, slot) pairs sorted by expert and padded per expert to block_m rows
(torch_fp4/kernels/triton/moe_align.py). A program takes one block of block_m rows (one expert)
and one tile of block_n weight rows, and walks K decoding that expert's FP4 weight tile in
registers with the mm kernel's decode (torch_fp4/kernels/triton/mm.py). Programs of blocks past
the used rows exit at once; the grid is sized from the upper bound of used blocks, so nothing is
read back to the host. For small batches (decode) the operands are swapped as in mm's small-M
tactic: the MMA's M side runs over the weight rows and the block of sorted rows is its N side.

FC1 (_fc1_kernel): rows are gathered from x (bf16/fp16, or NVFP4 quantized once per token) by
token t = pair // k. A program computes the gate tile (w1 rows n) and the up tile (rows I + n) of
the same rows, then h = RN_bf16(alpha1[e] * acc) for both and a = RN_bf16(silu(gate) * up), silu
in fp32 exactly as torch_fp4.reference.silu_mul (so a is bit-identical when h is). W4A16 stores
a (bf16 [rows, I]); W4A4 quantizes a to NVFP4 in the epilogue with the quantize kernel's device
functions and a2_global_scale (per expert or shared): packed codes [rows, I/2] and 128x4 block
scales, bit for bit what nvfp4_quantize(a, gs) writes for those rows.

FC2 (_fc2_kernel): rows are the intermediate's sorted rows; y = RN_bf16(alpha2[e] * acc) goes to
row `pair` of a [T k, H] bf16 buffer (with split-K, for decode shapes with few programs, each
split stores its fp32 partial sums instead). The finalize is fused: each program then counts
itself in on a per-(token, column tile) counter (release: fence, barrier, acq_rel atomic), and the
program that arrives last for a token (local pairs x splits arrivals) adds that token's k rows in
slot order (moe_numerics.topk_sum, reading past L1) and writes out[t]; the order of arrival
never changes the sum. Extra programs write zeros for tokens with no local pair.

Alphas are read from device memory and formed in the kernel as torch_fp4.formats.nvfp4_alpha
does: RN(1 / RN(gs_a * gs_w[e])), or RN(1 / gs_w[e]) in W4A16.

gpt-oss's features (GptOss; W4A16): MXFP4 experts (e8m0 scales per 32 elements, the mm kernel's
MXFP4 decode, no alpha), biases added to FC1's and FC2's fp32 results before their bf16
rounding (with split-K FC2, in the finalize after the split partials' sum), and the clamped
SwiGLU in FC1's epilogue, each as torch_fp4.reference.fused_moe computes it (bit for bit under
Triton's interpreter and, on grid-exact data, on an H200: tests/test_gpu_moe.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from .. import _common
from .moe_align import ExpertBlocks
from .moe_numerics import (alpha_of, fp4_tile, mma, nvfp4_scale, rn_bf16, slot_tiles,
                           swiglu_act, topk_sum)
from .numerics import LAYOUT_128x4, e2m1_encode_doubled, nan_amax, scale_offsets


@dataclass(frozen=True)
class GemmTile:
    block_n: int        # weight rows per program (FC1: this many gate rows and as many up rows)
    block_k: int        # K elements per step, a power of two >= 64 (the launchers lower it to
                        # a divisor of K, or to 64: see block_k_for)
    num_warps: int = 4
    num_stages: int = 3


@dataclass(frozen=True)
class MoeConfig:
    block_m: int        # sorted rows per block (one expert); the MMA's N side when swap_ab
    swap_ab: bool
    fc1: GemmTile
    fc2: GemmTile
    fc2_split: int = 1  # K slices of FC2 (partials added in order by the finalize)
    fused_finalize: bool = True   # the top-k sum in FC2's epilogue, else a separate kernel

    def __post_init__(self):
        for name, v, least in (("block_m", self.block_m, 16), ("fc1.block_n", self.fc1.block_n, 16),
                               ("fc2.block_n", self.fc2.block_n, 16), ("fc1.block_k", self.fc1.block_k, 64),
                               ("fc2.block_k", self.fc2.block_k, 64), ("fc2_split", self.fc2_split, 1)):
            if v < least or v & (v - 1):
                raise ValueError(f"MoeConfig: {name}: expected a power of two >= {least}, got {v}")

    def label(self) -> str:
        return (f"bm{self.block_m}{'-swap' if self.swap_ab else ''}-fc1:{self.fc1.block_n}x"
                f"{self.fc1.block_k}w{self.fc1.num_warps}s{self.fc1.num_stages}-fc2:"
                f"{self.fc2.block_n}x{self.fc2.block_k}w{self.fc2.num_warps}s"
                f"{self.fc2.num_stages}k{self.fc2_split}{'-fin' if self.fused_finalize else ''}")


def block_k_for(k: int, preferred: int) -> int:
    """The largest of preferred, preferred/2, ..., 64 dividing K, else 64. A block_k dividing K
    keeps the decode's 4-byte scale loads inside the scale matrix; with block_k = 64 each load
    is one aligned word of the padded matrix for any K."""
    bk = preferred
    while bk > 64 and k % bk:
        bk //= 2
    return bk


def _split_for(programs: int, k: int, bk: int, sms: int) -> int:
    """K slices so that about two waves of programs stream the weights, each slice at least
    four steps long."""
    split = 1
    while programs * split < 2 * sms and k >= 8 * bk * split and split < 8:
        split *= 2
    return split


FUSED_FINALIZE_PAIRS = 128   # default_config fuses the finalize into FC2 up to this many pairs


def default_config(tokens: int, top_k: int, experts: int, hidden: int, inter: int,
                   sms: int = 132) -> MoeConfig:
    """Tiles from the rows each active expert gets on average. Up to 64 rows (decode): blocks of
    16, 32 or 64 rows, swapped operands, split-K for FC2 when programs are few; more: 128-row
    blocks, unswapped, 8 warps. The finalize runs in FC2's epilogue up to FUSED_FINALIZE_PAIRS
    (token, slot) pairs, where it saves a launch; above, as a separate bandwidth-bound kernel (in
    the epilogue, the programs that complete tokens last add slot-order reads at the end of the
    grid: measured slower on H100 from T = 1024). Every tile compiles for sm_90 without register
    spills in its main loop (block_k 256 spills; tests/test_triton_moe_compile.py checks the
    benchmark models' tiles)."""
    pairs = tokens * top_k
    active = max(1, min(experts, pairs))
    per_expert = triton.cdiv(pairs, active)
    if per_expert <= 64:
        bm = max(16, triton.next_power_of_2(per_expert))
        blocks = active * triton.cdiv(per_expert, bm)
        fc1 = GemmTile(64, block_k_for(hidden, 128))
        fc2 = GemmTile(64, block_k_for(inter, 128))
        split = _split_for(blocks * triton.cdiv(hidden, fc2.block_n), inter, fc2.block_k, sms)
        return MoeConfig(bm, True, fc1, fc2, split, fused_finalize=pairs <= FUSED_FINALIZE_PAIRS)
    fc1 = GemmTile(64, block_k_for(hidden, 64), num_warps=8)
    fc2 = GemmTile(128, block_k_for(inter, 64), num_warps=8)
    return MoeConfig(128, False, fc1, fc2, fused_finalize=False)


@triton.jit
def _block_rows(b, block_expert_ptr, expert_end_ptr, sorted_ptr, BM: tl.constexpr):
    """Expert e of block b (-1 past the used rows), its rows, which rows hold a pair, and the
    pair of each row."""
    e = tl.load(block_expert_ptr + b)
    rows = b * BM + tl.arange(0, BM)
    row_ok = rows < tl.load(expert_end_ptr + tl.maximum(e, 0))
    pairs = tl.load(sorted_ptr + rows, mask=row_ok, other=0)
    return e, rows, row_ok, pairs


@triton.jit
def _program_tile(pid, n, w_ptr, ws_ptr, w_stride, ws_stride, block_expert_ptr, expert_end_ptr,
                  sorted_ptr, BM: tl.constexpr, BN: tl.constexpr):
    """Program pid of a grouped GEMM over n weight rows: its block b (_block_rows: e, rows,
    row_ok, pairs), column tile pid_n, weight rows rn, and expert e's weights and scales."""
    tiles_n = tl.cdiv(n, BN)
    b = pid // tiles_n
    pid_n = pid % tiles_n
    e, rows, row_ok, pairs = _block_rows(b, block_expert_ptr, expert_end_ptr, sorted_ptr, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    w_e = w_ptr + e.to(tl.int64) * w_stride
    ws_e = ws_ptr + e.to(tl.int64) * ws_stride
    return b, pid_n, e, rows, row_ok, pairs, rn, w_e, ws_e


@triton.jit
def _mma_step(w0, w1, x0, x1, acc, SWAP: tl.constexpr, PORTABLE: tl.constexpr):
    """acc + one K step of weights (w0, w1: even / odd K halves) times activations (x0, x1):
    acc [BN, BM] (weight rows as the MMA's M side) when SWAP, else [BM, BN]."""
    if SWAP:
        acc = mma(w0, tl.trans(x0), acc, PORTABLE)
        acc = mma(w1, tl.trans(x1), acc, PORTABLE)
    else:
        acc = mma(x0, tl.trans(w0), acc, PORTABLE)
        acc = mma(x1, tl.trans(w1), acc, PORTABLE)
    return acc


@triton.jit
def _local_slots(ids_t, lo, E):
    """Per row of a slot tile (slot_tiles), how many slots name a local expert."""
    return tl.sum(((ids_t >= lo) & (ids_t < lo + E)).to(tl.int32), axis=1)


@triton.jit
def _act_tile(a_ptr, as_ptr, arows, n_arows, kh0, KH, n_kb, a_kp, A_FP4: tl.constexpr,
              HALF: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr,
              PORTABLE: tl.constexpr):
    """Activation rows `arows` (>= n_arows read as 0) x K elements [2 kh0, 2 kh0 + BK) as (even,
    odd) halves: NVFP4 decoded, or 16-bit loaded and split."""
    if A_FP4:
        x0, x1 = fp4_tile(a_ptr, as_ptr, arows, n_arows, kh0, KH, n_kb, a_kp, HALF, BK, EVEN_K,
                          PORTABLE, False)
    else:
        kk = 2 * kh0 + tl.arange(0, BK)
        if EVEN_K:
            mask = (arows < n_arows)[:, None]
        else:
            mask = (arows < n_arows)[:, None] & (kk < 2 * KH)[None, :]
        x = tl.load(a_ptr + arows.to(tl.int64)[:, None] * (2 * KH) + kk[None, :], mask=mask,
                    other=0.0)
        x0, x1 = tl.split(tl.reshape(x, (BM, BK // 2, 2)))
    return x0, x1


@triton.jit(do_not_specialize=["top_k", "T", "w_kp", "a_kp", "out_kp"])
def _fc1_kernel(a_ptr, as_ptr, w_ptr, ws_ptr, gsw_ptr, gsa_ptr, gs2_ptr, out_ptr, outs_ptr,
                sorted_ptr, block_expert_ptr, expert_end_ptr, b1_ptr,
                top_k, T, KH, I, w_kp, a_kp, out_kp, w_stride, ws_stride, gs2_stride, sw_alpha, sw_limit,
                A_FP4: tl.constexpr, QUANT_OUT: tl.constexpr,
                SWAP: tl.constexpr, DOT: tl.constexpr, HALF: tl.constexpr, BM: tl.constexpr,
                BN: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr,
                PORTABLE: tl.constexpr, USE_GDC: tl.constexpr, MX: tl.constexpr, BIAS: tl.constexpr,
                CLAMPED: tl.constexpr):
    if USE_GDC:
        tl.extra.cuda.gdc_wait()
    b, pid_n, e, rows, row_ok, pairs, rn, w_e, ws_e = _program_tile(
        tl.program_id(0), I, w_ptr, ws_ptr, w_stride, ws_stride, block_expert_ptr, expert_end_ptr,
        sorted_ptr, BM, BN)
    if e < 0:
        return
    tok = tl.where(row_ok, pairs // top_k, T)
    n_kb = KH // (16 if MX else 8)
    if SWAP:
        acc_g = tl.zeros((BN, BM), tl.float32)
        acc_u = tl.zeros((BN, BM), tl.float32)
    else:
        acc_g = tl.zeros((BM, BN), tl.float32)
        acc_u = tl.zeros((BM, BN), tl.float32)
    for kh0 in range(0, KH, BK // 2):
        g0, g1 = fp4_tile(w_e, ws_e, rn, I, kh0, KH, n_kb, w_kp, HALF, BK, EVEN_K, PORTABLE, MX)
        u0, u1 = fp4_tile(w_e, ws_e, I + rn, 2 * I, kh0, KH, n_kb, w_kp, HALF, BK, EVEN_K, PORTABLE, MX)
        x0, x1 = _act_tile(a_ptr, as_ptr, tok, T, kh0, KH, n_kb, a_kp, A_FP4, HALF, BM, BK, EVEN_K,
                           PORTABLE)
        g0, g1, u0, u1, x0, x1 = g0.to(DOT), g1.to(DOT), u0.to(DOT), u1.to(DOT), x0.to(DOT), x1.to(DOT)
        acc_g = _mma_step(g0, g1, x0, x1, acc_g, SWAP, PORTABLE)
        acc_u = _mma_step(u0, u1, x0, x1, acc_u, SWAP, PORTABLE)
    if SWAP:
        acc_g = tl.trans(acc_g)
        acc_u = tl.trans(acc_u)
    if not MX:   # MXFP4 experts: no global scale, alpha 1
        alpha = alpha_of(gsw_ptr, gsa_ptr, e, 0, A_FP4)
        acc_g = acc_g * alpha
        acc_u = acc_u * alpha
    if BIAS:     # RN_bf16(RN_fp32(alpha1 * acc) + b1[e]) (spec section 6)
        b1_e = b1_ptr + e.to(tl.int64) * (2 * I)
        acc_g = acc_g + tl.load(b1_e + rn, mask=rn < I, other=0.0).to(tl.float32)[None, :]
        acc_u = acc_u + tl.load(b1_e + I + rn, mask=rn < I, other=0.0).to(tl.float32)[None, :]
    act = swiglu_act(rn_bf16(acc_g, PORTABLE), rn_bf16(acc_u, PORTABLE), sw_alpha, sw_limit, CLAMPED, PORTABLE)
    rows64 = rows.to(tl.int64)
    if QUANT_OUT:
        # NVFP4 of each 16-column block of act, as the quantize kernel: even/odd element pairs,
        # block amax, scale, codes of x * 2o, NaN blocks all code 7.
        lo, hi = tl.split(tl.reshape(act, (BM, BN // 2, 2)))
        lo = tl.reshape(lo, (BM, BN // 16, 8))
        hi = tl.reshape(hi, (BM, BN // 16, 8))
        sbits, o = nvfp4_scale(nan_amax(lo, hi, 2), tl.load(gs2_ptr + e * gs2_stride), PORTABLE)
        o2 = (o * 2.0)[:, :, None]
        packed = e2m1_encode_doubled(lo * o2, 16.0) | (e2m1_encode_doubled(hi * o2, 16.0) << 4)
        packed = tl.where((o != o)[:, :, None], 0x77, packed)
        packed = tl.reshape(packed, (BM, BN // 2))
        ch = pid_n * (BN // 2) + tl.arange(0, BN // 2)
        tl.store(out_ptr + rows64[:, None] * (I // 2) + ch[None, :], packed.to(tl.uint8),
                 mask=row_ok[:, None] & (ch < I // 2)[None, :])
        kb = pid_n * (BN // 16) + tl.arange(0, BN // 16)
        sbits = tl.where((kb < I // 16)[None, :], sbits, 0)   # zero padding blocks of the last tile
        tl.store(outs_ptr + scale_offsets(rows[:, None], kb[None, :], I // 16, out_kp, LAYOUT_128x4),
                 sbits, mask=row_ok[:, None] & (kb < out_kp)[None, :])
    else:
        tl.store(out_ptr + rows64[:, None] * I + rn[None, :], act.to(tl.bfloat16),
                 mask=row_ok[:, None] & (rn < I)[None, :])


@triton.jit
def _zero_unrouted(ids_ptr, out_ptr, z, T, N, top_k, lo, E, OUT: tl.constexpr, KP: tl.constexpr,
                   ZB: tl.constexpr, BN: tl.constexpr, STRICT: tl.constexpr):
    """Tokens [z ZB, z ZB + ZB) with no pair on a local expert: out rows of zeros (no GEMM
    program arrives for them), or of NaN when STRICT (every id of the token is out of range)."""
    tok = z.to(tl.int64) * ZB + tl.arange(0, ZB)
    ok = tok < T
    ids_t, _ = slot_tiles(ids_ptr, ids_ptr, tok, ok, top_k, KP)
    none = ok & (_local_slots(ids_t, lo, E) == 0)
    for n0 in range(0, N, BN):
        cols = n0 + tl.arange(0, BN)
        fill = tl.full([ZB, BN], float("nan") if STRICT else 0.0, tl.float32)
        tl.store(out_ptr + tok[:, None] * N + cols[None, :], fill.to(OUT),
                 mask=none[:, None] & (cols < N)[None, :])


@triton.jit(do_not_specialize=["R", "P", "w_kp", "a_kp", "top_k", "T", "lo", "n_gemm"])
def _fc2_kernel(a_ptr, as_ptr, w_ptr, ws_ptr, gsw_ptr, gsa_ptr, y_ptr,
                sorted_ptr, block_expert_ptr, expert_end_ptr, ids_ptr, tw_ptr, out_ptr, cnt_ptr, b2_ptr,
                R, N, KH, P, w_kp, a_kp, w_stride, ws_stride, gsa_stride, kh_per_split,
                top_k, T, lo, E, n_gemm,
                A_FP4: tl.constexpr, SPLIT: tl.constexpr, SWAP: tl.constexpr,
                DOT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                EVEN_K: tl.constexpr, FUSED: tl.constexpr, OUT: tl.constexpr, KP: tl.constexpr,
                ZB: tl.constexpr, FIN_N: tl.constexpr, PORTABLE: tl.constexpr,
                STRICT: tl.constexpr, USE_GDC: tl.constexpr, MX: tl.constexpr, BIAS: tl.constexpr):
    if USE_GDC:
        tl.extra.cuda.gdc_wait()
    pid, pid_k = tl.program_id(0), tl.program_id(1)
    if FUSED:
        if pid >= n_gemm:
            if pid_k == 0:
                _zero_unrouted(ids_ptr, out_ptr, pid - n_gemm, T, N, top_k, lo, E, OUT, KP, ZB, BN,
                               STRICT)
            return
    b, pid_n, e, rows, row_ok, pairs, rn, w_e, ws_e = _program_tile(
        pid, N, w_ptr, ws_ptr, w_stride, ws_stride, block_expert_ptr, expert_end_ptr, sorted_ptr,
        BM, BN)
    if e < 0:
        return
    arows = tl.where(row_ok, rows, R)
    n_kb = KH // (16 if MX else 8)
    if SWAP:
        acc = tl.zeros((BN, BM), tl.float32)
    else:
        acc = tl.zeros((BM, BN), tl.float32)
    kh_begin = pid_k * kh_per_split
    kh_end = tl.minimum(KH, kh_begin + kh_per_split)
    for kh0 in range(kh_begin, kh_end, BK // 2):
        w0, w1 = fp4_tile(w_e, ws_e, rn, N, kh0, KH, n_kb, w_kp, tl.bfloat16, BK, EVEN_K, PORTABLE, MX)
        x0, x1 = _act_tile(a_ptr, as_ptr, arows, R, kh0, KH, n_kb, a_kp, A_FP4, tl.bfloat16, BM, BK,
                           EVEN_K, PORTABLE)
        w0, w1, x0, x1 = w0.to(DOT), w1.to(DOT), x0.to(DOT), x1.to(DOT)
        acc = _mma_step(w0, w1, x0, x1, acc, SWAP, PORTABLE)
    if SWAP:
        acc = tl.trans(acc)
    if FUSED:   # the block's rows and pairs again: volatile loads, fewer registers held
        rows = b * BM + tl.arange(0, BM)   # across the main loop (else the epilogue spills)
        row_ok = rows < tl.load(expert_end_ptr + e, volatile=True)
        pairs = tl.load(sorted_ptr + rows, mask=row_ok, other=0, volatile=True)
    col_ok = rn < N
    mask = row_ok[:, None] & col_ok[None, :]
    pairs64 = pairs.to(tl.int64)
    offs = pairs64[:, None] * N + rn[None, :]
    if SPLIT > 1:
        tl.store(y_ptr + pid_k.to(tl.int64) * P * N + offs, acc, mask=mask)
    else:
        if not MX:
            acc = acc * alpha_of(gsw_ptr, gsa_ptr, e, gsa_stride, A_FP4)
        if BIAS:   # RN_bf16(RN_fp32(alpha2 * acc) + b2[e]) (spec section 6)
            acc = acc + tl.load(b2_ptr + e.to(tl.int64) * N + rn, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        y = rn_bf16(acc, PORTABLE)
        tl.store(y_ptr + offs, y.to(tl.bfloat16), mask=mask)
    if FUSED:
        _finalize_in_epilogue(y_ptr, ids_ptr, tw_ptr, gsw_ptr, gsa_ptr, b2_ptr, out_ptr, cnt_ptr, pairs64,
                              row_ok, pid_n, gsa_stride, top_k, N, P, lo, E, A_FP4, SPLIT, OUT,
                              BM, BN, KP, FIN_N, PORTABLE, STRICT, MX, BIAS)


@triton.jit
def _finalize_in_epilogue(y_ptr, ids_ptr, tw_ptr, gsw_ptr, gsa_ptr, b2_ptr, out_ptr, cnt_ptr, pairs64,
                          row_ok, pid_n, gsa_stride, top_k, N, P, lo, E, A_FP4: tl.constexpr,
                          SPLIT: tl.constexpr, OUT: tl.constexpr, BM: tl.constexpr,
                          BN: tl.constexpr, KP: tl.constexpr, FIN_N: tl.constexpr,
                          PORTABLE: tl.constexpr, STRICT: tl.constexpr, MX: tl.constexpr,
                          BIAS: tl.constexpr):
    """FC2's fused finalize, after this program stored its rows of y: every (pair, split) program
    of a token's column tile counts itself in (CTA barrier, then an acq_rel atomic: the stores
    are released before the count), and the program whose count completes the token's local
    pairs x splits adds the token's k rows in slot order (topk_sum: the order of arrival never
    changes the sum)."""
    tok = tl.where(row_ok, pairs64 // top_k, 0)
    ids_t, _ = slot_tiles(ids_ptr, ids_ptr, tok, row_ok, top_k, KP)
    n_local = _local_slots(ids_t, lo, E)
    tl.debug_barrier()
    arrived = tl.atomic_add(cnt_ptr + tok * tl.cdiv(N, BN) + pid_n, 1, mask=row_ok, sem="acq_rel",
                            scope="gpu")
    last = row_ok & (arrived == n_local * SPLIT - 1)
    if tl.max(last.to(tl.int32), axis=0) > 0:
        for c0 in tl.static_range(0, BN, FIN_N):   # column slices: fewer live registers
            cols = pid_n * BN + c0 + tl.arange(0, FIN_N)
            ok = cols < N
            out = topk_sum(y_ptr, y_ptr, ids_ptr, tw_ptr, gsw_ptr, gsa_ptr, gsa_stride, b2_ptr, tok, last,
                           cols, ok, top_k, N, P, lo, E, KP, SPLIT, A_FP4, False, PORTABLE, STRICT,
                           MX, BIAS)
            if PORTABLE and OUT == tl.bfloat16:
                out = rn_bf16(out, PORTABLE)
            tl.store(out_ptr + tok[:, None] * N + cols[None, :], out.to(OUT),
                     mask=last[:, None] & ok[None, :])


_TL = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


@dataclass(frozen=True)
class GptOss:
    """gpt-oss's expert features for the grouped GEMMs (spec section 6): MXFP4 experts (no
    global scales), biases on FC1 [E, 2I] and FC2 [E, H] (fp32 or bf16), the clamped SwiGLU.
    The default is none of them."""
    mx: bool = False
    w1_bias: Optional[torch.Tensor] = None
    w2_bias: Optional[torch.Tensor] = None
    clamped: bool = False
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0

    @classmethod
    def of(cls, fmt, w1_bias: Optional[torch.Tensor], w2_bias: Optional[torch.Tensor], activation: str,
           swiglu_alpha: float, swiglu_limit: float) -> "GptOss":
        """From fused_moe's launcher arguments (the biases made contiguous)."""
        return cls(fmt.block_size == 32, None if w1_bias is None else w1_bias.contiguous(),
                   None if w2_bias is None else w2_bias.contiguous(), activation == "clamped_swiglu",
                   float(swiglu_alpha), float(swiglu_limit))


def _launch_options(device: torch.device, tile: GemmTile) -> dict:
    pdl = _common.use_pdl(device)
    return dict(USE_GDC=pdl, launch_pdl=pdl, num_warps=tile.num_warps, num_stages=tile.num_stages,
                enable_fp_fusion=False)


def fc1(x, x_scale, w1, w1_scale, w1_gs, a1_gs, a2_gs, blocks: ExpertBlocks, top_k: int,
        cfg: MoeConfig, portable: bool, gpt_oss: Optional["GptOss"] = None):
    """FC1 + SwiGLU over the sorted rows. x: bf16/fp16 [T, H], or NVFP4 data [T, H/2] with 128x4
    scales x_scale (W4A4, a1_gs given). Returns the intermediate: bf16 [rows, I] (W4A16), or
    (NVFP4 data [rows, I/2] uint8, 128x4 scales [rows padded to 128, Kp] uint8) (W4A4).
    `gpt_oss`: MXFP4 experts (w1_gs None), FC1's bias, the clamped SwiGLU (W4A16)."""
    g = gpt_oss or GptOss()
    tokens = x.shape[0]
    experts, two_i, half_h = w1.shape
    inter = two_i // 2
    w4a4 = a1_gs is not None
    dev = x.device
    rows = blocks.rows
    if w4a4:
        kp = -(-inter // 64) * 4
        out = torch.empty((rows, inter // 2), dtype=torch.uint8, device=dev)
        out_s = torch.empty((-(-rows // 128) * 128, kp), dtype=torch.uint8, device=dev)
        result = (out, out_s)
    else:
        kp = 0
        out = torch.empty((rows, inter), dtype=torch.bfloat16, device=dev)
        out_s = out
        result = out
    t = cfg.fc1
    bk = block_k_for(2 * half_h, t.block_k)
    half = torch.float16 if (x.dtype == torch.float16 and not w4a4) else torch.bfloat16
    dot = tl.float32 if portable else _TL[half]
    grid = (blocks.num_blocks * triton.cdiv(inter, t.block_n),)
    w_u8, ws_u8 = w1.view(torch.uint8), w1_scale.view(torch.uint8)
    _fc1_kernel[grid](
        x.view(torch.uint8) if w4a4 else x, x_scale.view(torch.uint8) if w4a4 else ws_u8,
        w_u8, ws_u8, *(ws_u8 if gs is None else gs for gs in (w1_gs, a1_gs if w4a4 else w1_gs,
                                                               a2_gs if w4a4 else w1_gs)), out, out_s,
        blocks.sorted_pairs, blocks.block_expert, blocks.expert_end, ws_u8 if g.w1_bias is None else g.w1_bias,
        top_k, tokens, half_h, inter, w1_scale.shape[2], x_scale.shape[1] if w4a4 else 0, kp,
        two_i * half_h, w1_scale.shape[1] * w1_scale.shape[2],
        1 if (w4a4 and a2_gs.numel() > 1) else 0, g.swiglu_alpha, g.swiglu_limit,
        A_FP4=w4a4, QUANT_OUT=w4a4, SWAP=cfg.swap_ab, DOT=dot, HALF=_TL[half],
        BM=cfg.block_m, BN=t.block_n, BK=bk, EVEN_K=2 * half_h % bk == 0,
        PORTABLE=portable, MX=g.mx, BIAS=g.w1_bias is not None, CLAMPED=g.clamped,
        **_launch_options(dev, t))
    return result


ZERO_TOKENS = 16   # tokens per program of FC2's zero-fill of tokens no local expert received


def _finalize_columns(cfg: MoeConfig, top_k: int) -> int:
    """Columns per slice of the fused finalize: its unrolled slot loop holds about 64 values per
    thread (k slots x block_m rows x columns / threads)."""
    per = 64 * 32 * cfg.fc2.num_warps // (triton.next_power_of_2(top_k) * cfg.block_m)
    return min(cfg.fc2.block_n, max(16, triton.next_power_of_2(per + 1) // 2))


def fc2_counters(tokens: int, hidden: int, cfg: MoeConfig) -> int:
    """Arrival counters FC2's fused finalize needs (one per token and column tile), to be zeroed
    before FC2 (moe_align.align(zero=...))."""
    return tokens * triton.cdiv(hidden, cfg.fc2.block_n)


def fc2(inter, w2, w2_scale, w2_gs, a2_gs, blocks: ExpertBlocks, ids: torch.Tensor,
        tw: torch.Tensor, out: torch.Tensor, lo: int, cfg: MoeConfig, portable: bool,
        counters: Optional[torch.Tensor], strict: bool = False,
        gpt_oss: Optional["GptOss"] = None) -> torch.Tensor:
    """FC2 over the sorted rows of `inter` (fc1's result). Returns y: bf16 [pairs, H] (rows of
    pairs routed to no local expert are not written), or with split-K the fp32 partial sums
    [split, pairs, H]. With cfg.fused_finalize it also writes out [T, H] (bf16/fp16/fp32): per
    token the top-k weighted sum of its pairs' rows, zeros for tokens with no local pair
    (`counters`: fc2_counters of them, int32, zero; None without the fused finalize); `strict`
    (no expert parallelism): NaN rows for tokens with an id outside [lo, lo + E). `gpt_oss`:
    MXFP4 experts (w2_gs None) and FC2's bias."""
    g = gpt_oss or GptOss()
    experts, hidden, half_i = w2.shape
    tokens, top_k = ids.shape
    pairs = ids.numel()
    w4a4 = isinstance(inter, tuple)
    a, a_s = inter if w4a4 else (inter, inter)
    dev = a.device
    t = cfg.fc2
    split = cfg.fc2_split
    bk = block_k_for(2 * half_i, t.block_k)
    per_split = triton.cdiv(triton.cdiv(2 * half_i, bk), split) * bk
    if split > 1:
        y = torch.empty((split, pairs, hidden), dtype=torch.float32, device=dev)
    else:
        y = torch.empty((pairs, hidden), dtype=torch.bfloat16, device=dev)
    n_gemm = blocks.num_blocks * triton.cdiv(hidden, t.block_n)
    fused = cfg.fused_finalize
    grid = (n_gemm + (triton.cdiv(tokens, ZERO_TOKENS) if fused else 0), split)
    w_u8, ws_u8 = w2.view(torch.uint8), w2_scale.view(torch.uint8)
    gs_w = tw if w2_gs is None else w2_gs     # MXFP4: never read
    _fc2_kernel[grid](
        a, a_s, w_u8, ws_u8, gs_w, a2_gs if w4a4 else gs_w, y,
        blocks.sorted_pairs, blocks.block_expert, blocks.expert_end, ids, tw, out,
        counters if fused else ids, tw if g.w2_bias is None else g.w2_bias,
        blocks.rows, hidden, half_i, pairs, w2_scale.shape[2],
        a_s.shape[1] if w4a4 else 0, hidden * half_i, w2_scale.shape[1] * w2_scale.shape[2],
        1 if (w4a4 and a2_gs.numel() > 1) else 0, per_split // 2,
        top_k, tokens, lo, experts, n_gemm,
        A_FP4=w4a4, SPLIT=split, SWAP=cfg.swap_ab, DOT=tl.float32 if portable else tl.bfloat16,
        BM=cfg.block_m, BN=t.block_n, BK=bk, EVEN_K=2 * half_i % bk == 0, FUSED=fused,
        OUT=_TL[out.dtype], KP=triton.next_power_of_2(top_k), ZB=ZERO_TOKENS,
        FIN_N=_finalize_columns(cfg, top_k), PORTABLE=portable, STRICT=strict, MX=g.mx,
        BIAS=g.w2_bias is not None, **_launch_options(dev, t))
    return y
