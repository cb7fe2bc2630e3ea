"""Triton routing kernel: router logits [T, E] -> (topk_ids int32 [T, k], topk_weights fp32 [T, k]),
the methods of torch_fp4.reference.route (spec section 6), E up to MAX_EXPERTS.

One program per token holds its E scores in registers as a [groups, experts per group] tile
(one group unless DeepSeek-V3 grouping is on) and picks the top k by k rounds of argmax. Scores
are compared as int32 keys of a total order that is torch.sort's (larger first, -0.0 == +0.0,
NaN above everything), and each round takes the lowest expert id among the equal maxima: ties go
to the lower expert id, as the reference's stable sort does.

Numerics (the bound the tests use): every per-expert score is the reference's sequence of fp32
operations, each rounded to nearest (x - max, e^x with libdevice expf as PyTorch's CUDA kernels,
divisions with div.rn; sigmoid = 1 / (1 + e^-x); biased = sigmoid + bias; group score = the sum
of the group's two largest biased scores). Only the order of the normalizing sums differs from
the reference, so:
- ids equal the reference's except where two of a token's scores are within the rounding of
  those sums of each other (a few ulp); exactly equal scores resolve identically;
- |w - w_ref| <= weight_rtol(method, E, k) * |w_ref|, with n the number of terms summed
  (E for softmax, E + k with renormalize, k for "renormalize" and "deepseek_v3", 0 for "llama4"):
  (2n + 8) * 2^-24 covers two summation orders (each within (n - 1) ulp of the exact sum), the
  final divisions and products, and up to two ulp of exp where an implementation other than
  libdevice's computes the reference (PyTorch on the CPU).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import meta
from .. import _common
from .._common import prepare_outputs, use_pdl
from . import ROUTE_MAX_EXPERTS as MAX_EXPERTS
from .moe_numerics import exp_f32, interpreting

METHODS = {"softmax": 0, "renormalize": 1, "deepseek_v3": 2, "llama4": 3}
DEEPSEEK_EPS = 1e-20
MIN_KEY: tl.constexpr = tl.constexpr(-2147483648)


def weight_rtol(method: str, experts: int, top_k: int, renormalize: bool = False) -> float:
    """Relative bound on |w - w_ref| of this kernel's weights (module docstring)."""
    n = {"softmax": experts + (top_k if renormalize else 0), "renormalize": top_k,
         "deepseek_v3": top_k, "llama4": 0}[method]
    return (2 * n + 8) * 2.0 ** -24


@triton.jit
def order_key(x):
    """fp32 -> int32 key of torch.sort's order: larger value -> larger key, -0.0 and +0.0 equal,
    every NaN above +Inf. MIN_KEY is below every key."""
    x = tl.where(x == 0.0, 0.0, x)
    bits = x.to(tl.int32, bitcast=True)
    key = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    return tl.where(x != x, 0x7FFFFFFF, key)


@triton.jit
def key_value(key):
    """Inverse of order_key (canonical zero and NaN)."""
    bits = tl.where(key < 0, key ^ 0x7FFFFFFF, key)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _sigmoid(x, PORTABLE: tl.constexpr):
    return tl.div_rn(tl.full(x.shape, 1.0, tl.float32), 1.0 + exp_f32(-x, PORTABLE))


@triton.jit
def _sum2(x):
    return tl.sum(tl.sum(x, axis=1), axis=0)


@triton.jit
def _route_kernel(logits_ptr, bias_ptr, ids_ptr, w_ptr, stride_t, stride_e, bias_stride, rsf,
                  METHOD: tl.constexpr, RENORM: tl.constexpr, TOP_K: tl.constexpr,
                  BLOCK_K: tl.constexpr, N_GROUP: tl.constexpr, GROUP: tl.constexpr,
                  TOPK_GROUP: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_I: tl.constexpr,
                  PORTABLE: tl.constexpr, USE_GDC: tl.constexpr):
    if USE_GDC:
        tl.extra.cuda.gdc_wait()
    t = tl.program_id(0).to(tl.int64)
    g = tl.arange(0, BLOCK_G)[:, None]
    i = tl.arange(0, BLOCK_I)[None, :]
    valid = (g < N_GROUP) & (i < GROUP)
    eid = g * GROUP + i                                        # expert id of each tile element
    x = tl.load(logits_ptr + t * stride_t + eid * stride_e, mask=valid,
                other=float("-inf")).to(tl.float32)
    if METHOD == 0:     # softmax over all experts, then top-k of the probabilities
        mx = tl.max(tl.max(x, axis=1), axis=0)
        ex = tl.where(valid, exp_f32(x - mx, PORTABLE), 0.0)
        score = tl.div_rn(ex, tl.full(ex.shape, 1.0, tl.float32) * _sum2(ex))
        key = order_key(score)
    elif METHOD == 2:   # DeepSeek-V3: sigmoid scores, choose on biased scores in the best groups
        score = _sigmoid(x, PORTABLE)
        bias = tl.load(bias_ptr + eid * bias_stride, mask=valid, other=0.0).to(tl.float32)
        key = order_key(score + bias)
        if N_GROUP > 1:
            key = tl.where(valid, key, MIN_KEY)
            k1 = tl.max(key, axis=1)
            first = tl.min(tl.where(key == k1[:, None], i, BLOCK_I), axis=1)
            if GROUP > 1:
                k2 = tl.max(tl.where(i == first[:, None], MIN_KEY, key), axis=1)
                gscore = key_value(k1) + key_value(k2)
            else:
                gscore = key_value(k1)
            gid = tl.arange(0, BLOCK_G)
            gkey = tl.where(gid < N_GROUP, order_key(gscore), MIN_KEY)
            keep = gid < 0
            for _ in range(TOPK_GROUP):
                best = tl.max(gkey, axis=0)
                pick = tl.min(tl.where(gkey == best, gid, BLOCK_G), axis=0)
                keep = keep | (gid == pick)
                gkey = tl.where(gid == pick, MIN_KEY, gkey)
            key = tl.where(keep[:, None], key, order_key(tl.full(key.shape, float("-inf"), tl.float32)))
    else:               # "renormalize" and "llama4": top-k of the logits
        score = x
        key = order_key(x)
    key = tl.where(valid, key, MIN_KEY)
    kk = tl.arange(0, BLOCK_K)
    ids = tl.zeros([BLOCK_K], tl.int32)
    vals = tl.zeros([BLOCK_K], tl.float32)
    for j in range(TOP_K):
        best = tl.max(tl.max(key, axis=1), axis=0)
        pick = tl.min(tl.min(tl.where(key == best, eid, GROUP * N_GROUP), axis=1), axis=0)
        hit = eid == pick
        val = _sum2(tl.where(hit, score, 0.0))
        key = tl.where(hit, MIN_KEY, key)
        ids = tl.where(kk == j, pick, ids)
        vals = tl.where(kk == j, val, vals)
    in_k = kk < TOP_K
    ones = tl.full([BLOCK_K], 1.0, tl.float32)
    if METHOD == 0:
        w = vals
        if RENORM:
            w = tl.div_rn(vals, ones * tl.sum(tl.where(in_k, vals, 0.0), axis=0))
    elif METHOD == 1:
        mx = tl.max(tl.where(in_k, vals, float("-inf")), axis=0)
        ex = tl.where(in_k, exp_f32(vals - mx, PORTABLE), 0.0)
        w = tl.div_rn(ex, ones * tl.sum(ex, axis=0))
    elif METHOD == 2:
        tot = tl.sum(tl.where(in_k, vals, 0.0), axis=0) + 1e-20
        w = tl.div_rn(vals, ones * tot) * rsf
    else:
        w = _sigmoid(vals, PORTABLE)
    tl.store(ids_ptr + t * TOP_K + kk, ids, mask=in_k)
    tl.store(w_ptr + t * TOP_K + kk, w, mask=in_k)


def route(logits: torch.Tensor, top_k: int, method: str, renormalize: bool,
          bias: torch.Tensor | None, n_group: int | None, topk_group: int | None,
          routed_scaling_factor: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Launcher with the signature of torch_fp4.reference.route."""
    ids, w = meta.route(logits, top_k)
    prepare_outputs(w)
    if _common.POISON_OUTPUTS:
        ids.fill_(-7)
    tokens, experts = logits.shape
    if experts > MAX_EXPERTS:
        raise ValueError(f"route: logits: expected at most {MAX_EXPERTS} experts for the Triton "
                         f"kernel, got {experts}")
    if tokens == 0:
        return ids, w
    grouped = method == "deepseek_v3" and n_group is not None and n_group > 1
    n_groups = n_group if grouped else 1
    group = experts // n_groups
    block_g, block_i = triton.next_power_of_2(n_groups), triton.next_power_of_2(group)
    tile = block_g * block_i
    pdl = use_pdl(logits.device)
    _route_kernel[(tokens,)](
        logits, bias if bias is not None else logits, ids, w, logits.stride(0), logits.stride(1),
        bias.stride(0) if bias is not None else 0, float(routed_scaling_factor),
        METHOD=METHODS[method], RENORM=bool(renormalize), TOP_K=top_k,
        BLOCK_K=triton.next_power_of_2(top_k), N_GROUP=n_groups, GROUP=group,
        TOPK_GROUP=topk_group if grouped else 1, BLOCK_G=block_g, BLOCK_I=block_i,
        PORTABLE=interpreting(), USE_GDC=pdl, launch_pdl=pdl,
        num_warps=1 if tile <= 128 else 2 if tile <= 512 else 4, enable_fp_fusion=False)
    return ids, w
