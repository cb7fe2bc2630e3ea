"""FP4Linear: an nn.Linear with FP4 weights (W4A16 or W4A4), and its state_dict hooks."""
from __future__ import annotations

from typing import Optional, Union

import torch

from .. import formats as F
from .. import ops
from ..ops import _checks as C
from ._common import _COMPUTE_DTYPES, _activations, _bits, _format, _input, _size, _widen, keep_state_row_major


class FP4Linear(torch.nn.Module):
    """y = x @ W^T (+ bias) with W stored in NVFP4 or MXFP4.

    activations="bf16" (W4A16): x stays in bf16/fp16; activations="fp4" (W4A4): x is quantized
    to the weight's format on every call (NVFP4 with a per-call global scale computed on the
    device, or a fixed `input_global_scale` when one is set). The W4A4 forward is one
    `mm_fp4(x, ..., quantize_a=True)`: the GEMM multiplies the quantized activations' exact
    values (code * block scale, `fp4_quantized_values`) with W4A4's alpha, which is W4A4's
    product (bit for bit on the reference) without FP4 codes and scales in memory (on the GPU
    backends two launches: the values, then the W4A16 GEMM). NVFP4's alpha is formed by mm_fp4
    from the global scales (`b_global_scale`; on the cuda backend inside the GEMM's epilogue),
    and the bias is mm_fp4's `bias`: added in fp32 before the output's one rounding, as F.linear
    does (y = RN(RN_fp32(alpha * acc) + bias), not a second rounding after a separate add).

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
        keep_state_row_major(self, ("weight",))
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
        # from the buffer dict: Module.__getattr__ costs host time in every forward
        return self._buffers["weight_global_scale_bits"].view(torch.float32)

    @property
    def input_global_scale(self) -> torch.Tensor:
        return self._buffers["input_global_scale_bits"].view(torch.float32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out_dtype = _input("FP4Linear", x, self.in_features, "in_features")
        flat = x.dim() == 2   # [tokens, in_features] as it is: no reshape in or out (host time)
        a = x if flat else x.reshape(-1, self.in_features)
        if a.dtype != self.compute_dtype:
            a = a.to(self.compute_dtype)
        a = a.contiguous()
        # The tensors straight from the module's dicts: Module.__getattr__ costs host time on
        # every call of a layer that runs once per token step.
        buffers = self._buffers
        w, w_scale = buffers["weight"].T, buffers["weight_scale"].T
        nv = self.fmt is F.NVFP4
        # NVFP4: mm_fp4 forms alpha from the global scales (no launch of its own); the bias is added
        # in fp32 before the output's one rounding (no launch of its own either)
        gs_w = self.weight_global_scale if nv else None
        bias = self._parameters.get("bias")
        if bias is not None and bias.dtype not in C.OUT_DTYPES:   # what mm_fp4 adds; e.g. after .double()
            bias = bias.float()
        if self.activations == "bf16":
            y = ops.mm_fp4(a, w, None, w_scale, None, out_dtype, self.fmt.block_size,
                           weight_layout=self.weight_layout, b_global_scale=gs_w, bias=bias)
        else:
            # W4A4: mm_fp4 quantizes the 16-bit activations and multiplies their FP4 values
            # (code * block scale, exact in bf16) with W4A4's alpha: W4A4's product without FP4
            # codes and scales in memory (no GEMM here multiplies FP4 natively)
            gs_a = None
            if nv:
                gs_a = self.input_global_scale if self.static_input_scale else ops.compute_global_scale(a)
            y = ops.mm_fp4(a, w, None, w_scale, None, out_dtype, self.fmt.block_size,
                           weight_layout=self.weight_layout, quantize_a=True, a_global_scale=gs_a,
                           b_global_scale=gs_w, bias=bias)
        return _widen(y if flat else y.reshape(*x.shape[:-1], self.out_features), x.dtype)

    def extra_repr(self) -> str:
        mode = "W4A16" if self.activations == "bf16" else "W4A4"
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, format={self.fmt.name}, {mode}, "
                f"compute_dtype={self.compute_dtype}"
                + ("" if self.weight_layout == "row" else f", weight_layout={self.weight_layout}"))


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
