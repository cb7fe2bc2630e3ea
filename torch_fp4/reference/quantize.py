"""Reference quantize / dequantize (spec sections 1-4)."""
from __future__ import annotations

import torch

from .. import formats as F


def compute_global_scale(x: torch.Tensor) -> torch.Tensor:
    """[1] fp32 NVFP4 encode global scale of the whole tensor, computed on x's device, from the
    largest magnitude of its finite elements (Inf and NaN are ignored)."""
    a = x.float().abs()
    a = torch.where(torch.isfinite(a), a, torch.zeros_like(a))
    amax = a.amax() if x.numel() else torch.zeros((), device=x.device)
    return F.global_scale_from_amax(amax).reshape(1)


def _blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    return x.float().reshape(*x.shape[:-1], x.shape[-1] // block, block)


def _per_batch(gs: torch.Tensor, trailing_dims: int) -> torch.Tensor:
    """Global scale [1] or [B] (one per batch entry of a 3-D tensor), shaped to broadcast
    against a tensor with `trailing_dims` dimensions after the batch dimension."""
    gs = gs.float()
    return gs.reshape(()) if gs.numel() == 1 else gs.reshape(-1, *([1] * trailing_dims))


def _finish(codes: torch.Tensor, scale_bits: torch.Tensor, x: torch.Tensor,
            fmt: F.Fp4Format, layout: F.SfLayout) -> tuple[torch.Tensor, torch.Tensor]:
    data = F.pack_e2m1(codes.reshape(x.shape)).view(torch.float4_e2m1fn_x2)
    scale = F.swizzle(scale_bits, layout).view(fmt.scale_dtype)
    return data, scale


def nvfp4_quantize(x: torch.Tensor, global_scale: torch.Tensor,
                   sf_layout: F.SfLayout) -> tuple[torch.Tensor, torch.Tensor]:
    blocks = _blocks(x, F.NVFP4.block_size)
    s8, o = F.nvfp4_block_scale(blocks.abs().amax(-1), _per_batch(global_scale, 2))
    codes = F.e2m1_encode(blocks * o.unsqueeze(-1))
    return _finish(codes, s8, x, F.NVFP4, sf_layout)


def mxfp4_quantize(x: torch.Tensor, sf_layout: F.SfLayout) -> tuple[torch.Tensor, torch.Tensor]:
    blocks = _blocks(x, F.MXFP4.block_size)
    e, o = F.mxfp4_block_scale(blocks.abs().amax(-1))
    limit = F.mxfp4_limit(e).unsqueeze(-1)
    codes = F.e2m1_encode(torch.clamp(blocks * o.unsqueeze(-1), -limit, limit))   # NaN stays NaN
    return _finish(codes, e, x, F.MXFP4, sf_layout)


def dequantize_fp32(data: torch.Tensor, scale: torch.Tensor, global_scale: torch.Tensor | None,
                    fmt: F.Fp4Format, sf_layout: F.SfLayout) -> torch.Tensor:
    """FP4 data [*batch, M, K/2] + block scales -> fp32 [*batch, M, K].

    x = LUT(q) * scale (exact), then * RN(1/gs) in fp32 when a global scale is given.
    """
    *batch, rows, half_k = data.shape
    k = half_k * 2
    kb = k // fmt.block_size
    sf = F.scale_to_float(F.unswizzle(scale, rows, kb, sf_layout), fmt)
    vals = F.e2m1_decode(F.unpack_e2m1(data)).reshape(*batch, rows, kb, fmt.block_size)
    out = vals * sf.unsqueeze(-1)
    if global_scale is not None:
        out = out * torch.reciprocal(_per_batch(global_scale, 3))
    return out.reshape(*batch, rows, k)


def fp4_dequantize(data: torch.Tensor, scale: torch.Tensor, global_scale: torch.Tensor | None,
                   fmt: F.Fp4Format, sf_layout: F.SfLayout, out_dtype: torch.dtype) -> torch.Tensor:
    return dequantize_fp32(data, scale, global_scale, fmt, sf_layout).to(out_dtype)


def fp4_quantized_values(x: torch.Tensor, global_scale: torch.Tensor | None,
                         fmt: F.Fp4Format) -> torch.Tensor:
    """bf16 [..., K]: x quantized (NVFP4 with global_scale, MXFP4 without) and dequantized without
    the global scale, LUT(q) * block scale, exact in bf16 (spec section 3b)."""
    if fmt is F.NVFP4:
        data, scale = nvfp4_quantize(x, global_scale, F.SfLayout.LINEAR)
    else:
        data, scale = mxfp4_quantize(x, F.SfLayout.LINEAR)
    return fp4_dequantize(data, scale, None, fmt, F.SfLayout.LINEAR, torch.bfloat16)
