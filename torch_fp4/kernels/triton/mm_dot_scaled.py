"""mm_fp4 W4A4 on Blackwell with Triton's `tl.dot_scaled`: block-scaled tensor-core MMA.

Status: compiled and PTX/SASS-checked on CPU for sm_100a, sm_103a and sm_120a with Triton 3.6 and
3.9, and run under Triton 3.9's interpreter against the reference
(tests/test_triton_dot_scaled_compile.py); never run on a GPU (compiled, not run: no Blackwell
GPU was available). Treat its results as unverified until tests/test_gpu_mm.py has run it on a
B200/B300/RTX 50. Not yet registered in the Triton backend's tactic space; tactics:
mm_dot_scaled_tactics.DotScaledMmTactic.

Both formats are native: NVFP4 is "e2m1" data with float8e4nv (e4m3) scales per 16 elements and
lowers to `tcgen05.mma ... kind::mxf4nvf4.block_scale.block16` on sm_100/sm_103 (Triton 3.6
spells it `scale_vec::4X`); MXFP4 is "e2m1" data with uint8 (ue8m0) scales per 32 elements and
lowers to `kind::mxf4.block_scale.block32` (`scale_vec::2X`). On sm_120 both become the
warp-level `mma.sync.aligned.m16n8k64 ... block_scale` (SASS OMMA.SF). Triton 3.6 deduces the
block size from the scale dtype (e4m3: 16, otherwise 32), later versions from the scale
tensor's shape ([rows, BK / block]); both agree on what this kernel passes. The products of FP4
values and scales are exact and the MMA accumulates in fp32 (the spec's bound, section 5); the
epilogue is RN_out(alpha * acc), stored element by element under an (m < M, n < N) mask.

Scales reach the tcgen05 MMA in tensor memory. The weight's 128x4 scales (spec section 4) are
read per step as a [rows / 128, chunks * 512] load of whole 512-byte atoms (a chunk = 4
k-blocks), viewed as the 5-D array (rows / 128, chunks, 32, 4, 4), permuted to (rows / 128, 4,
32, chunks, 4) and reshaped to [rows, BK / block]: the form Triton copies to tensor memory with
`tcgen05.cp`. The activations' scales take the same path when they are 128x4 and the block has
a multiple of 128 rows; otherwise (8x4 or linear scales, or a 16..64-row swapped block) they are
gathered element by element (numerics.scale_offsets) and reach tensor memory from registers
(`tcgen05.st`). Out-of-range rows, K steps past the end and scale chunks past Kp read as 0.

The MMA's M side is 128 or 256 rows: activations, or with swap_ab the weight rows, so that a
decode batch of 16..64 rows is the MMA's N side. No split-K: small M with large K leaves SMs
idle (the decode-in-registers kernel in mm.py splits K instead).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import formats as F
from ... import meta
from .._common import prepare_outputs, use_pdl
from ...problems import MmProblem
from .mm_dot_scaled_tactics import DotScaledMmTactic, default, problem_reason, why_not
from .numerics import LAYOUT_128x4, grouped_tile, scale_offsets
from .quantize import _LAYOUT_ID

_TL = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


@triton.jit
def _fp4_rows(ptr, rows, n_rows, kh0, KH, BKH: tl.constexpr):
    """Packed bytes [rows, kh0 : kh0 + BKH) of a row-major [n_rows, KH] matrix; 0 outside."""
    kh = kh0 + tl.arange(0, BKH)
    return tl.load(ptr + rows.to(tl.int64)[:, None] * KH + kh[None, :],
                   mask=(rows < n_rows)[:, None] & (kh < KH)[None, :], other=0)


@triton.jit
def _load_scales(ptr, off, mask, MX: tl.constexpr):
    """Scale bytes at `off`: uint8 (ue8m0) for MXFP4, float8e4nv for NVFP4; 0 where masked."""
    if MX:
        s = tl.load(ptr + off, mask=mask, other=0)
    else:
        s = tl.load(ptr.to(tl.pointer_type(tl.float8e4nv)) + off, mask=mask, other=0.0)
    return s


@triton.jit
def _scales_128x4(ptr, row0, n_rows, kb0, kp, ROWS: tl.constexpr, BKB: tl.constexpr,
                  MX: tl.constexpr):
    """[ROWS, BKB] scales of rows row0.. and k-blocks kb0.. (row0 % 128 == 0, kb0 % 4 == 0) of
    a 128x4 scale matrix with kp k-block columns, read as whole 512-byte atoms."""
    R: tl.constexpr = ROWS // 128
    C: tl.constexpr = BKB // 4
    r = row0 // 128 + tl.arange(0, R)
    t = tl.arange(0, C * 512)
    off = r.to(tl.int64)[:, None] * (kp * 128) + (kb0 // 4) * 512 + t[None, :]
    mask = (r < tl.cdiv(n_rows, 128))[:, None] & ((kb0 // 4 + t // 512) < kp // 4)[None, :]
    s = _load_scales(ptr, off, mask, MX)
    return s.reshape(R, C, 32, 4, 4).trans(0, 3, 2, 1, 4).reshape(ROWS, BKB)


@triton.jit
def _scales_any(ptr, row0, n_rows, kb0, n_kb, kp, LAYOUT: tl.constexpr, ROWS: tl.constexpr,
                BKB: tl.constexpr, MX: tl.constexpr):
    """[ROWS, BKB] scales of rows row0.. and k-blocks kb0.. in any scale layout."""
    if LAYOUT == LAYOUT_128x4 and ROWS % 128 == 0:
        s = _scales_128x4(ptr, row0, n_rows, kb0, kp, ROWS, BKB, MX)
    else:
        rows = row0 + tl.arange(0, ROWS)
        kb = kb0 + tl.arange(0, BKB)
        off = scale_offsets(rows[:, None], kb[None, :], n_kb, kp, LAYOUT)
        s = _load_scales(ptr, off, (rows < n_rows)[:, None] & (kb < n_kb)[None, :], MX)
    return s


@triton.jit
def _mm_dot_scaled_kernel(a_ptr, as_ptr, b_ptr, bs_ptr, alpha_ptr, out_ptr, M, N, K, a_kp, b_kp,
                          MX: tl.constexpr, BLOCK: tl.constexpr, A_LAYOUT: tl.constexpr,
                          HAS_ALPHA: tl.constexpr, SWAP: tl.constexpr, OUT: tl.constexpr,
                          BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                          GROUP_M: tl.constexpr, USE_GDC: tl.constexpr):
    if USE_GDC:
        tl.extra.cuda.gdc_wait()
    pid = tl.program_id(0)
    pid_m, pid_n = grouped_tile(pid, M, N, BM, BN, GROUP_M)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    KH = K // 2
    n_kb = K // BLOCK
    if SWAP:
        acc = tl.zeros((BN, BM), tl.float32)
    else:
        acc = tl.zeros((BM, BN), tl.float32)
    for k0 in range(0, K, BK):
        x = _fp4_rows(a_ptr, rm, M, k0 // 2, KH, BK // 2)
        w = _fp4_rows(b_ptr, rn, N, k0 // 2, KH, BK // 2)
        sx = _scales_any(as_ptr, pid_m * BM, M, k0 // BLOCK, n_kb, a_kp, A_LAYOUT, BM,
                         BK // BLOCK, MX)
        sw = _scales_128x4(bs_ptr, pid_n * BN, N, k0 // BLOCK, b_kp, BN, BK // BLOCK, MX)
        if SWAP:
            acc = tl.dot_scaled(w, sw, "e2m1", x.T, sx, "e2m1", acc)
        else:
            acc = tl.dot_scaled(x, sx, "e2m1", w.T, sw, "e2m1", acc)
    if HAS_ALPHA:
        acc = acc * tl.load(alpha_ptr)
    if SWAP:   # acc[n, m]: store it transposed instead of moving it through shared memory
        offs = rm.to(tl.int64)[None, :] * N + rn[:, None]
        mask = (rm < M)[None, :] & (rn < N)[:, None]
    else:
        offs = rm.to(tl.int64)[:, None] * N + rn[None, :]
        mask = (rm < M)[:, None] & (rn < N)[None, :]
    tl.store(out_ptr + offs, acc.to(OUT), mask=mask)


def mm_fp4_dot_scaled(a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor,
                      b_scale: torch.Tensor, alpha: torch.Tensor | None, out_dtype: torch.dtype,
                      fmt: F.Fp4Format, layout: F.SfLayout,
                      tactic: DotScaledMmTactic | None = None,
                      problem: MmProblem | None = None) -> torch.Tensor:
    """W4A4 out [M, N] = RN_out(alpha * A @ W^T) on the current stream; b = w.T and
    b_scale = w_scale.T are views of row-major [N, K/2] / [Np, Kp] (128x4). A tactic given with
    its problem was checked by dispatch; otherwise the tactic (default: the heuristic's) is
    checked here."""
    p = problem or MmProblem.of(a, b, a_scale, b_scale, alpha, out_dtype, fmt, layout)
    t = tactic if tactic is not None else default(p)
    if problem is None or tactic is None:
        reason = problem_reason(p) or why_not(t, p)
        if reason is not None:
            raise ValueError(f"mm_fp4: tactic {t.label()} cannot run this problem: {reason}")
    out = prepare_outputs(meta.mm_fp4(a, b, out_dtype))
    m, n, k = p.m, p.n, p.k
    if out.numel() == 0:
        return out
    layout = F.SfLayout.parse(layout)
    pdl = use_pdl(a.device)
    a_kp = F.padded_scale_shape(m, k // fmt.block_size, layout)[1]
    grid = (triton.cdiv(m, t.block_m) * triton.cdiv(n, t.block_n),)
    _mm_dot_scaled_kernel[grid](
        a.view(torch.uint8), a_scale.view(torch.uint8), b.view(torch.uint8),
        b_scale.view(torch.uint8), alpha if alpha is not None else out, out,
        m, n, k, a_kp, b_scale.shape[0],
        MX=fmt is F.MXFP4, BLOCK=fmt.block_size, A_LAYOUT=_LAYOUT_ID[layout],
        HAS_ALPHA=alpha is not None, SWAP=t.swap_ab, OUT=_TL[out_dtype], BM=t.block_m,
        BN=t.block_n, BK=t.block_k, GROUP_M=t.group_m, USE_GDC=pdl, launch_pdl=pdl,
        num_warps=t.num_warps, num_stages=t.num_stages)
    return out
