"""Drop-in modules (layer 4): FP4Linear, FP4MoE and quantize_model.

Weights, block scales and global scales are stored as integer buffers (the FP4 bytes and e4m3 /
e8m0 scale bytes as uint8, fp32 global scales as their int32 bit patterns). `model.to(dtype)`,
`.half()` and `.bfloat16()` therefore never round them, `.to(device)` moves them as plain bytes,
and state_dict holds them exactly. Every op accepts these uint8 views directly.
"""
from __future__ import annotations

import copy
import fnmatch
import warnings
from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Union

import torch

from . import formats as F
from . import ops
from .ops import _checks as C
from .ops.moe import _validate_route
from .reference.moe import silu_mul

_COMPUTE_DTYPES = (torch.bfloat16, torch.float16)
# What the modules take as x: the output has x's dtype, as nn.Linear's. The ops write at most
# fp32, so an fp64 output is the fp32 result widened (x is rounded to compute_dtype anyway).
_INPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)


def _input(op: str, x, features: int, what: str) -> torch.dtype:
    """Check a module's input x [..., features]; returns the dtype the ops should write."""
    C.dtype(op, "x", x, _INPUT_DTYPES)
    if x.dim() < 1 or x.shape[-1] != features:
        C.fail(op, "x", f"at least 1-D with last dimension {features} ({what})",
               f"shape {tuple(x.shape)}")
    return x.dtype if x.dtype in C.OUT_DTYPES else torch.float32


def _widen(y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The ops' output in the input's dtype (only fp64 differs; no call otherwise, as every
    `.to` costs host time on the per-call path)."""
    return y if y.dtype == dtype else y.to(dtype)


def _size(op: str, name: str, value) -> int:
    """A positive int size argument."""
    C.integer(op, name, value)
    if value <= 0:
        C.fail(op, name, "a positive int", repr(value))
    return value


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.int32)


class FP4Linear(torch.nn.Module):
    """y = x @ W^T (+ bias) with W stored in NVFP4 or MXFP4.

    activations="bf16" (W4A16): x stays in bf16/fp16; activations="fp4" (W4A4): x is quantized
    to the weight's format on every call (NVFP4 with a per-call global scale computed on the
    device, or a fixed `input_global_scale` when one is set).

    Batch invariance (W4A4 NVFP4): without a fixed input scale, the activation global scale is
    computed on each call over the whole x, so one token's output depends on the other tokens
    in the batch (and on padding rows). With a fixed scale (`calibrate`, `quantize_model(...,
    calibration=...)`, `set_quantized` or a checkpoint's input scale via `from_checkpoint`) each
    token's output is bit-identical alone and inside any batch. W4A16 and MXFP4 W4A4 (per-block
    e8m0 scales only, no global scale) are batch-invariant as they are. state_dict keeps whether
    the scale is fixed (`_extra_state`, a one-byte tensor), so a reloaded layer stays so.

    x: [..., in_features] (any number of leading dimensions, at least 1-D) of dtype bf16, fp16,
    fp32 or fp64; it is rounded to `compute_dtype` for the GEMM, and the output has x's dtype
    (as nn.Linear's): fp32 is the GEMM's fp32 output, fp64 that output widened. Other dtypes
    (integer, bool, fp8, complex) are a TypeError.

    weight_layout: the byte order the FP4 weight is kept in: "row" (as quantized), "sm90" (the
    register-fragment order of the cuda backend's Hopper GEMMs: faster from M = 32 on H100,
    BENCHMARKS.md; out_features % 128 == 0 and in_features % 64 == 0; the other GPU backends do
    not read it, the reference does), or "auto" (default): `preferred_weight_layout` of the
    device the weight is on, i.e. "sm90" on an sm_90 GPU when the shape fits and "row" elsewhere,
    chosen again whenever the module moves (`.to`, `.cuda`, `.cpu`). The current byte order is
    the attribute `weight_layout`. `state_dict` always holds the row-major bytes, and loading
    converts them.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 fmt: Union[str, F.Fp4Format] = "nvfp4", activations: str = "bf16",
                 compute_dtype: torch.dtype = torch.bfloat16,
                 device: Optional[torch.device] = None, weight_layout: str = "auto"):
        super().__init__()
        self.fmt = _format("FP4Linear", fmt)
        C.integer("FP4Linear", "in_features", in_features)
        _size("FP4Linear", "out_features", out_features)
        if in_features <= 0 or in_features % self.fmt.block_size:
            C.fail("FP4Linear", "in_features", f"a positive multiple of {self.fmt.block_size} "
                   f"(the {self.fmt.name.upper()} block size)", in_features)
        self.weight_layout_choice = _weight_layout("FP4Linear", weight_layout, in_features, out_features)
        self.weight_layout = _resolve_layout(self.weight_layout_choice, device, out_features, in_features)
        _activations("FP4Linear", activations)
        if compute_dtype not in _COMPUTE_DTYPES:
            raise TypeError(f"FP4Linear: compute_dtype: expected torch.bfloat16 or torch.float16, "
                            f"got {compute_dtype}")
        self.in_features, self.out_features = in_features, out_features
        self.activations, self.compute_dtype = activations, compute_dtype
        mp, kp = F.padded_scale_shape(out_features, in_features // self.fmt.block_size, "128x4")
        self.register_buffer("weight", torch.zeros(out_features, in_features // 2, dtype=torch.uint8,
                                                   device=device))
        self.register_buffer("weight_scale", torch.zeros(mp, kp, dtype=torch.uint8, device=device))
        # NVFP4 global scales (encode convention), as fp32 bit patterns; 1.0 until set.
        one = torch.ones(1, device=device).view(torch.int32)
        self.register_buffer("weight_global_scale_bits", one.clone())
        self.register_buffer("input_global_scale_bits", one.clone())
        self.static_input_scale = False
        self.bias = torch.nn.Parameter(torch.zeros(out_features, dtype=compute_dtype, device=device),
                                       requires_grad=False) if bias else None
        self.register_state_dict_post_hook(_weight_to_row)
        self.register_load_state_dict_pre_hook(_weight_from_row)
        self.register_load_state_dict_pre_hook(_static_flag_of_older_state)

    # -- construction --------------------------------------------------------------------------
    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, fmt: Union[str, F.Fp4Format] = "nvfp4",
                    activations: str = "bf16", weight_layout: str = "auto") -> "FP4Linear":
        """Quantize an nn.Linear's weight (on its device) into a new FP4Linear."""
        w = linear.weight.detach()
        compute = w.dtype if w.dtype in _COMPUTE_DTYPES else torch.bfloat16
        mod = cls(linear.in_features, linear.out_features, linear.bias is not None, fmt,
                  activations, compute, w.device, weight_layout)
        mod.set_weight(w)
        if linear.bias is not None:
            mod.bias.data.copy_(linear.bias.detach().to(compute))
        return mod

    @classmethod
    def from_checkpoint(cls, weight, bias: Optional[torch.Tensor] = None, activations: str = "bf16",
                        compute_dtype: torch.dtype = torch.bfloat16,
                        weight_layout: str = "auto") -> "FP4Linear":
        """An NVFP4 FP4Linear from a loaded checkpoint weight (torch_fp4.checkpoint.NVFP4Weight).
        Its input global scale, when the checkpoint has one, becomes the fixed W4A4 scale."""
        n, half_k = weight.data.shape
        mod = cls(2 * half_k, n, bias is not None, F.NVFP4, activations, compute_dtype,
                  weight.data.device, weight_layout)
        mod.set_quantized(weight.data, weight.scale, weight.global_scale, weight.input_global_scale)
        if bias is not None:
            mod.bias.data.copy_(bias.detach().to(compute_dtype))
        return mod

    def set_weight(self, w: torch.Tensor) -> None:
        """Quantize a dense weight [out_features, in_features] into this module."""
        if tuple(w.shape) != (self.out_features, self.in_features):
            raise ValueError(f"FP4Linear.set_weight: w: expected shape "
                             f"{(self.out_features, self.in_features)}, got {tuple(w.shape)}")
        w = w.detach().contiguous()
        if w.dtype not in (torch.bfloat16, torch.float16, torch.float32):
            w = w.float()
        if self.fmt is F.NVFP4:
            gs = ops.compute_global_scale(w)
            data, scale = ops.nvfp4_quantize(w, gs)
            self.weight_global_scale_bits.copy_(_bits(gs))
        else:
            data, scale = ops.mxfp4_quantize(w)
        self.weight.copy_(F.to_weight_layout(data, self.weight_layout))
        self.weight_scale.copy_(scale.view(torch.uint8))

    def set_quantized(self, data: torch.Tensor, scale: torch.Tensor,
                      global_scale: Optional[torch.Tensor] = None,
                      input_global_scale: Optional[torch.Tensor] = None) -> None:
        """Load already-quantized weights: data [N, K/2] (row-major), 128x4 scales [Np, Kp], encode
        global scale [1] (NVFP4), and optionally a fixed activation global scale for W4A4."""
        for name, t, buf in (("data", data, self.weight), ("scale", scale, self.weight_scale)):
            if tuple(t.shape) != tuple(buf.shape) or t.element_size() != 1:
                raise ValueError(f"FP4Linear.set_quantized: {name}: expected a 1-byte tensor of "
                                 f"shape {tuple(buf.shape)}, got {t.dtype} {tuple(t.shape)}")
        scales = (("global_scale", global_scale, self.weight_global_scale_bits),
                  ("input_global_scale", input_global_scale, self.input_global_scale_bits))
        for name, t, _ in scales:     # every check before any copy: a refused call changes nothing
            if t is None:
                continue
            if t.dtype != torch.float32 or t.numel() != 1:
                raise ValueError(f"FP4Linear.set_quantized: {name}: expected a one-element fp32 "
                                 f"tensor, got {t.dtype} {tuple(t.shape)}")
            C.positive_finite_scales("FP4Linear.set_quantized", name, t)
        self.weight.copy_(F.to_weight_layout(data, self.weight_layout))
        self.weight_scale.copy_(scale.view(torch.uint8))
        for _, t, buf in scales:
            if t is not None:
                buf.copy_(_bits(t))
        self.static_input_scale = input_global_scale is not None

    # Whether the activation global scale is fixed is a Python flag (forward branches on it
    # without reading a tensor, also under torch.compile); state_dict keeps it beside the scale
    # as a one-byte tensor, so a saved and reloaded calibrated layer stays batch-invariant and
    # the state_dict still holds only tensors (safetensors can save it).
    def get_extra_state(self) -> torch.Tensor:
        return torch.tensor([int(self.static_input_scale)], dtype=torch.uint8)

    def set_extra_state(self, state) -> None:
        if not isinstance(state, torch.Tensor) or state.numel() != 1 or int(state) not in (0, 1):
            C.fail("FP4Linear.load_state_dict", "_extra_state",
                   "a one-element tensor: 1 when the input global scale is fixed, else 0",
                   repr(state))
        self.static_input_scale = bool(int(state))

    def _check_static_scale(self, op: str) -> None:
        """Only W4A4 NVFP4 has an activation global scale to fix."""
        if self.fmt is not F.NVFP4:
            C.fail(op, "fmt", "'nvfp4' (MXFP4 has no global scale: its per-block scales are "
                   "batch-invariant already)", repr(self.fmt.name))
        if self.activations != "fp4":
            C.fail(op, "activations", "'fp4' (W4A16 does not quantize its input, so it needs no "
                   "input scale)", repr(self.activations))

    @torch.no_grad()
    def calibrate(self, x: torch.Tensor) -> None:
        """Fix the W4A4 NVFP4 activation global scale from sample inputs x [..., in_features]:
        the scale a call on all of x would compute (`compute_global_scale` of x rounded to
        compute_dtype), used for every later call, so outputs no longer depend on the batch.
        ValueError for MXFP4 (no global scale) or W4A16 (activations not quantized), or an x
        holding no token."""
        op = "FP4Linear.calibrate"
        self._check_static_scale(op)
        _input(op, x, self.in_features, "in_features")
        a = x.reshape(-1, self.in_features).to(self.compute_dtype).contiguous()
        if a.shape[0] == 0:
            C.fail(op, "x", "at least one token", f"shape {tuple(x.shape)}")
        self._set_input_scale(ops.compute_global_scale(a))

    def _set_input_scale(self, gs: torch.Tensor) -> None:
        self.input_global_scale_bits.copy_(_bits(gs.to(torch.float32)))
        self.static_input_scale = True

    def set_weight_layout(self, weight_layout: str) -> None:
        """Keep the weight in `weight_layout` ("row", "sm90" or "auto") from now on (its bytes are
        converted in place)."""
        self.weight_layout_choice = _weight_layout("FP4Linear.set_weight_layout", weight_layout,
                                                   self.in_features, self.out_features)
        self._convert_weight(_resolve_layout(self.weight_layout_choice, self.weight.device,
                                             self.out_features, self.in_features))

    def _convert_weight(self, layout: str) -> None:
        if layout == self.weight_layout:
            return
        if self.weight.device.type != "meta":  # meta tensors hold no bytes to reorder
            row = F.from_weight_layout(self.weight, self.weight_layout)
            self.weight.copy_(F.to_weight_layout(row, layout))
        self.weight_layout = layout

    def _apply(self, fn, recurse=True):
        """Module moves (`.to(device)`, `.cuda()`, `.cpu()`) keep the bytes; weight_layout="auto"
        then reorders them into the new device's preferred layout."""
        super()._apply(fn, recurse)
        if getattr(self, "weight_layout_choice", None) == "auto":
            self._convert_weight(_resolve_layout("auto", self.weight.device, self.out_features,
                                                 self.in_features))
        return self

    # -- views used by forward -----------------------------------------------------------------
    @property
    def weight_global_scale(self) -> torch.Tensor:
        return self.weight_global_scale_bits.view(torch.float32)

    @property
    def input_global_scale(self) -> torch.Tensor:
        return self.input_global_scale_bits.view(torch.float32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out_dtype = _input("FP4Linear", x, self.in_features, "in_features")
        lead = x.shape[:-1]
        a = x.reshape(-1, self.in_features).to(self.compute_dtype).contiguous()
        nv = self.fmt is F.NVFP4
        if self.activations == "bf16":
            alpha = F.nvfp4_alpha(None, self.weight_global_scale) if nv else None
            y = ops.mm_fp4(a, self.weight.T, None, self.weight_scale.T, alpha, out_dtype,
                           self.fmt.block_size, weight_layout=self.weight_layout)
        elif nv:
            gs_a = self.input_global_scale if self.static_input_scale else ops.compute_global_scale(a)
            aq, as_ = ops.nvfp4_quantize(a, gs_a)
            y = ops.mm_fp4(aq, self.weight.T, as_, self.weight_scale.T,
                           F.nvfp4_alpha(gs_a, self.weight_global_scale), out_dtype,
                           weight_layout=self.weight_layout)
        else:
            aq, as_ = ops.mxfp4_quantize(a)
            y = ops.mm_fp4(aq, self.weight.T, as_, self.weight_scale.T, None, out_dtype, 32,
                           weight_layout=self.weight_layout)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return _widen(y.reshape(*lead, self.out_features), x.dtype)

    def extra_repr(self) -> str:
        mode = "W4A16" if self.activations == "bf16" else "W4A4"
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, format={self.fmt.name}, {mode}, "
                f"compute_dtype={self.compute_dtype}"
                + ("" if self.weight_layout == "row" else f", weight_layout={self.weight_layout}"))


def _weight_to_row(module: FP4Linear, state_dict: dict, prefix: str, local_metadata) -> None:
    """state_dict holds the row-major weight bytes whatever layout the module keeps."""
    key = prefix + "weight"
    if module.weight_layout != "row" and key in state_dict:
        state_dict[key] = F.from_weight_layout(state_dict[key], module.weight_layout)


def _weight_from_row(module: FP4Linear, state_dict: dict, prefix: str, local_metadata, strict,
                     missing_keys, unexpected_keys, error_msgs) -> None:
    """Loading converts the row-major weight bytes of a state_dict into the module's layout (a
    tensor of another shape is left for load_state_dict to report)."""
    key = prefix + "weight"
    t = state_dict.get(key)
    if (module.weight_layout != "row" and isinstance(t, torch.Tensor) and t.element_size() == 1
            and tuple(t.shape) == tuple(module.weight.shape)):
        state_dict[key] = F.to_weight_layout(t.contiguous(), module.weight_layout)


_UNSET_SCALE_BITS = 0x3F800000   # the bits of 1.0, input_global_scale_bits until a scale is fixed


def _static_flag_of_older_state(module: FP4Linear, state_dict: dict, prefix: str, local_metadata,
                                strict, missing_keys, unexpected_keys, error_msgs) -> None:
    """A state_dict saved before the flag was kept has no `_extra_state`: a layer whose input
    scale was fixed is recognised by that scale (a per-call scale is never stored, so the
    buffer keeps 1.0 otherwise); a fixed scale of exactly 1.0 loads as per-call there."""
    key, scale = prefix + "_extra_state", state_dict.get(prefix + "input_global_scale_bits")
    if key not in state_dict and isinstance(scale, torch.Tensor) and scale.numel() == 1:
        state_dict[key] = torch.tensor([int(int(scale.reshape(())) != _UNSET_SCALE_BITS)],
                                       dtype=torch.uint8)


def _layout_choice(where: str, weight_layout) -> str:
    """A valid weight-layout name: "auto", "row" or "sm90" (a WeightLayout member is accepted)."""
    if weight_layout == "auto":
        return "auto"
    if isinstance(weight_layout, str) and weight_layout not in ("row", "sm90"):
        raise ValueError(f"{where}: weight_layout: expected one of 'auto', 'row', 'sm90', "
                         f"got {weight_layout!r}")
    return F.WeightLayout.parse(weight_layout, f"{where}: weight_layout").value


def _weight_layout(where: str, weight_layout, in_features: int, out_features: int) -> str:
    """A valid weight-layout choice for an in_features -> out_features layer."""
    choice = _layout_choice(where, weight_layout)
    reason = F.sm90_layout_reason(out_features, in_features) if choice == "sm90" else None
    if reason is not None:
        raise ValueError(f"{where}: weight_layout: expected 'row' for a {in_features} -> {out_features} "
                         f"layer ({reason}), got {choice!r}")
    return choice


def _resolve_layout(choice: str, device: Optional[torch.device], out_features: int,
                    in_features: int) -> str:
    """The layout a weight is kept in for the module's choice ("auto": the device's preferred)."""
    if choice != "auto":
        return choice
    return ops.preferred_weight_layout(device if device is not None else "cpu", out_features,
                                       in_features).value


def _format(where: str, fmt: Union[str, F.Fp4Format]) -> F.Fp4Format:
    if isinstance(fmt, F.Fp4Format):
        return fmt
    for f in F.FORMATS:
        if f.name == fmt:
            return f
    C.fail(where, "fmt", "'nvfp4' or 'mxfp4'", repr(fmt))


def _activations(where: str, activations) -> str:
    if activations not in ("bf16", "fp4"):
        C.fail(where, "activations", "'bf16' (W4A16) or 'fp4' (W4A4)", repr(activations))
    return activations


ExpertWeights = Union[torch.Tensor, Sequence]


def _dense_weight(where: str, item) -> torch.Tensor:
    """One expert matrix from an nn.Linear (no bias) or a 2-D tensor."""
    if isinstance(item, torch.nn.Linear):
        if item.bias is not None:
            raise ValueError(f"FP4MoE: {where}: expected an nn.Linear without bias (FP4 experts "
                             f"have none), got one with bias")
        item = item.weight
    if not isinstance(item, torch.Tensor) or item.dim() != 2:
        got = f"shape {tuple(item.shape)}" if isinstance(item, torch.Tensor) else type(item).__name__
        raise TypeError(f"FP4MoE: {where}: expected an nn.Linear or a 2-D tensor, got {got}")
    return item.detach()


def _stack_experts(name: str, experts: ExpertWeights, pairs: bool) -> torch.Tensor:
    """[E, rows, cols] from a 3-D tensor or a sequence of per-expert weights. With `pairs` (w1) an
    entry may also be a (gate, up) pair, stacked as [gate; up] rows."""
    if isinstance(experts, torch.Tensor):
        if experts.dim() != 3:
            raise ValueError(f"FP4MoE: {name}: expected a 3-D [E, rows, cols] tensor, "
                             f"got shape {tuple(experts.shape)}")
        return experts.detach()
    if not isinstance(experts, (list, tuple, torch.nn.ModuleList)) or not len(experts):
        raise TypeError(f"FP4MoE: {name}: expected a 3-D tensor or a non-empty sequence of "
                        f"per-expert weights, got {type(experts).__name__}")
    mats = []
    for e, item in enumerate(experts):
        if pairs and isinstance(item, (list, tuple)):
            if len(item) != 2:
                raise ValueError(f"FP4MoE: {name}[{e}]: expected a (gate, up) pair, "
                                 f"got {len(item)} items")
            gate, up = (_dense_weight(f"{name}[{e}][{i}]", m) for i, m in enumerate(item))
            if gate.shape != up.shape:
                raise ValueError(f"FP4MoE: {name}[{e}]: expected gate and up of one shape, got "
                                 f"{tuple(gate.shape)} and {tuple(up.shape)}")
            mats.append(torch.cat((gate, up)))
        else:
            mats.append(_dense_weight(f"{name}[{e}]", item))
        if mats[-1].shape != mats[0].shape:
            raise ValueError(f"FP4MoE: {name}[{e}]: expected shape {tuple(mats[0].shape)} (that of "
                             f"expert 0), got {tuple(mats[-1].shape)}")
    return torch.stack(mats)


class FP4MoE(torch.nn.Module):
    """Mixture of NVFP4 experts with a dense router: a drop-in MoE MLP.

    forward(x [..., H]) routes each token with `router` (an nn.Linear H -> E kept in its own
    dtype) and `torch_fp4.route`, then runs `torch_fp4.fused_moe`: out = sum_j w_j *
    down(silu(gate) * up) over the top_k experts. Experts live in buffers: w1 [E, 2I, H/2]
    ([gate; up] rows) and w2 [E, H, I/2] as FP4 bytes, their 128x4 block scales, and one encode
    global scale per expert (as fp32 bit patterns, so dtype casts never round them).
    activations="bf16" runs W4A16; "fp4" runs W4A4 with fixed activation global scales
    (a1 [1] for the input, a2 [E] for the intermediate activation), set by `calibrate` or given.
    Routing config (top_k, method, renormalize, and for "deepseek_v3" the correction bias
    `routing_bias`, n_group, topk_group, routed_scaling_factor) is that of `torch_fp4.route`.
    Traces with torch.compile(fullgraph=True) and has no host synchronization.

    x: [..., H] (at least 1-D) of dtype bf16, fp16, fp32 or fp64, rounded to `compute_dtype`
    for the router and the experts; the output has x's dtype, as FP4Linear's (fp32: the fused
    MoE's fp32 output, fp64: that output widened). Other dtypes are a TypeError.
    """

    def __init__(self, hidden_size: int, intermediate_size: int, num_experts: int, top_k: int,
                 method: str = "softmax", renormalize: bool = False, n_group: Optional[int] = None,
                 topk_group: Optional[int] = None, routed_scaling_factor: float = 1.0,
                 activations: str = "bf16", compute_dtype: torch.dtype = torch.bfloat16,
                 router_bias: bool = False, device: Optional[torch.device] = None):
        super().__init__()
        _activations("FP4MoE", activations)
        if compute_dtype not in _COMPUTE_DTYPES:
            raise TypeError(f"FP4MoE: compute_dtype: expected torch.bfloat16 or torch.float16, "
                            f"got {compute_dtype}")
        for name, value in (("hidden_size", hidden_size), ("intermediate_size", intermediate_size)):
            C.integer("FP4MoE", name, value)
            if value <= 0 or value % 16:
                C.fail("FP4MoE", name, "a positive multiple of 16 (the NVFP4 block size)", value)
        _size("FP4MoE", "num_experts", num_experts)
        meta = torch.device("meta")
        _validate_route(torch.empty(0, num_experts, device=meta), top_k, method, renormalize,
                        torch.empty(num_experts, device=meta) if method == "deepseek_v3" else None,
                        n_group, topk_group, float(routed_scaling_factor), "auto", op="FP4MoE")
        h, i, e = hidden_size, intermediate_size, num_experts
        self.hidden_size, self.intermediate_size, self.num_experts = h, i, e
        self.top_k, self.method, self.renormalize = top_k, method, renormalize
        self.n_group, self.topk_group = n_group, topk_group
        self.routed_scaling_factor = float(routed_scaling_factor)
        self.activations, self.compute_dtype = activations, compute_dtype
        self.router = torch.nn.Linear(h, e, bias=router_bias, device=device,
                                      dtype=compute_dtype).requires_grad_(False)
        u8 = dict(dtype=torch.uint8, device=device)
        self.register_buffer("w1", torch.zeros(e, 2 * i, h // 2, **u8))
        self.register_buffer("w1_scale", torch.zeros(e, *F.padded_scale_shape(2 * i, h // 16, "128x4"), **u8))
        self.register_buffer("w2", torch.zeros(e, h, i // 2, **u8))
        self.register_buffer("w2_scale", torch.zeros(e, *F.padded_scale_shape(h, i // 16, "128x4"), **u8))
        ones = torch.ones(e, device=device).view(torch.int32)
        for name in ("w1_global_scale_bits", "w2_global_scale_bits", "a2_global_scale_bits"):
            self.register_buffer(name, ones.clone())
        self.register_buffer("a1_global_scale_bits", ones[:1].clone())
        if method == "deepseek_v3":
            self.register_buffer("routing_bias_bits", torch.zeros(e, device=device).view(torch.int32))

    # -- construction --------------------------------------------------------------------------
    @classmethod
    def _for_router(cls, router: torch.nn.Linear, intermediate_size: int, top_k: int, method: str,
                    renormalize: bool, routing_bias, n_group, topk_group, routed_scaling_factor,
                    activations: str, compute_dtype: torch.dtype) -> "FP4MoE":
        if not isinstance(router, torch.nn.Linear):
            raise TypeError(f"FP4MoE: router: expected an nn.Linear (hidden -> experts), "
                            f"got {type(router).__name__}")
        if method == "deepseek_v3" and routing_bias is None:
            raise ValueError("FP4MoE: routing_bias: expected a [E] correction-bias tensor for "
                             "method 'deepseek_v3', got None")
        if method != "deepseek_v3" and routing_bias is not None:
            raise ValueError(f"FP4MoE: routing_bias: expected None for method {method!r} (only "
                             f"'deepseek_v3' uses it), got a tensor")
        mod = cls(router.in_features, intermediate_size, router.out_features, top_k, method,
                  renormalize, n_group, topk_group, routed_scaling_factor, activations,
                  compute_dtype, router.bias is not None, router.weight.device)
        mod.router = copy.deepcopy(router).requires_grad_(False)
        if routing_bias is not None:
            if tuple(routing_bias.shape) != (mod.num_experts,):
                raise ValueError(f"FP4MoE: routing_bias: expected shape ({mod.num_experts},), "
                                 f"got {tuple(routing_bias.shape)}")
            mod.routing_bias_bits.copy_(routing_bias.detach().float().view(torch.int32))
        return mod

    @classmethod
    def from_experts(cls, router: torch.nn.Linear, w1: ExpertWeights, w2: ExpertWeights, *,
                     top_k: int, method: str = "softmax", renormalize: bool = False,
                     routing_bias: Optional[torch.Tensor] = None, n_group: Optional[int] = None,
                     topk_group: Optional[int] = None, routed_scaling_factor: float = 1.0,
                     activations: str = "bf16", calibration: Optional[torch.Tensor] = None,
                     compute_dtype: torch.dtype = torch.bfloat16) -> "FP4MoE":
        """Quantize dense experts to NVFP4 (one global scale per expert matrix).

        router: nn.Linear H -> E, copied (frozen: FP4MoE is inference-only), kept dense.
        w1: [E, 2I, H] ([gate; up] rows), or a sequence of E entries, each an nn.Linear or
        tensor [2I, H] or a (gate, up) pair of nn.Linear / tensors [I, H].
        w2: [E, H, I], or a sequence of E nn.Linear / tensors [H, I].
        W4A4 (activations="fp4") needs `calibration`, sample inputs [..., H] to `calibrate` on.
        """
        w1, w2 = _stack_experts("w1", w1, pairs=True), _stack_experts("w2", w2, pairs=False)
        if activations == "fp4" and calibration is None:
            raise ValueError("FP4MoE.from_experts: calibration: expected sample inputs [..., H] "
                             "for activations='fp4' (W4A4 needs activation global scales), got None")
        mod = cls._for_router(router, w1.shape[1] // 2, top_k, method, renormalize, routing_bias,
                              n_group, topk_group, routed_scaling_factor, activations, compute_dtype)
        mod.set_weights(w1, w2)
        if calibration is not None:
            mod.calibrate(calibration)
        return mod

    @classmethod
    def from_quantized(cls, router: torch.nn.Linear, w1: torch.Tensor, w1_scale: torch.Tensor,
                       w1_global_scale: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor,
                       w2_global_scale: torch.Tensor, *, top_k: int, method: str = "softmax",
                       renormalize: bool = False, routing_bias: Optional[torch.Tensor] = None,
                       n_group: Optional[int] = None, topk_group: Optional[int] = None,
                       routed_scaling_factor: float = 1.0, activations: str = "bf16",
                       a1_global_scale: Optional[torch.Tensor] = None,
                       a2_global_scale: Optional[torch.Tensor] = None,
                       calibration: Optional[torch.Tensor] = None, sf_layout: str = "128x4",
                       compute_dtype: torch.dtype = torch.bfloat16) -> "FP4MoE":
        """An FP4MoE from NVFP4 experts: w1 [E, 2I, H/2], w2 [E, H, I/2] (1-byte FP4 data), their
        block scales in `sf_layout` ("128x4" [E, Mp, Kp], or "linear" [E, rows, cols/16] as
        checkpoints store them), encode global scales [E]. W4A4 takes a1_global_scale [1] and
        a2_global_scale [1] or [E], or `calibration` inputs to measure them."""
        if not isinstance(w1, torch.Tensor) or w1.dim() != 3:
            raise ValueError(f"FP4MoE.from_quantized: w1: expected a 3-D [E, 2I, H/2] tensor, got "
                             f"{tuple(w1.shape) if isinstance(w1, torch.Tensor) else type(w1).__name__}")
        given = (a1_global_scale is not None, a2_global_scale is not None)
        if activations == "fp4" and calibration is None and given != (True, True):
            raise ValueError("FP4MoE.from_quantized: a1_global_scale: expected a1_global_scale and "
                             "a2_global_scale, or calibration inputs, for activations='fp4', got "
                             f"a1_global_scale={'set' if given[0] else None}, "
                             f"a2_global_scale={'set' if given[1] else None}")
        mod = cls._for_router(router, w1.shape[1] // 2, top_k, method, renormalize, routing_bias,
                              n_group, topk_group, routed_scaling_factor, activations, compute_dtype)
        mod.set_quantized(w1, w1_scale, w1_global_scale, w2, w2_scale, w2_global_scale, sf_layout)
        if calibration is not None:
            mod.calibrate(calibration)
        elif any(given):
            mod.set_activation_scales(a1_global_scale, a2_global_scale)
        return mod

    def set_weights(self, w1: torch.Tensor, w2: torch.Tensor) -> None:
        """Quantize dense experts w1 [E, 2I, H] and w2 [E, H, I] into this module."""
        e, h, i = self.num_experts, self.hidden_size, self.intermediate_size
        for name, w, want in (("w1", w1, (e, 2 * i, h)), ("w2", w2, (e, h, i))):
            if tuple(w.shape) != want:
                raise ValueError(f"FP4MoE.set_weights: {name}: expected shape {want}, "
                                 f"got {tuple(w.shape)}")
        for w, data, scale, gs in ((w1, self.w1, self.w1_scale, self.w1_global_scale_bits),
                                   (w2, self.w2, self.w2_scale, self.w2_global_scale_bits)):
            w = w.detach().to(self.w1.device).contiguous()
            if w.dtype not in (torch.bfloat16, torch.float16, torch.float32):
                w = w.float()
            g = torch.cat([ops.compute_global_scale(m) for m in w])
            q, s = ops.nvfp4_quantize(w, g)
            data.copy_(q.view(torch.uint8))
            scale.copy_(s.view(torch.uint8))
            gs.copy_(g.view(torch.int32))

    def set_quantized(self, w1, w1_scale, w1_global_scale, w2, w2_scale, w2_global_scale,
                      sf_layout: str = "128x4") -> None:
        """Load NVFP4 experts (see from_quantized); bytes are copied unchanged."""
        if sf_layout not in ("128x4", "linear"):
            raise ValueError(f"FP4MoE.set_quantized: sf_layout: expected '128x4' or 'linear', "
                             f"got {sf_layout!r}")
        e, h, i = self.num_experts, self.hidden_size, self.intermediate_size
        linear = sf_layout == "linear"
        for name, t, buf in (("w1", w1, self.w1), ("w2", w2, self.w2),
                             ("w1_scale", w1_scale, self.w1_scale), ("w2_scale", w2_scale, self.w2_scale)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"FP4MoE.set_quantized: {name}: expected a torch.Tensor, "
                                f"got {type(t).__name__}")
            want = tuple(buf.shape)
            if linear and name == "w1_scale":
                want = (e, 2 * i, h // 16)
            elif linear and name == "w2_scale":
                want = (e, h, i // 16)
            if tuple(t.shape) != want or t.element_size() != 1:
                raise ValueError(f"FP4MoE.set_quantized: {name}: expected a 1-byte tensor of shape "
                                 f"{want}, got {t.dtype} {tuple(t.shape)}")
            if linear and name.endswith("scale"):
                t = F.swizzle(t, F.SfLayout.LAYOUT_128x4)
            buf.copy_(t.view(torch.uint8))
        for name, t, buf in (("w1_global_scale", w1_global_scale, self.w1_global_scale_bits),
                             ("w2_global_scale", w2_global_scale, self.w2_global_scale_bits)):
            self._set_scale(name, t, buf, (self.num_experts,))

    def set_activation_scales(self, a1_global_scale: torch.Tensor, a2_global_scale: torch.Tensor) -> None:
        """Fixed W4A4 activation encode global scales: a1 [1] (input), a2 [1] or [E]."""
        self._set_scale("a1_global_scale", a1_global_scale, self.a1_global_scale_bits, (1,))
        self._set_scale("a2_global_scale", a2_global_scale, self.a2_global_scale_bits,
                        (1, self.num_experts))

    @staticmethod
    def _set_scale(name: str, t, buf: torch.Tensor, sizes: tuple) -> None:
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or t.numel() not in sizes:
            got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
            want = " or ".join(f"[{n}]" for n in sizes)
            raise ValueError(f"FP4MoE: {name}: expected an fp32 tensor of shape {want}, got {got}")
        C.positive_finite_scales("FP4MoE", name, t)
        buf.copy_(t.reshape(-1).to(buf.device).view(torch.int32).expand(buf.numel()))

    @torch.no_grad()
    def calibrate(self, x: torch.Tensor) -> None:
        """Set the W4A4 activation global scales from sample inputs x [..., H] (eager; reads
        maxima on the host): a1 = 2688 / amax(x); a2[e] = 2688 / amax of expert e's intermediate
        activation silu(gate) * up (W4A16 experts) over the tokens routed to it (all tokens when
        none is)."""
        a = self._tokens(x, "calibrate")[0]
        ids = self._route(a)[0]
        a2 = []
        for e in range(self.num_experts):
            h = ops.mm_fp4(a, self.w1[e].T, None, self.w1_scale[e].T,
                           F.nvfp4_alpha(None, self.w1_global_scale[e:e + 1]), torch.bfloat16)
            act = silu_mul(h)
            hit = (ids == e).any(-1)
            a2.append(ops.compute_global_scale(act[hit] if bool(hit.any()) else act))
        self.set_activation_scales(ops.compute_global_scale(a), torch.cat(a2))

    # -- views used by forward -----------------------------------------------------------------
    def _f32(self, name: str) -> torch.Tensor:
        return getattr(self, name + "_bits").view(torch.float32)

    w1_global_scale = property(lambda self: self._f32("w1_global_scale"))
    w2_global_scale = property(lambda self: self._f32("w2_global_scale"))
    a1_global_scale = property(lambda self: self._f32("a1_global_scale"))
    a2_global_scale = property(lambda self: self._f32("a2_global_scale"))
    routing_bias = property(lambda self: self._f32("routing_bias") if self.method == "deepseek_v3" else None)

    def _tokens(self, x: torch.Tensor, where: str) -> tuple[torch.Tensor, torch.dtype]:
        """x as [T, H] tokens in compute_dtype, and the dtype the ops should write."""
        out_dtype = _input(f"FP4MoE.{where}", x, self.hidden_size, "hidden_size")
        return x.reshape(-1, self.hidden_size).to(self.compute_dtype).contiguous(), out_dtype

    def _route(self, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.router(a.to(self.router.weight.dtype))
        return ops.route(logits, self.top_k, self.method, self.renormalize, self.routing_bias,
                         self.n_group, self.topk_group, self.routed_scaling_factor)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, out_dtype = self._tokens(x, "forward")
        ids, weights = self._route(a)
        scales = {}
        if self.activations == "fp4":
            scales = dict(a1_global_scale=self.a1_global_scale, a2_global_scale=self.a2_global_scale)
        y = ops.fused_moe(a, self.w1, self.w1_scale, self.w1_global_scale, self.w2, self.w2_scale,
                          self.w2_global_scale, ids, weights, out_dtype=out_dtype, **scales)
        return _widen(y.reshape(*x.shape[:-1], self.hidden_size), x.dtype)

    def extra_repr(self) -> str:
        mode = "W4A16" if self.activations == "bf16" else "W4A4"
        return (f"hidden_size={self.hidden_size}, intermediate_size={self.intermediate_size}, "
                f"num_experts={self.num_experts}, top_k={self.top_k}, method={self.method!r}, "
                f"format=nvfp4, {mode}")


Filter = Union[None, str, Callable[[str, torch.nn.Module], bool]]


@dataclass(frozen=True)
class QuantConfig:
    """What quantize_model does.

    fmt: "nvfp4" or "mxfp4"; activations: "bf16" (W4A16) or "fp4" (W4A4);
    include: None (every nn.Linear), a glob on the module's qualified name ("*.mlp.*"), or a
    predicate (name, module) -> bool; exclude: the same form, applied after include.
    weight_layout: "auto" (each layer in its device's preferred layout, following the module
    across devices), "row", or "sm90" for every converted layer the layout can hold
    (out_features % 128 == 0, in_features % 64 == 0; the others stay "row"): see FP4Linear.
    Each field is checked on construction (ValueError / TypeError naming it).
    """
    fmt: str = "nvfp4"
    activations: str = "bf16"
    include: Filter = None
    exclude: Filter = None
    weight_layout: str = "auto"

    def __post_init__(self):
        _format("QuantConfig", self.fmt)
        _activations("QuantConfig", self.activations)
        for name in ("include", "exclude"):
            flt = getattr(self, name)
            if not (flt is None or isinstance(flt, str) or callable(flt)):
                C.fail("QuantConfig", name, "None, a glob string or a predicate (name, module) -> bool",
                       type(flt).__name__, TypeError)
        _layout_choice("QuantConfig", self.weight_layout)


def _matches(flt: Filter, name: str, module: torch.nn.Module, default: bool) -> bool:
    if flt is None:
        return default
    if isinstance(flt, str):
        return fnmatch.fnmatchcase(name, flt)
    return bool(flt(name, module))


def quantize_model(model: torch.nn.Module, config: QuantConfig = QuantConfig(),
                   calibration=None) -> torch.nn.Module:
    """Replace the nn.Linear modules of `model` selected by `config` with FP4Linear, in place.
    Modules inside an FP4MoE (its dense router) are left alone.

    Layers whose in_features is not a multiple of the block size stay dense, and a warning
    names each of them. Returns the model. A model that is not an nn.Module, a bare nn.Linear
    (which cannot replace itself: use FP4Linear.from_linear), or a config that is not a
    QuantConfig, is a TypeError.

    W4A4 NVFP4 (fmt="nvfp4", activations="fp4") without `calibration` computes each layer's
    activation global scale on every call over the whole batch, so a token's output depends on
    the other tokens (and padding) in the batch. `calibration`, sample inputs to the model (a
    tensor, a tuple of positional arguments or a dict of keyword arguments, passed to
    `model(...)` once under torch.no_grad(), in the model's current train/eval mode), fixes each
    converted layer's input scale to `compute_global_scale` of all the inputs that layer saw in
    that run; outputs are then batch-invariant (see FP4Linear). A converted layer the run never
    reaches keeps the per-call scale, and a warning names it. `calibration` with any other
    config is a ValueError (W4A16 and MXFP4 have no activation global scale to fix).
    """
    if not isinstance(model, torch.nn.Module):
        C.fail("quantize_model", "model", "an nn.Module", type(model).__name__, TypeError)
    if isinstance(model, torch.nn.Linear):     # it cannot replace itself in place
        C.fail("quantize_model", "model", "a module holding nn.Linear layers (for one nn.Linear use "
               "FP4Linear.from_linear(linear, fmt, activations))", "an nn.Linear", TypeError)
    if not isinstance(config, QuantConfig):
        C.fail("quantize_model", "config", "a QuantConfig", type(config).__name__, TypeError)
    fmt = _format("QuantConfig", config.fmt)
    layout = _layout_choice("QuantConfig", config.weight_layout)
    if calibration is not None:
        if not isinstance(calibration, (torch.Tensor, tuple, dict)):
            C.fail("quantize_model", "calibration", "None, a tensor, a tuple of positional "
                   "arguments or a dict of keyword arguments", type(calibration).__name__, TypeError)
        if fmt is not F.NVFP4 or config.activations != "fp4":
            C.fail("quantize_model", "calibration", "None unless fmt='nvfp4' and activations='fp4' "
                   "(only W4A4 NVFP4 has an activation global scale)",
                   f"sample inputs with fmt={fmt.name!r}, activations={config.activations!r}")
    skipped = []
    # FP4MoE keeps its router dense: nothing inside one is touched.
    moe = tuple(name + "." if name else "" for name, mod in model.named_modules()
                if isinstance(mod, FP4MoE))
    targets = [(name, mod) for name, mod in model.named_modules()
               if isinstance(mod, torch.nn.Linear) and not isinstance(mod, FP4Linear)
               and not (moe and name.startswith(moe))
               and _matches(config.include, name, mod, True)
               and not _matches(config.exclude, name, mod, False)]
    converted = []
    for name, linear in targets:
        if linear.in_features % fmt.block_size:
            skipped.append(f"{name} (in_features={linear.in_features})")
            continue
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        fits = F.sm90_layout_reason(linear.out_features, linear.in_features) is None
        wl = layout if fits or layout == "auto" else "row"
        mod = FP4Linear.from_linear(linear, fmt, config.activations, wl)
        setattr(parent, child, mod)
        converted.append((name, mod))
    if skipped:
        warnings.warn(f"quantize_model: kept {len(skipped)} layer(s) dense because in_features is "
                      f"not a multiple of {fmt.block_size}: " + ", ".join(skipped), stacklevel=2)
    if calibration is not None and converted:
        _calibrate_linears(model, converted, calibration)
    return model


@torch.no_grad()
def _calibrate_linears(model: torch.nn.Module, layers: list, calibration) -> None:
    """Fix each W4A4 layer's input scale from the inputs it sees in one run of the model.

    The run keeps the FP4 weights but leaves activations unquantized (W4A16), as FP4MoE.calibrate
    measures its intermediate activation through W4A16 experts: each layer sees the inputs the
    quantized model gives it, without the per-call W4A4 scales whose batch dependence
    calibration exists to remove.
    """
    amax: dict = {}

    def record(mod, args, kwargs):
        x = args[0] if args else kwargs.get("x")
        _input("FP4Linear", x, mod.in_features, "in_features")
        # The running maximum is kept in compute_dtype, the dtype forward quantizes in, so
        # compute_global_scale of it is bit-identical to that of all the inputs concatenated.
        a = x.detach().reshape(-1, mod.in_features).to(mod.compute_dtype)
        if a.shape[0] == 0:
            return
        m = a.abs().amax().reshape(1)
        amax[mod] = m if mod not in amax else torch.maximum(amax[mod], m)

    hooks = []
    try:
        for _, mod in layers:
            mod.activations = "bf16"
            hooks.append(mod.register_forward_pre_hook(record, with_kwargs=True))
        if isinstance(calibration, dict):
            model(**calibration)
        elif isinstance(calibration, tuple):
            model(*calibration)
        else:
            model(calibration)
    finally:
        for h in hooks:
            h.remove()
        for _, mod in layers:
            mod.activations = "fp4"
    missed = []
    for name, mod in layers:
        if mod in amax:
            mod._set_input_scale(ops.compute_global_scale(amax[mod].contiguous()))
        else:
            missed.append(name)
    if missed:
        warnings.warn(f"quantize_model: calibration: {len(missed)} layer(s) saw no input and keep "
                      "the per-call (batch-dependent) activation global scale: " + ", ".join(missed),
                      stacklevel=3)
