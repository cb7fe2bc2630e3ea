"""Routing and FP4 fused MoE, plus the [gate; up] <-> [up; gate] weight-order converter."""
from __future__ import annotations

import inspect
import math
from typing import Optional

import torch

from .. import formats as F
from .. import meta, reference
from ..problems import MoeProblem, RouteProblem
from ..backends import Backend
from . import _checks as C
from ._registry import define, eager, register_impl, register_problem, run, tactics_for
from .quantize import check_scale

ROUTING_METHODS = ("softmax", "renormalize", "deepseek_v3", "llama4")
_LOGIT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


# ---------------------------------------------------------------------------------------------
# route
# ---------------------------------------------------------------------------------------------
def _validate_route(logits, top_k, method, renormalize, bias, n_group, topk_group,
                    routed_scaling_factor, backend, *, op: str = "route") -> Backend:
    """route's checks; `op` names the caller in errors (FP4MoE checks its routing config here)."""
    C.dtype(op, "logits", logits, _LOGIT_DTYPES)
    C.ndim(op, "logits", logits, (2,), "a 2-D [T, E] tensor")
    experts = logits.shape[1]
    C.integer(op, "top_k", top_k)
    C.boolean(op, "renormalize", renormalize)
    C.real(op, "routed_scaling_factor", routed_scaling_factor)
    if not 0 < routed_scaling_factor < float("inf"):
        C.fail(op, "routed_scaling_factor", "a positive finite number", routed_scaling_factor)
    for name, value in (("n_group", n_group), ("topk_group", topk_group)):
        if value is not None:
            C.integer(op, name, value, "an int or None")
    if method not in ROUTING_METHODS:
        C.fail(op, "method", "one of " + ", ".join(map(repr, ROUTING_METHODS)), repr(method))
    if not 1 <= top_k <= experts:
        C.fail(op, "top_k", f"1 <= top_k <= {experts} (the number of experts)", top_k)
    if renormalize and method != "softmax":
        C.fail(op, "renormalize", f"False for method {method!r} (it applies to 'softmax' only)", True)
    if method == "llama4" and top_k != 1:
        C.fail(op, "top_k", "1 for method 'llama4'", top_k)
    if method != "deepseek_v3":
        for name, value, default in (("bias", bias, None), ("n_group", n_group, None),
                                     ("topk_group", topk_group, None),
                                     ("routed_scaling_factor", routed_scaling_factor, 1.0)):
            if value is not default and value != default:
                C.fail(op, name, f"{default} for method {method!r} (only 'deepseek_v3' uses it)",
                       "a tensor" if isinstance(value, torch.Tensor) else value)
        return Backend.parse(backend, f"{op}: backend")
    if bias is None:
        C.fail(op, "bias", f"a [{experts}] correction-bias tensor for method 'deepseek_v3'", None)
    C.dtype(op, "bias", bias, _LOGIT_DTYPES)
    C.shape(op, "bias", bias, (experts,))
    C.same_device(op, logits=logits, bias=bias)
    if (n_group is None) != (topk_group is None):
        C.fail(op, "topk_group", "given together with n_group (or both None)",
               f"n_group={n_group}, topk_group={topk_group}")
    if n_group is not None:
        if n_group < 1 or experts % n_group:
            C.fail(op, "n_group", f"a divisor of the number of experts {experts}", n_group)
        if not 1 <= topk_group <= n_group:
            C.fail(op, "topk_group", f"1 <= topk_group <= n_group = {n_group}", topk_group)
        if top_k > topk_group * (experts // n_group):
            C.fail(op, "top_k", f"at most topk_group * experts per group = "
                   f"{topk_group * (experts // n_group)}", top_k)
    return Backend.parse(backend, f"{op}: backend")


def _route_problem(logits, top_k, method, renormalize, bias, n_group, topk_group,
                   routed_scaling_factor, backend) -> tuple[RouteProblem, Backend]:
    """The validated arguments as one problem object, and the requested backend."""
    bk = _validate_route(logits, top_k, method, renormalize, bias, n_group, topk_group,
                         routed_scaling_factor, backend)
    return RouteProblem.of(logits, top_k, method), bk


def _route(logits: torch.Tensor, top_k: int, method: str, renormalize: bool,
           bias: Optional[torch.Tensor], n_group: Optional[int], topk_group: Optional[int],
           routed_scaling_factor: float, backend: int) -> tuple[torch.Tensor, torch.Tensor]:
    args = (logits, top_k, method, renormalize, bias, n_group, topk_group, routed_scaling_factor)
    return run("route", _route_problem, (*args, backend), lambda p: args)


def _route_fake(logits, top_k, method, renormalize, bias, n_group, topk_group,
                routed_scaling_factor, backend):
    _validate_route(logits, top_k, method, renormalize, bias, n_group, topk_group,
                    routed_scaling_factor, backend)
    return meta.route(logits, top_k)


route_op = define("route", _route, _route_fake)
register_impl("route", Backend.REFERENCE, reference.route)


def route(logits: torch.Tensor, top_k: int, method: str = "softmax", renormalize: bool = False,
          bias: Optional[torch.Tensor] = None, n_group: Optional[int] = None,
          topk_group: Optional[int] = None, routed_scaling_factor: float = 1.0,
          backend: Backend | str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits [T, E] -> (topk_ids int32 [T, top_k], topk_weights fp32 [T, top_k]).

    Methods: "softmax" (softmax then top-k; `renormalize=True` rescales the k weights to sum
    to 1), "renormalize" (top-k on logits then softmax over the k), "deepseek_v3" (sigmoid
    scores plus `bias` choose experts inside the best `topk_group` of `n_group` groups; weights
    are the unbiased scores normalized and times `routed_scaling_factor`), "llama4" (top-1,
    sigmoid of the logit). Experts come largest score first; ties go to the lower expert id.
    """
    if eager(logits, bias):
        return _route(logits, top_k, method, renormalize, bias, n_group, topk_group,
                      float(routed_scaling_factor), backend)
    C.tensors("route", logits=logits)
    return route_op(logits, top_k, method, renormalize, bias, n_group, topk_group,
                    float(routed_scaling_factor), int(Backend.parse(backend, "route: backend")))


# ---------------------------------------------------------------------------------------------
# fused_moe
# ---------------------------------------------------------------------------------------------
def _check_expert_weight(name: str, w: torch.Tensor, experts: int, rows: int, k: int,
                         what: str) -> None:
    C.dtype("fused_moe", name, w, F.FP4_DATA_DTYPES)
    C.shape("fused_moe", name, w, (experts, rows, k // 2), what)
    C.contiguous("fused_moe", name, w)


ACTIVATIONS = ("swiglu", "clamped_swiglu")
ACTIVATION_MODES = (None, "bf16", "fp4")   # fused_moe's `activations`: None decides by a1_global_scale


def _validate_moe(x, w1, w1_scale, w1_global_scale, w2, w2_scale, w2_global_scale, topk_ids,
                  topk_weights, a1_global_scale, a2_global_scale, local_expert_offset,
                  num_local_experts, out_dtype, backend, block_size=16, w1_bias=None, w2_bias=None,
                  activation="swiglu", swiglu_alpha=1.702, swiglu_limit=7.0, activations=None,
                  weight_layout="row") -> tuple[torch.dtype, F.Fp4Format, Backend, F.WeightLayout]:
    op = "fused_moe"
    fmt = C.block_size(op, block_size)
    C.dtype(op, "x", x, C.HALF_DTYPES)
    C.ndim(op, "x", x, (2,), "a 2-D [T, H] tensor")
    C.contiguous(op, "x", x)
    tokens, hidden = x.shape
    name = fmt.name.upper()
    C.multiple_of(op, "x", hidden, fmt.block_size, f"H (hidden size; the {name} block size)")
    C.dtype(op, "w1", w1, F.FP4_DATA_DTYPES)
    C.ndim(op, "w1", w1, (3,), "a 3-D [E, 2I, H/2] tensor")
    experts, two_i = w1.shape[0], w1.shape[1]
    if two_i % (2 * fmt.block_size):
        C.fail(op, "w1", f"2I = w1.shape[1] to be a multiple of {2 * fmt.block_size} (I a multiple of "
               f"the {name} block size {fmt.block_size})", two_i)
    inter = two_i // 2
    _check_expert_weight("w1", w1, experts, two_i, hidden, "([E, 2I, H/2], [gate; up] rows)")
    _check_expert_weight("w2", w2, experts, hidden, inter, "([E, H, I/2])")
    lay = F.SfLayout.LAYOUT_128x4
    for name_, scale, rows_k in (("w1_scale", w1_scale, (experts, two_i, hidden)),
                                 ("w2_scale", w2_scale, (experts, hidden, inter))):
        check_scale(op, name_, scale, rows_k, fmt, lay)
        C.contiguous(op, name_, scale)
    for name_, gs in (("w1_global_scale", w1_global_scale), ("w2_global_scale", w2_global_scale)):
        if fmt is F.MXFP4:
            if gs is not None:
                C.fail(op, name_, "None for MXFP4 experts (block_size=32: no global scale)", "a tensor")
            continue
        if gs is None:
            C.fail(op, name_, "an [E] fp32 tensor of encode global scales (NVFP4 experts)", None)
        C.dtype(op, name_, gs, (torch.float32,))
        C.shape(op, name_, gs, (experts,), "(one encode global scale per expert)")
    for name_, bias, cols in (("w1_bias", w1_bias, two_i), ("w2_bias", w2_bias, hidden)):
        if bias is not None:
            C.dtype(op, name_, bias, (torch.float32, torch.bfloat16))
            C.shape(op, name_, bias, (experts, cols), f"([E, {'2I' if cols == two_i else 'H'}], one row per expert)")
    if activation not in ACTIVATIONS:
        C.fail(op, "activation", " or ".join(map(repr, ACTIVATIONS)), repr(activation))
    alpha, limit = C.real(op, "swiglu_alpha", swiglu_alpha), C.real(op, "swiglu_limit", swiglu_limit)
    if not math.isfinite(alpha):
        C.fail(op, "swiglu_alpha", "a finite number", swiglu_alpha)
    if not (math.isfinite(limit) and limit > 0):
        C.fail(op, "swiglu_limit", "a finite positive number", swiglu_limit)
    C.dtype(op, "topk_ids", topk_ids, (torch.int32,))
    C.ndim(op, "topk_ids", topk_ids, (2,), f"a 2-D [{tokens}, top_k] tensor")
    if topk_ids.shape[0] != tokens:
        C.fail(op, "topk_ids", f"shape [{tokens}, top_k] (one row per token of x)",
               f"shape {tuple(topk_ids.shape)}")
    C.dtype(op, "topk_weights", topk_weights, (torch.float32,))
    C.shape(op, "topk_weights", topk_weights, tuple(topk_ids.shape), "(the shape of topk_ids)")
    if activations not in ACTIVATION_MODES:
        C.fail(op, "activations", "None, " + " or ".join(map(repr, ACTIVATION_MODES[1:])), repr(activations))
    if activations == "bf16" and a1_global_scale is not None:
        C.fail(op, "a1_global_scale", "None for activations='bf16' (W4A16)", "a tensor")
    if fmt is F.MXFP4:
        for name_, gs in (("a1_global_scale", a1_global_scale), ("a2_global_scale", a2_global_scale)):
            if gs is not None:
                C.fail(op, name_, "None for MXFP4 experts (MXFP4 activations have no global scale: "
                       "activations='fp4' runs W4A4)", "a tensor")
    elif a1_global_scale is None:
        if activations == "fp4":
            C.fail(op, "a1_global_scale", "a [1] fp32 tensor for activations='fp4' with NVFP4 experts "
                   "(W4A4 quantizes x with it)", None)
        if a2_global_scale is not None:
            C.fail(op, "a2_global_scale", "None when a1_global_scale is None (W4A16)", "a tensor")
    else:
        C.global_scale(op, "a1_global_scale", a1_global_scale, None)
        if a2_global_scale is None:
            C.fail(op, "a2_global_scale", "a [1] or [E] fp32 tensor when a1_global_scale is given "
                   "(W4A4 quantizes the intermediate activation)", None)
        C.global_scale(op, "a2_global_scale", a2_global_scale, experts)
    C.integer(op, "local_expert_offset", local_expert_offset)
    if num_local_experts is not None:
        C.integer(op, "num_local_experts", num_local_experts, "an int or None")
    if local_expert_offset < 0:
        C.fail(op, "local_expert_offset", "a non-negative expert id", local_expert_offset)
    if num_local_experts is not None and num_local_experts != experts:
        C.fail(op, "num_local_experts", f"None or w1.shape[0] = {experts}", num_local_experts)
    out_dtype = x.dtype if out_dtype is None else out_dtype
    C.dtype_arg(op, "out_dtype", out_dtype, C.OUT_DTYPES)
    wlayout = F.WeightLayout.parse(weight_layout, f"{op}: weight_layout")
    if wlayout is not F.WeightLayout.ROW:
        for name_, w, n, k in (("w1", w1, two_i, hidden), ("w2", w2, hidden, inter)):
            reason = F.sm90_layout_reason(n, k)
            if reason is not None:
                C.fail(op, "weight_layout", f"'row' for {name_} of shape {tuple(w.shape)} (each expert "
                       f"[N, K/2] in the {wlayout.value!r} layout: {reason})", repr(wlayout.value))
    C.same_device(op, x=x, w1=w1, w1_scale=w1_scale, w1_global_scale=w1_global_scale, w2=w2,
                  w2_scale=w2_scale, w2_global_scale=w2_global_scale, topk_ids=topk_ids,
                  topk_weights=topk_weights, a1_global_scale=a1_global_scale,
                  a2_global_scale=a2_global_scale, w1_bias=w1_bias, w2_bias=w2_bias)
    return out_dtype, fmt, Backend.parse(backend, f"{op}: backend"), wlayout


def _moe_problem(x, w1, w1_scale, w1_global_scale, w2, w2_scale, w2_global_scale, topk_ids,
                 topk_weights, a1_global_scale, a2_global_scale, local_expert_offset,
                 num_local_experts, out_dtype, backend, block_size=16, w1_bias=None, w2_bias=None,
                 activation="swiglu", swiglu_alpha=1.702, swiglu_limit=7.0,
                 activations=None, weight_layout="row") -> tuple[MoeProblem, Backend]:
    """The validated arguments as one problem object, and the requested backend."""
    out_dtype, fmt, bk, wl = _validate_moe(x, w1, w1_scale, w1_global_scale, w2, w2_scale, w2_global_scale,
                                           topk_ids, topk_weights, a1_global_scale, a2_global_scale,
                                           local_expert_offset, num_local_experts, out_dtype, backend, block_size,
                                           w1_bias, w2_bias, activation, swiglu_alpha, swiglu_limit, activations,
                                           weight_layout)
    return MoeProblem.of(x, w1, w1_scale, w2, w2_scale, topk_ids, a1_global_scale, a2_global_scale,
                         local_expert_offset, num_local_experts, out_dtype, fmt, w1_bias, w2_bias, activation,
                         swiglu_alpha, swiglu_limit, activations, wl), bk


def _fused_moe(x: torch.Tensor, w1: torch.Tensor, w1_scale: torch.Tensor, w1_global_scale: Optional[torch.Tensor],
               w2: torch.Tensor, w2_scale: torch.Tensor, w2_global_scale: Optional[torch.Tensor],
               topk_ids: torch.Tensor, topk_weights: torch.Tensor,
               a1_global_scale: Optional[torch.Tensor], a2_global_scale: Optional[torch.Tensor],
               local_expert_offset: int, num_local_experts: Optional[int],
               out_dtype: Optional[torch.dtype], backend: int, block_size: int = 16,
               w1_bias: Optional[torch.Tensor] = None, w2_bias: Optional[torch.Tensor] = None,
               activation: str = "swiglu", swiglu_alpha: float = 1.702, swiglu_limit: float = 7.0,
               activations: Optional[str] = None, weight_layout: str = "row") -> torch.Tensor:
    # Without expert parallelism every id must name an expert of w1: the kernels check it on the
    # device (NaN rows, spec section 6; MoeProblem.strict_ids), so no call reads anything back.
    # Problems with the gpt-oss features (MoeProblem.gpt_oss_features) run on the reference,
    # triton and cuda backends, whose launchers alone take them (the arguments after strict_ids;
    # w4a4 asks for MXFP4 activations); "sm90" experts (MoeProblem.packed) run on the reference and
    # cuda backends, whose launchers take the layout after those.
    def build(p: MoeProblem) -> tuple:
        launch = (x, w1, w1_scale, w1_global_scale, w2, w2_scale, w2_global_scale, topk_ids, topk_weights,
                  a1_global_scale, a2_global_scale, local_expert_offset, p.out_dtype, p.strict_ids)
        if p.gpt_oss_features is None and not p.packed:
            return launch
        launch = (*launch, p.fmt, w1_bias, w2_bias, activation, float(swiglu_alpha), float(swiglu_limit), p.w4a4)
        return launch if not p.packed else (*launch, p.weight_layout)
    return run("fused_moe", _moe_problem,
               (x, w1, w1_scale, w1_global_scale, w2, w2_scale, w2_global_scale, topk_ids, topk_weights,
                a1_global_scale, a2_global_scale, local_expert_offset, num_local_experts, out_dtype, backend,
                block_size, w1_bias, w2_bias, activation, swiglu_alpha, swiglu_limit, activations, weight_layout),
               build)


def _fused_moe_fake(x, w1, w1_scale, w1_global_scale, w2, w2_scale, w2_global_scale, topk_ids,
                    topk_weights, a1_global_scale, a2_global_scale, local_expert_offset,
                    num_local_experts, out_dtype, backend, block_size=16, w1_bias=None, w2_bias=None,
                    activation="swiglu", swiglu_alpha=1.702, swiglu_limit=7.0, activations=None,
                    weight_layout="row"):
    out_dtype, _, _, _ = _validate_moe(x, w1, w1_scale, w1_global_scale, w2, w2_scale, w2_global_scale,
                                       topk_ids, topk_weights, a1_global_scale, a2_global_scale,
                                       local_expert_offset, num_local_experts, out_dtype, backend, block_size,
                                       w1_bias, w2_bias, activation, swiglu_alpha, swiglu_limit, activations,
                                       weight_layout)
    return meta.fused_moe(x, out_dtype)


fused_moe_op = define("fused_moe", _fused_moe, _fused_moe_fake)
register_impl("fused_moe", Backend.REFERENCE, reference.fused_moe)


def fused_moe(x: torch.Tensor, w1: torch.Tensor, w1_scale: torch.Tensor, w1_global_scale: Optional[torch.Tensor],
              w2: torch.Tensor, w2_scale: torch.Tensor, w2_global_scale: Optional[torch.Tensor],
              topk_ids: torch.Tensor, topk_weights: torch.Tensor, *,
              a1_global_scale: Optional[torch.Tensor] = None,
              a2_global_scale: Optional[torch.Tensor] = None, local_expert_offset: int = 0,
              num_local_experts: Optional[int] = None, out_dtype: Optional[torch.dtype] = None,
              backend: Backend | str = "auto", block_size: int = 16,
              w1_bias: Optional[torch.Tensor] = None, w2_bias: Optional[torch.Tensor] = None,
              activation: str = "swiglu", swiglu_alpha: float = 1.702,
              swiglu_limit: float = 7.0, activations: Optional[str] = None,
              weight_layout: F.WeightLayout | str = "row") -> torch.Tensor:
    """Mixture of FP4 experts: out[t] = sum_j topk_weights[t, j] * expert_{ids[t, j]}(x[t]).

    Each expert is down(act(gate, up)) with w1 [E, 2I, H/2] holding [gate; up] rows and
    w2 [E, H, I/2]; w1_scale/w2_scale are per-expert 128x4 scales [E, Mp, Kp]. block_size 16:
    NVFP4 experts (e4m3 scales) whose weight global scales [E] use the encode convention (GEMM
    alphas are derived inside); block_size 32: MXFP4 experts (e8m0 scales), w1_global_scale and
    w2_global_scale None. activations: None runs W4A4 when a1_global_scale is given, else W4A16
    (bf16 activations); "bf16" asks for W4A16, "fp4" for W4A4: the activations (x and the
    intermediate) quantized in the experts' format, NVFP4 with a1_global_scale [1] and
    a2_global_scale ([1] or [E]), MXFP4 with no global scales (a1/a2 None).
    w1_bias [E, 2I] and w2_bias [E, H] (fp32 or bf16), optional, are added to FC1's and FC2's
    fp32 results before their rounding (docs/NUMERICS.md section 6). activation: "swiglu"
    (silu(gate) * up) or "clamped_swiglu" (gpt-oss: gate clamped above at swiglu_limit, up to
    [-swiglu_limit, swiglu_limit], (up + 1) * gate * sigmoid(swiglu_alpha * gate)); swiglu_alpha
    and swiglu_limit are used only by "clamped_swiglu". MXFP4 experts, biases and the clamped
    SwiGLU run on the reference backend, on cuda (W4A4 with them: its grouped Hopper GEMMs) and,
    W4A16, on triton; the cute-dsl one says so and `auto` skips it.
    Expert parallelism: pass local_expert_offset and num_local_experts (= w1.shape[0]); w1/w2
    hold experts offset .. offset+E-1 and pairs routed elsewhere contribute zero. Without expert
    parallelism (neither given) every id must lie in [0, E): a token with an id outside it gets
    NaN in every output column (checked on the device, so the call never synchronizes, eager,
    compiled or captured alike).
    weight_layout: the byte order of every expert of w1 and w2: "row" (as quantized) or "sm90"
    (`prepack_weight(w1)`, `prepack_weight(w2)`: each expert in the Hopper GEMM's register order,
    docs/NUMERICS.md section 4b; 2I and H multiples of 128, H and I multiples of 64), read by the
    cuda backend on sm_90 and by the reference; the scales keep their 128x4 layout.
    """
    if eager(x, w1, w1_scale, w1_global_scale, w2, w2_scale, w2_global_scale, topk_ids, topk_weights,
             a1_global_scale, a2_global_scale, w1_bias, w2_bias):
        return _fused_moe(x, w1, w1_scale, w1_global_scale, w2, w2_scale, w2_global_scale, topk_ids,
                          topk_weights, a1_global_scale, a2_global_scale, local_expert_offset,
                          num_local_experts, out_dtype, backend, block_size, w1_bias, w2_bias, activation,
                          swiglu_alpha, swiglu_limit, activations, weight_layout)
    C.tensors("fused_moe", x=x, w1=w1, w1_scale=w1_scale, w2=w2, w2_scale=w2_scale, topk_ids=topk_ids,
              topk_weights=topk_weights)
    return fused_moe_op(x, w1, w1_scale, w1_global_scale, w2, w2_scale, w2_global_scale, topk_ids,
                        topk_weights, a1_global_scale, a2_global_scale, local_expert_offset,
                        num_local_experts, out_dtype, int(Backend.parse(backend, "fused_moe: backend")),
                        block_size, w1_bias, w2_bias, activation, float(swiglu_alpha), float(swiglu_limit),
                        activations, F.WeightLayout.parse(weight_layout, "fused_moe: weight_layout").value)


def fused_moe_tactics(*args, **kwargs) -> list:
    """The tactics that can run the fused_moe problem of these arguments (fused_moe's; every
    supported backend's for backend "auto"), the heuristic default of each backend first. Run one
    with `torch_fp4.use_tactic(t)`; `with torch_fp4.autotune():` times them."""
    bound = inspect.signature(fused_moe).bind(*args, **kwargs)
    bound.apply_defaults()
    return tactics_for("fused_moe", *_moe_problem(*bound.arguments.values()))


register_problem("route", route, _route_problem)
register_problem("fused_moe", fused_moe, _moe_problem)


def swap_gate_up(w1: torch.Tensor, w1_scale: Optional[torch.Tensor] = None,
                 sf_layout: F.SfLayout | str = "128x4") -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Convert w1 [E, 2I, H/2] between [gate; up] and [up; gate] row orders (its own inverse).

    Swizzled block scales are unswizzled, reordered and swizzled again. Returns new tensors.
    w1 is row-major: the bytes of "sm90" experts are not rows (unprepack_weight them first and
    prepack_weight the result).
    """
    C.dtype("swap_gate_up", "w1", w1, F.FP4_DATA_DTYPES)
    C.ndim("swap_gate_up", "w1", w1, (3,), "a 3-D [E, 2I, H/2] tensor")
    experts, two_i, half_h = w1.shape
    if two_i % 2:
        C.fail("swap_gate_up", "w1", "an even number of rows 2I", two_i)
    inter = two_i // 2
    w = torch.cat((w1[:, inter:], w1[:, :inter]), dim=1)
    if w1_scale is None:
        return w, None
    layout = F.SfLayout.parse(sf_layout)
    check_scale("swap_gate_up", "w1_scale", w1_scale, (experts, two_i, half_h * 2), F.NVFP4, layout)
    sf = F.unswizzle(w1_scale, two_i, half_h * 2 // 16, layout)
    sf = torch.cat((sf[:, inter:], sf[:, :inter]), dim=1)
    return w, F.swizzle(sf, layout)
