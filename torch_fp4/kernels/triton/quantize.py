"""Triton kernels and launchers: NVFP4/MXFP4 quantize, dequantize, global scale.

Launchers have the reference backend's signatures (torch_fp4.reference.quantize) and launch on
the current stream. One program handles a [BM rows x BKB blocks] tile; grids cover the padded
scale matrix so the kernel itself writes the zero padding.
"""
from __future__ import annotations


import torch
import triton
import triton.language as tl

from ... import formats as F
from ... import meta
from .._common import global_scale_workspace, prepare_outputs, sm_count, use_pdl
from .numerics import (LAYOUT_LINEAR, SRC_BF16, e2m1_decode, e2m1_encode_doubled, mxfp4_block_scale, mxfp4_limit2, nan_amax,
                       nvfp4_block_scale, pair, rcp_rn, scale_offsets, ue8m0_to_float, unpair)

# No fused multiply-add may merge two of the contract's rounding steps.
_LAUNCH = dict(num_warps=4, enable_fp_fusion=False)


def _launch(device: torch.device, **overrides) -> dict:
    """Launch options: _LAUNCH, plus programmatic dependent launch when enabled (set_pdl)."""
    pdl = use_pdl(device)
    return {**_LAUNCH, **overrides, "USE_GDC": pdl, "launch_pdl": pdl}
_LAYOUT_ID = {F.SfLayout.LAYOUT_128x4: 0, F.SfLayout.LAYOUT_8x4: 1, F.SfLayout.LINEAR: 2}


@triton.jit
def _tile(M, half_k, n_kb, BLOCK: tl.constexpr, BM: tl.constexpr, BKB: tl.constexpr,
          USE_GDC: tl.constexpr):
    """The BM x BKB blocks a program handles, one block per tile row: (batch index, rows,
    k-blocks, valid blocks, first pair of each block, pair index within a block). Element pairs
    and packed bytes share one index: pair i holds elements 2i and 2i+1, byte i their codes."""
    if USE_GDC:  # launched with PDL: wait for the previous kernel's memory
        tl.extra.cuda.gdc_wait()
    pid_m, pid_k, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    r = tl.arange(0, BM * BKB)
    rows = pid_m * BM + r // BKB
    kbs = pid_k * BKB + r % BKB
    valid = (rows < M) & (kbs < n_kb)
    base = (b.to(tl.int64) * M + rows) * half_k + kbs * (BLOCK // 2)
    return b, rows, kbs, valid, base, tl.arange(0, BLOCK // 2)


@triton.jit
def _scale_base(b, M, n_kb, mp, kp, LAYOUT: tl.constexpr):
    """Offset of batch entry b's scale matrix (padded for the swizzled layouts)."""
    if LAYOUT == LAYOUT_LINEAR:
        base = b.to(tl.int64) * M * n_kb
    else:
        base = b.to(tl.int64) * mp * kp
    return base


@triton.jit
def _block_codes(x_ptr, gs_ptr, M, half_k, n_kb, gs_stride, SRC: tl.constexpr, IS_MX: tl.constexpr,
                 BLOCK: tl.constexpr, BM: tl.constexpr, BKB: tl.constexpr, USE_GDC: tl.constexpr):
    """The quantization of a program's BM x BKB blocks (one per tile row): _tile's indices, then
    the even and odd elements' E2M1 codes (int32; a block with a NaN scale all 0x7, NaN) and each
    block's scale bits (uint8)."""
    b, rows, kbs, valid, base, j = _tile(M, half_k, n_kb, BLOCK, BM, BKB, USE_GDC)
    p = tl.load(x_ptr + base[:, None] + j[None, :], mask=valid[:, None], other=0)
    if USE_GDC:
        tl.extra.cuda.gdc_launch_dependents()
    lo, hi = unpair(p, SRC)
    amax = nan_amax(lo, hi, 1)
    if IS_MX:
        sbits, o = mxfp4_block_scale(amax)
        limit2 = mxfp4_limit2(sbits.to(tl.int32))[:, None]
    else:
        sbits, o = nvfp4_block_scale(amax, tl.load(gs_ptr + b * gs_stride))
        limit2 = 16.0
    o2 = o * 2.0
    nan = (o != o)[:, None]   # a NaN scale: every element is NaN
    clo = tl.where(nan, 7, e2m1_encode_doubled(lo * o2[:, None], limit2)).to(tl.int32)
    chi = tl.where(nan, 7, e2m1_encode_doubled(hi * o2[:, None], limit2)).to(tl.int32)
    return b, rows, kbs, valid, base, j, clo, chi, sbits


@triton.jit
def _quantize_kernel(x_ptr, gs_ptr, data_ptr, scale_ptr, M, half_k, n_kb, mp, kp, gs_stride,
                     SRC: tl.constexpr, IS_MX: tl.constexpr, LAYOUT: tl.constexpr,
                     BLOCK: tl.constexpr, BM: tl.constexpr, BKB: tl.constexpr,
                     USE_GDC: tl.constexpr = False):
    b, rows, kbs, valid, base, j, clo, chi, sbits = _block_codes(x_ptr, gs_ptr, M, half_k, n_kb, gs_stride, SRC,
                                                                IS_MX, BLOCK, BM, BKB, USE_GDC)
    tl.store(data_ptr + base[:, None] + j[None, :], (clo | (chi << 4)).to(tl.uint8), mask=valid[:, None])
    sbits = tl.where(valid, sbits, 0)
    soffs = scale_offsets(rows, kbs, n_kb, kp, LAYOUT)
    sptr = scale_ptr + _scale_base(b, M, n_kb, mp, kp, LAYOUT) + soffs
    if LAYOUT == LAYOUT_LINEAR:
        tl.store(sptr, sbits, mask=valid)
    else:
        tl.store(sptr, sbits, mask=(rows < mp) & (kbs < kp))


@triton.jit
def _values_kernel(x_ptr, gs_ptr, out_ptr, M, half_k, n_kb, gs_stride, SRC: tl.constexpr, IS_MX: tl.constexpr,
                   BLOCK: tl.constexpr, BM: tl.constexpr, BKB: tl.constexpr, USE_GDC: tl.constexpr = False):
    """fp4_quantized_values in one pass: _quantize_kernel's codes and scale of each block, then
    _dequantize_kernel's values without the global scale (code * block scale, exact in bf16),
    stored as bf16 pairs; no codes or scales in memory."""
    b, rows, kbs, valid, base, j, clo, chi, sbits = _block_codes(x_ptr, gs_ptr, M, half_k, n_kb, gs_stride, SRC,
                                                                IS_MX, BLOCK, BM, BKB, USE_GDC)
    if IS_MX:
        sf = ue8m0_to_float(sbits.to(tl.int32))
    else:
        sf = sbits.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    vlo = e2m1_decode(clo) * sf[:, None]
    vhi = e2m1_decode(chi) * sf[:, None]
    tl.store(out_ptr + base[:, None] + j[None, :], pair(vlo, vhi, SRC_BF16), mask=valid[:, None])


@triton.jit
def _dequantize_kernel(data_ptr, scale_ptr, gs_ptr, out_ptr, M, half_k, n_kb, mp, kp, gs_stride,
                       DST: tl.constexpr, IS_MX: tl.constexpr, HAS_GS: tl.constexpr,
                       LAYOUT: tl.constexpr, BLOCK: tl.constexpr, BM: tl.constexpr,
                       BKB: tl.constexpr, USE_GDC: tl.constexpr = False):
    b, rows, kbs, valid, base, j = _tile(M, half_k, n_kb, BLOCK, BM, BKB, USE_GDC)
    c = tl.load(data_ptr + base[:, None] + j[None, :], mask=valid[:, None], other=0).to(tl.int32)
    soffs = scale_offsets(rows, kbs, n_kb, kp, LAYOUT)
    sptr = scale_ptr + _scale_base(b, M, n_kb, mp, kp, LAYOUT) + soffs
    sbits = tl.load(sptr, mask=valid, other=0)
    if IS_MX:
        sf = ue8m0_to_float(sbits.to(tl.int32))
    else:
        sf = sbits.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    lo = e2m1_decode(c & 0xF) * sf[:, None]
    hi = e2m1_decode(c >> 4) * sf[:, None]
    if HAS_GS:
        inv = rcp_rn(tl.load(gs_ptr + b * gs_stride))
        lo = lo * inv
        hi = hi * inv
    tl.store(out_ptr + base[:, None] + j[None, :], pair(lo, hi, DST), mask=valid[:, None])


@triton.jit
def _global_scale_kernel(x_ptr, n, ws_ptr, out_ptr, BLOCK: tl.constexpr,
                         USE_GDC: tl.constexpr = False):
    """Grid-stride max of |x| over the finite elements (fp32 magnitude patterns; a program whose
    elements hold Inf or NaN takes them again with those as 0), then the last program to finish
    turns it into RN(2688 / amax) and resets the workspace."""
    if USE_GDC:  # launched with PDL: wait for the previous kernel's memory
        tl.extra.cuda.gdc_wait()
    pid, nprog = tl.program_id(0), tl.num_programs(0)
    acc = tl.zeros([BLOCK], tl.int32)
    for start in range(pid * BLOCK, n, nprog * BLOCK):
        offs = start + tl.arange(0, BLOCK).to(tl.int64)
        x = tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
        acc = tl.maximum(acc, x.to(tl.int32, bitcast=True) & 0x7FFFFFFF)
    if tl.max(acc, axis=0) >= 0x7F800000:
        acc = tl.zeros([BLOCK], tl.int32)
        for start in range(pid * BLOCK, n, nprog * BLOCK):
            offs = start + tl.arange(0, BLOCK).to(tl.int64)
            x = tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
            mag = x.to(tl.int32, bitcast=True) & 0x7FFFFFFF
            acc = tl.maximum(acc, tl.where(mag < 0x7F800000, mag, 0))
    tl.atomic_max(ws_ptr, tl.max(acc, axis=0))
    done = tl.atomic_add(ws_ptr + 1, 1)
    if done == nprog - 1:
        amax = tl.atomic_xchg(ws_ptr, 0).to(tl.float32, bitcast=True)
        tl.atomic_xchg(ws_ptr + 1, 0)
        gs = tl.div_rn(tl.full([], F.NVFP4_AMAX_TARGET, tl.float32), amax)
        ok = (amax != 0) & (tl.abs(gs) < float("inf"))
        tl.store(out_ptr, tl.where(ok, gs, 1.0))


# Elements per program and columns per tile row (tuned on H100: scripts/tune_triton_quantize.py).
TILE_ELEMENTS = 4096
TILE_COLUMNS = 512


def _tile_shape(n_kb: int, block: int) -> tuple[int, int]:
    """(BM, BKB): TILE_ELEMENTS per program, at most TILE_COLUMNS columns of one row."""
    bkb = min(triton.next_power_of_2(n_kb), TILE_COLUMNS // block)
    return max(1, TILE_ELEMENTS // (bkb * block)), bkb


# Pair views of each element dtype (see numerics.unpair) and their kernel codes.
_PAIRS = {torch.bfloat16: (torch.int32, 0), torch.float16: (torch.int32, 1),
          torch.float32: (torch.int64, 2), torch.float8_e4m3fn: (torch.int16, 3)}


def _dims(shape, fmt: F.Fp4Format, layout: F.SfLayout):
    *batch, rows, k = shape
    n_kb = k // fmt.block_size
    mp, kp = F.padded_scale_shape(rows, n_kb, layout)
    return (batch[0] if batch else 1), rows, k, n_kb, mp, kp


def _quantize(x: torch.Tensor, gs: torch.Tensor | None, fmt: F.Fp4Format, layout: F.SfLayout):
    data, scale = prepare_outputs(*meta.quantize(x, fmt, layout))
    nb, rows, k, n_kb, mp, kp = _dims(x.shape, fmt, layout)
    bm, bkb = _tile_shape(n_kb, fmt.block_size)
    grid = (triton.cdiv(mp, bm), triton.cdiv(kp, bkb), nb)
    pair_dtype, src = _PAIRS[x.dtype]
    scale_bytes = scale.view(torch.uint8)
    _quantize_kernel[grid](x.view(pair_dtype), gs if gs is not None else scale_bytes,
                           data.view(torch.uint8), scale_bytes, rows, k // 2, n_kb, mp, kp,
                           1 if gs is not None and gs.numel() > 1 else 0, SRC=src,
                           IS_MX=fmt is F.MXFP4, LAYOUT=_LAYOUT_ID[layout], BLOCK=fmt.block_size,
                           BM=bm, BKB=bkb, **_launch(x.device))
    return data, scale


def nvfp4_quantize(x: torch.Tensor, global_scale: torch.Tensor, sf_layout: F.SfLayout):
    return _quantize(x, global_scale, F.NVFP4, sf_layout)


def mxfp4_quantize(x: torch.Tensor, sf_layout: F.SfLayout):
    return _quantize(x, None, F.MXFP4, sf_layout)


def fp4_dequantize(data: torch.Tensor, scale: torch.Tensor, global_scale: torch.Tensor | None,
                   fmt: F.Fp4Format, sf_layout: F.SfLayout, out_dtype: torch.dtype) -> torch.Tensor:
    out = prepare_outputs(meta.fp4_dequantize(data, out_dtype))
    nb, rows, k, n_kb, mp, kp = _dims(out.shape, fmt, sf_layout)
    bm, bkb = _tile_shape(n_kb, fmt.block_size)
    grid = (triton.cdiv(rows, bm), triton.cdiv(n_kb, bkb), nb)
    pair_dtype, dst = _PAIRS[out_dtype]
    _dequantize_kernel[grid](data.view(torch.uint8), scale.view(torch.uint8),
                             global_scale if global_scale is not None else out, out.view(pair_dtype),
                             rows, k // 2, n_kb, mp, kp,
                             1 if global_scale is not None and global_scale.numel() > 1 else 0,
                             DST=dst, IS_MX=fmt is F.MXFP4, HAS_GS=global_scale is not None,
                             LAYOUT=_LAYOUT_ID[sf_layout], BLOCK=fmt.block_size, BM=bm, BKB=bkb,
                             **_launch(data.device))
    return out


def fp4_quantized_values(x: torch.Tensor, global_scale: torch.Tensor | None, fmt: F.Fp4Format) -> torch.Tensor:
    """The quantize and the dequantize without the global scale to bf16 in one launch
    (_values_kernel): the bits of the two kernels above."""
    out = prepare_outputs(meta.fp4_quantized_values(x))
    nb, rows, k, n_kb, _, _ = _dims(x.shape, fmt, F.SfLayout.LINEAR)
    if out.numel() == 0:
        return out
    bm, bkb = _tile_shape(n_kb, fmt.block_size)
    grid = (triton.cdiv(rows, bm), triton.cdiv(n_kb, bkb), nb)
    pair_dtype, src = _PAIRS[x.dtype]
    _values_kernel[grid](x.view(pair_dtype), global_scale if global_scale is not None else out,
                         out.view(torch.int32), rows, k // 2, n_kb,
                         1 if global_scale is not None and global_scale.numel() > 1 else 0, SRC=src,
                         IS_MX=fmt is F.MXFP4, BLOCK=fmt.block_size, BM=bm, BKB=bkb, **_launch(x.device))
    return out


def compute_global_scale(x: torch.Tensor) -> torch.Tensor:
    out = prepare_outputs(meta.compute_global_scale(x))
    flat = x.reshape(-1)
    block = 4096
    sms = sm_count(x.device)
    grid = (max(1, min(triton.cdiv(flat.numel(), block), 4 * sms)),)
    _global_scale_kernel[grid](flat, flat.numel(), global_scale_workspace(x.device), out,
                               BLOCK=block,
                               **_launch(x.device, num_warps=8))
    return out
