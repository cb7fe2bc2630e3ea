"""fused_moe on the cuda backend (same signature as torch_fp4/reference/moe.py, plus the tactic),
two grouped GEMM families (kernels/cuda/moe_tactics.py picks by routed rows per expert).

Decode sizes (SmallMMoeTactic): one C call (csrc/moe_small_m.cu torch_fp4_moe_decode) on a
plan built once per problem and tactic (csrc/moe_decode.h), the tensors passed as pointers, one
workspace tensor for every intermediate. It enqueues four launches, none reading anything back
(outside a caller's CUDA-graph capture, as one launch of a CUDA graph kept with the plan whose
kernel nodes take each call's arguments: csrc/graph_launch.cuh, EAGER_GRAPHS):
the grouping of the pairs by expert in blocks of block_m rows (csrc/moe_route.cuh, the layout of
kernels/triton/moe_align.py); FC1, the small-M GEMM of csrc/mm_small_m.cuh run grouped, reading
each block's activation rows straight from x through the pairs, streaming its expert's gate and
up rows of 64 (or 32) columns per CTA and writing RN_bf16(silu(gate) * up) (gate and up each
RN_bf16(alpha1[e] * acc), the bf16 h of the spec); FC2, writing each row to its pair's row of
y [T k, H]; the top-k sum in slot order (csrc/moe_route.cuh). Each block's alpha is formed in the
GEMM from the global scales. W4A4 replaces x by the exact values of its quantization
(quantize.exact_values: one launch before the call), and FC1's epilogue quantizes its
output with a2_global_scale and writes the exact dequantized values (16 columns of a row are four
lanes' chunks: one shuffle pair gives the block amax), the global scales entering through the
alphas (MXFP4 activations, act_mx: x's MXFP4 exact values, the intermediate's in FC1's epilogue
over eight lanes per 32-column block, no global scales). gpt-oss's features (the plan holds them):
MXFP4 experts (the moe_small_m4_* libraries, alpha 1), w1_bias / w2_bias added to FC1's gate and up sums and to FC2's sums in fp32
before rounding, the clamped SwiGLU in FC1's epilogue (spec section 6). The grouped Hopper GEMMs
below take them through moe_grouped's gpt_oss (MXFP4 variant, fp32 results where a bias follows).

From SMALL_M_BELOW rows per expert (WgmmaMoeTactic): the shared grouped-GEMM MoE launches (kernels/triton/moe_grouped.py: align, gather, alphas,
inverse permutation, finalize) around the Hopper FP4-weight GEMM of csrc/mm_wgmma.cu run grouped
(torch_fp4_mm_wgmma_grouped): one persistent launch per GEMM over every block of block_m routed
rows, each block multiplying its expert's FP4 weights (decoded in registers, as mm_fp4) and
scaled by its expert's alpha in the epilogue; blocks past the used rows cost nothing.

FC1 writes h = RN_bf16(alpha1[e] * acc) [rows, 2I] and swiglu_rows (csrc/moe_swiglu.cu) forms
RN_bf16(silu(gate) * up) (zeros in the rows of unused blocks, which FC1 skips). W4A16 feeds x's rows (bf16/fp16) to FC1 and the bf16 intermediate to
FC2 as they are. W4A4 replaces both by the exact values of their NVFP4 quantization without the
global scales (every NVFP4 value times its e4m3 block scale is a bf16 value), the global scales
entering through the alphas, as mm_fp4's W4A4 does: x's rows gathered and quantized in one launch
(quantize.exact_values with the pairs), the intermediate's in swiglu_rows' launch. MXFP4 experts
take W4A4 (MXFP4 activations, no global scales) the same way, with gpt-oss's biases and clamped
SwiGLU or without.
"""
from __future__ import annotations

import atexit
import ctypes
import math
import struct
from typing import NamedTuple, Optional

import torch

from ... import formats as F
from ...problems import MoeProblem
from .. import _common
from .._common import tactic_or_default
from ..triton import moe_grouped
from ..triton.moe_align import max_blocks
from ..triton.moe_gemm import GptOss
from .build import mm_variant, moe_decode_library, wgmma_library
from .moe_tactics import MOE_SPACE, SmallMMoeTactic, WgmmaMoeTactic
from .native import DTYPE_CODES, MoeDecodePlan, library, raw_stream
from .quantize import exact_values, nvfp4_quantize

LAYOUT = F.SfLayout.LINEAR   # the quantized activations' scales: never read by another backend


def _grouped_gemm(a: torch.Tensor, a_scale: Optional[torch.Tensor], w: torch.Tensor, w_scale: torch.Tensor,
                  alpha: torch.Tensor, block_expert: torch.Tensor, swiglu: bool,
                  out_dtype: torch.dtype = torch.bfloat16, mx: bool = False, *,
                  tactic: WgmmaMoeTactic, packed: bool = False) -> torch.Tensor:
    """moe_grouped.GroupedGemm's gemm: out_dtype bf16, or fp32 (RN(alpha * acc), for the biases);
    mx: MXFP4 experts (bf16 activations); packed: w holds every expert in the "sm90" layout
    (each expert's [N, K/2] prepacked, N % 128 == 0 and K % 64 == 0)."""
    rows, k = a.shape[0], w.shape[2] * 2
    experts, n = w.shape[0], w.shape[1]
    if a_scale is not None:   # W4A4 arrives as exact 16-bit values (GroupedGemm.exact)
        raise RuntimeError("torch_fp4 internal: the cuda grouped GEMM takes 16-bit activations only")
    out = _common.cuda_empty((rows, n), out_dtype, a)
    if rows:
        i = a.get_device()
        fp16 = a.dtype == torch.float16
        kp = w_scale.shape[2]
        lib = library(i, wgmma_library(mm_variant(fp16, mx, packed), tactic.block_m))
        pdl = _common.PDL
        status = lib.mm_wgmma_grouped(
            i, raw_stream(i), pdl, a.data_ptr(), w.data_ptr(), w_scale.data_ptr(), alpha.data_ptr(),
            None, None, out.data_ptr(), rows, n, k, kp, int(fp16), int(mx), DTYPE_CODES[out_dtype], int(packed),
            tactic.block_m, tactic.stages, 1, 1, tactic.ctas_per_sm, block_expert.data_ptr(), experts,
            w.stride(0), w_scale.stride(0) * w_scale.element_size())
        if status:
            lib.check(status, f"fused_moe grouped GEMM (rows={rows}, N={n}, K={k}, E={experts}) with {tactic}")
    return swiglu_rows(out, block_expert, tactic.block_m) if swiglu else out


def swiglu_rows(h: torch.Tensor, block_expert: torch.Tensor, block_m: int, gpt_oss: Optional[GptOss] = None,
                exact: Optional[moe_grouped.ActQuant] = None) -> torch.Tensor:
    """moe_grouped.silu_mul's contract (GroupedGemm.activation) in one launch of
    csrc/moe_swiglu.cu: h bf16 [rows, 2I] (fp32 with gpt_oss's w1_bias) grouped by expert in
    blocks of block_m -> bf16 [rows, I], the activation of gpt_oss (default SwiGLU), or with exact
    its exact quantized values; rows of unused blocks zeros."""
    rows, inter = h.shape[0], h.shape[1] // 2
    out = _common.cuda_empty((rows, inter), torch.bfloat16, h)
    if rows == 0 or inter == 0:
        return out
    go = gpt_oss or GptOss()
    b1, gs = go.w1_bias, None if exact is None else exact.global_scale
    if b1 is not None and b1.data_ptr() % 16:   # the kernel reads 16-byte vectors
        b1 = b1.clone()
    i = h.get_device()
    lib = library(i, "core")
    status = lib.moe_swiglu(
        i, raw_stream(i), _common.PDL, h.data_ptr(), int(h.dtype == torch.float32), None if b1 is None else b1.data_ptr(),
        int(b1 is not None and b1.dtype == torch.float32), block_expert.data_ptr(), block_m, rows, inter,
        int(go.clamped), _f32_bits(go.swiglu_alpha), _f32_bits(go.swiglu_limit),
        0 if exact is None else exact.fmt.block_size, None if gs is None else gs.data_ptr(),
        0 if gs is None or gs.numel() == 1 else gs.stride(0), out.data_ptr())
    if status:
        lib.check(status, f"fused_moe activation (rows={rows}, I={inter})")
    return out


# Eager calls of the decode path enqueue its four launches as one CUDA graph launch (one per
# plan, csrc/graph_launch.cuh), which costs the host less than four launches; calls inside a
# caller's capture launch directly. False: always launch directly (tests compare the two).
EAGER_GRAPHS = True
_EXITING = False


@atexit.register
def _exiting() -> None:
    global _EXITING
    _EXITING = True


class DecodeGraph:
    """The C graph handle of one decode plan (torch_fp4_moe_decode_graph_create), freed with it
    (left to the process's end at exit)."""

    def __init__(self, library_name: str, device: int):
        self._lib, self._device = library(device, library_name), device
        self.address = self._lib.moe_decode_graph_create(device)

    def state(self) -> str:
        """"empty" (not built yet), "built" (eager calls are graph launches) or "broken" (building
        failed: calls launch directly)."""
        return ("empty", "built", "broken")[self._lib.moe_decode_graph_state(self.address)]

    def __del__(self):
        if self.address and not _EXITING:
            self._lib.moe_decode_graph_destroy(self._device, self.address)
            self.address = None


class _Decode(NamedTuple):
    """What the decode path keeps per (problem, tactic): the C plan and its address, the
    workspace's size, the library, the graph handle."""
    problem: MoeProblem
    tactic: SmallMMoeTactic
    plan: MoeDecodePlan
    address: int
    workspace_bytes: int
    library: str
    graph: DecodeGraph


_DECODES: dict[tuple[int, int], _Decode] = {}
_MAX_DECODES = 256


def _decode(p: MoeProblem, t: SmallMMoeTactic, w1_scale: torch.Tensor, w2_scale: torch.Tensor) -> _Decode:
    """The decode plan of problem p with tactic t, built once: the dispatch passes the same
    problem and tactic objects on every call of a problem, so the lookup is by identity (the entry
    holds both, so their ids stay theirs)."""
    d = _DECODES.get((id(p), id(t)))
    if d is not None and d.problem is p and d.tactic is t:
        return d
    fp16 = p.x_dtype == torch.float16 and not p.w4a4   # W4A4's FC1 reads bf16 exact values
    mx = p.fmt is F.MXFP4
    plan = MoeDecodePlan(
        tokens=p.tokens, hidden=p.hidden, inter=p.inter, experts=p.experts, top_k=p.top_k,
        local_offset=p.local_expert_offset, strict=int(p.strict_ids), act_fp16=int(fp16),
        out_dtype=DTYPE_CODES[p.out_dtype], block_m=t.block_m, warps=t.warps, tiles_per_warp=t.tiles_per_warp,
        block_k=t.block_k, stages=t.stages, fc1_split=t.fc1_split, fc2_split=t.fc2_split,
        w1_kp=w1_scale.shape[2], w2_kp=w2_scale.shape[2], w1_s_expert=w1_scale.stride(0) * w1_scale.element_size(),
        w2_s_expert=w2_scale.stride(0) * w2_scale.element_size(), a2_gs_stride=int(p.a2_per_expert),
        mx=int(mx), bias1_dtype=DTYPE_CODES[p.bias_dtypes[0] or torch.bfloat16],
        bias2_dtype=DTYPE_CODES[p.bias_dtypes[1] or torch.bfloat16], activation=int(p.activation != "swiglu"),
        swiglu_alpha_bits=_f32_bits(p.swiglu_alpha), swiglu_limit_bits=_f32_bits(p.swiglu_limit),
        act_mx=int(mx and p.w4a4), packed=int(p.packed))
    name = moe_decode_library(mm_variant(fp16, mx, p.packed), t.block_m)
    nbytes = library(p.device.index, name).moe_decode_workspace_bytes(ctypes.addressof(plan))
    if nbytes < 0 or nbytes != workspace_layout(p, t.block_m)[1]:
        raise RuntimeError(f"torch_fp4 internal: the cuda fused_moe decode path refused its plan {plan_fields(plan)} "
                           f"(workspace {nbytes} bytes)")
    if len(_DECODES) >= _MAX_DECODES:
        _DECODES.clear()
    d = _DECODES[(id(p), id(t))] = _Decode(p, t, plan, ctypes.addressof(plan), nbytes, name,
                                           DecodeGraph(name, p.device.index))
    return d


def plan_fields(plan: MoeDecodePlan) -> dict[str, int]:
    return {name: getattr(plan, name) for name, _ in plan._fields_}


def workspace_layout(p: MoeProblem, block_m: int) -> tuple[dict[str, tuple[int, torch.dtype, tuple]], int]:
    """csrc/moe_decode.h's moe_decode_workspace: {part: (byte offset, dtype, shape)} of
    sorted_pairs, block_expert, expert_end (int32), h [rows, I] and y [T k, H] (bf16), and the
    total bytes; each part 256-byte aligned."""
    pairs = p.tokens * p.top_k
    blocks = max_blocks(pairs, p.experts, block_m)
    rows = blocks * block_m
    parts = {"sorted_pairs": (torch.int32, (rows,)), "block_expert": (torch.int32, (blocks,)),
             "expert_end": (torch.int32, (p.experts,)), "h": (torch.bfloat16, (rows, p.inter)),
             "y": (torch.bfloat16, (pairs, p.hidden))}
    layout, offset = {}, 0
    for name, (dtype, shape) in parts.items():
        layout[name] = (offset, dtype, shape)
        offset += -(-(dtype.itemsize * math.prod(shape)) // 256) * 256
    return layout, offset


def workspace_views(d: _Decode, workspace: torch.Tensor) -> dict[str, torch.Tensor]:
    """The parts of a decode call's workspace (workspace_layout), for tests."""
    layout, _ = workspace_layout(d.problem, d.tactic.block_m)
    return {name: workspace[offset:offset + dtype.itemsize * math.prod(shape)].view(dtype).view(shape)
            for name, (offset, dtype, shape) in layout.items()}


def _f32_bits(v: float) -> int:
    return struct.unpack("<I", struct.pack("<f", v))[0]


def _small_m_moe(x, w1, w1_scale, w1_global_scale, w2, w2_scale, w2_global_scale, topk_ids, topk_weights,
                 a1_global_scale, a2_global_scale, out_dtype, p: MoeProblem, t: SmallMMoeTactic,
                 keep_workspace: Optional[list] = None, w1_bias: Optional[torch.Tensor] = None,
                 w2_bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The decode path: one C call (csrc/moe_small_m.cu torch_fp4_moe_decode) on the plan of
    (p, t), which holds the experts' format, the biases' dtypes and the activation (p's);
    `keep_workspace` (tests) receives the call's workspace."""
    out = _common.prepare_outputs(_common.cuda_empty((p.tokens, p.hidden), out_dtype, x))
    if p.tokens == 0 or p.top_k == 0:
        return out.zero_() if p.tokens else out
    d = _decode(p, t, w1_scale, w2_scale)
    workspace = _common.cuda_empty((d.workspace_bytes,), torch.uint8, x)
    if keep_workspace is not None:
        keep_workspace.append((d, workspace))
    # every tensor the call reads stays referenced until it is enqueued: a temporary freed before
    # that could be handed to an allocation (and a kernel writing it) enqueued ahead of the call
    a, a1, a2 = x, a1_global_scale, a2_global_scale
    if a2 is not None:
        a2 = a2.contiguous()
    if a1 is not None:   # exact bf16 values of x~, the global scales in the alphas
        a = exact_values(x, a1)
    elif p.w4a4:         # MXFP4 activations: x~'s exact values, no global scale
        a = exact_values(x, None, F.MXFP4)
    elif a.data_ptr() % 16:
        a = a.clone()
    g1 = None if w1_global_scale is None else w1_global_scale.contiguous()   # MXFP4: none
    g2 = None if w2_global_scale is None else w2_global_scale.contiguous()
    b1 = None if w1_bias is None else w1_bias.contiguous()
    b2 = None if w2_bias is None else w2_bias.contiguous()
    ids, tw = topk_ids.contiguous(), topk_weights.contiguous()
    i = x.get_device()
    lib = library(i, d.library)
    status = lib.moe_decode(i, raw_stream(i), _common.PDL, d.address, a.data_ptr(), w1.data_ptr(), w1_scale.data_ptr(),
                            None if g1 is None else g1.data_ptr(), w2.data_ptr(), w2_scale.data_ptr(),
                            None if g2 is None else g2.data_ptr(), ids.data_ptr(), tw.data_ptr(),
                            None if a1 is None else a1.data_ptr(), None if a2 is None else a2.data_ptr(),
                            None if b1 is None else b1.data_ptr(), None if b2 is None else b2.data_ptr(),
                            out.data_ptr(), workspace.data_ptr(), d.graph.address if EAGER_GRAPHS else None)
    if status:
        lib.check(status, f"fused_moe decode path ({plan_fields(d.plan)})")
    return out


def fused_moe(x: torch.Tensor, w1: torch.Tensor, w1_scale: torch.Tensor, w1_global_scale: torch.Tensor,
              w2: torch.Tensor, w2_scale: torch.Tensor, w2_global_scale: torch.Tensor,
              topk_ids: torch.Tensor, topk_weights: torch.Tensor,
              a1_global_scale: Optional[torch.Tensor], a2_global_scale: Optional[torch.Tensor],
              local_expert_offset: int, out_dtype: torch.dtype, strict_ids: bool = False,
              fmt: F.Fp4Format = F.NVFP4, w1_bias: Optional[torch.Tensor] = None,
              w2_bias: Optional[torch.Tensor] = None, activation: str = "swiglu", swiglu_alpha: float = 1.702,
              swiglu_limit: float = 7.0, w4a4: bool = False,
              weight_layout: F.WeightLayout = F.WeightLayout.ROW, tactic: Optional[WgmmaMoeTactic] = None,
              problem: Optional[MoeProblem] = None) -> torch.Tensor:
    """The reference launcher's arguments (gpt-oss's: fmt .. swiglu_limit; w4a4: MXFP4
    activations; weight_layout: "sm90" experts, the grouped Hopper GEMMs only), plus the tactic
    and the problem."""
    p = problem or MoeProblem.of(x, w1, w1_scale, w2, w2_scale, topk_ids, a1_global_scale, a2_global_scale,
                                 local_expert_offset, None if strict_ids else w1.shape[0], out_dtype, fmt,
                                 w1_bias, w2_bias, activation, swiglu_alpha, swiglu_limit,
                                 "fp4" if w4a4 else None, weight_layout)
    t = tactic_or_default(tactic, MOE_SPACE, p, op="fused_moe")
    if isinstance(t, SmallMMoeTactic):
        return _small_m_moe(x, w1, w1_scale, w1_global_scale, w2, w2_scale, w2_global_scale, topk_ids, topk_weights,
                            a1_global_scale, a2_global_scale, out_dtype, p, t, w1_bias=w1_bias, w2_bias=w2_bias)

    def gemm(a, a_scale, w, w_scale, alpha, block_expert, swiglu, out_dtype=torch.bfloat16, mx=False):
        return _grouped_gemm(a, a_scale, w, w_scale, alpha, block_expert, swiglu, out_dtype, mx, tactic=t,
                             packed=p.packed)
    g = moe_grouped.GroupedGemm(gemm=gemm, block_m=t.block_m, quantize=nvfp4_quantize, sf_layout=LAYOUT,
                                exact=exact_values, activation=swiglu_rows)
    gpt_oss = None
    if p.gpt_oss_features is not None:
        gpt_oss = GptOss.of(fmt, w1_bias, w2_bias, activation, swiglu_alpha, swiglu_limit)
    return moe_grouped.fused_moe(x, w1, w1_scale, w1_global_scale, w2, w2_scale, w2_global_scale, topk_ids,
                                 topk_weights, a1_global_scale, a2_global_scale, local_expert_offset, out_dtype,
                                 strict_ids, g, gpt_oss, fmt if p.w4a4 else None)
