"""The per-block step shared by both quantize kernels: raw input words of one block -> packed
E2M1 bytes stored to global memory, scale byte returned.

Blocks whose amax or encode factor is not finite (special) are re-encoded on the path that maps
NaN products to code 7; every other block takes the path without that step.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int64, Uint32

from . import numerics as N
from . import ptx as P


@cute.jit
def quantize_store(words, dtype: cutlass.Constexpr, nvfp4: cutlass.Constexpr, gs, b, gs_stride,
                   dst):
    """Quantize one block (raw words `words` of `dtype`), store its packed bytes at global
    address `dst` (8 bytes for NVFP4, 16 for MXFP4) and return its scale byte. NVFP4 reads the
    global scale of batch entry b at gs + 4 * b * gs_stride."""
    gsv = rgs = None
    if cutlass.const_expr(nvfp4):
        gsv = P.ld_u32(gs.toint() + Int64(b * gs_stride) * 4)
        rgs = P.rcp_rn(gsv)
    vals, sb, o, special = N.block_scale(words, dtype, nvfp4, gsv, rgs)
    prods = N.products(vals, o)
    cap = N.magnitude_cap(sb, nvfp4)
    w = N.encode_words(prods, safe=False, cap=cap) + [Uint32(0)] * 2
    w0, w1, w2, w3 = w[0], w[1], w[2], w[3]
    if special:
        ws = N.encode_words(prods, safe=True, cap=cap) + [Uint32(0)] * 2
        w0, w1, w2, w3 = ws[0], ws[1], ws[2], ws[3]
    if cutlass.const_expr(nvfp4):
        P.st_v2(dst, w0, w1)
    else:
        P.st_v4(dst, w0, w1, w2, w3)
    return sb
