"""Drop-in modules (layer 4): FP4Linear and quantize_model.

Weights, block scales and global scales are stored as integer buffers (the FP4 bytes and e4m3 /
e8m0 scale bytes as uint8, fp32 global scales as their int32 bit patterns). `model.to(dtype)`,
`.half()` and `.bfloat16()` therefore never round them, `.to(device)` moves them as plain bytes,
and state_dict holds them exactly. Every op accepts these uint8 views directly.
"""
from __future__ import annotations

import fnmatch
import warnings
from dataclasses import dataclass
from typing import Callable, Optional, Union

import torch

from . import formats as F
from . import ops
from .ops._checks import OUT_DTYPES

_COMPUTE_DTYPES = (torch.bfloat16, torch.float16)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.int32)


class FP4Linear(torch.nn.Module):
    """y = x @ W^T (+ bias) with W stored in NVFP4 or MXFP4.

    activations="bf16" (W4A16): x stays in bf16/fp16; activations="fp4" (W4A4): x is quantized
    to the weight's format on every call (NVFP4 with a per-call global scale computed on the
    device, or a fixed `input_global_scale` when one is set). Inputs may have any number of
    leading dimensions; fp32 inputs are computed in `compute_dtype` and returned in fp32.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 fmt: Union[str, F.Fp4Format] = "nvfp4", activations: str = "bf16",
                 compute_dtype: torch.dtype = torch.bfloat16,
                 device: Optional[torch.device] = None):
        super().__init__()
        self.fmt = _format(fmt)
        if activations not in ("bf16", "fp4"):
            raise ValueError(f"FP4Linear: activations: expected 'bf16' (W4A16) or 'fp4' (W4A4), "
                             f"got {activations!r}")
        if in_features % self.fmt.block_size:
            raise ValueError(f"FP4Linear: in_features: expected a multiple of {self.fmt.block_size} "
                             f"(the {self.fmt.name.upper()} block size), got {in_features}")
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

    # -- construction --------------------------------------------------------------------------
    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, fmt: Union[str, F.Fp4Format] = "nvfp4",
                    activations: str = "bf16") -> "FP4Linear":
        """Quantize an nn.Linear's weight (on its device) into a new FP4Linear."""
        w = linear.weight.detach()
        compute = w.dtype if w.dtype in _COMPUTE_DTYPES else torch.bfloat16
        mod = cls(linear.in_features, linear.out_features, linear.bias is not None, fmt,
                  activations, compute, w.device)
        mod.set_weight(w)
        if linear.bias is not None:
            mod.bias.data.copy_(linear.bias.detach().to(compute))
        return mod

    @classmethod
    def from_checkpoint(cls, weight, bias: Optional[torch.Tensor] = None, activations: str = "bf16",
                        compute_dtype: torch.dtype = torch.bfloat16) -> "FP4Linear":
        """An NVFP4 FP4Linear from a loaded checkpoint weight (torch_fp4.checkpoint.NVFP4Weight).
        Its input global scale, when the checkpoint has one, becomes the fixed W4A4 scale."""
        n, half_k = weight.data.shape
        mod = cls(2 * half_k, n, bias is not None, F.NVFP4, activations, compute_dtype,
                  weight.data.device)
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
        self.weight.copy_(data.view(torch.uint8))
        self.weight_scale.copy_(scale.view(torch.uint8))

    def set_quantized(self, data: torch.Tensor, scale: torch.Tensor,
                      global_scale: Optional[torch.Tensor] = None,
                      input_global_scale: Optional[torch.Tensor] = None) -> None:
        """Load already-quantized weights: data [N, K/2], 128x4 scales [Np, Kp], encode global
        scale [1] (NVFP4), and optionally a fixed activation global scale for W4A4."""
        for name, t, buf in (("data", data, self.weight), ("scale", scale, self.weight_scale)):
            if tuple(t.shape) != tuple(buf.shape) or t.element_size() != 1:
                raise ValueError(f"FP4Linear.set_quantized: {name}: expected a 1-byte tensor of "
                                 f"shape {tuple(buf.shape)}, got {t.dtype} {tuple(t.shape)}")
            buf.copy_(t.view(torch.uint8))
        for name, t, buf in (("global_scale", global_scale, self.weight_global_scale_bits),
                             ("input_global_scale", input_global_scale, self.input_global_scale_bits)):
            if t is None:
                continue
            if t.dtype != torch.float32 or t.numel() != 1:
                raise ValueError(f"FP4Linear.set_quantized: {name}: expected a one-element fp32 "
                                 f"tensor, got {t.dtype} {tuple(t.shape)}")
            buf.copy_(_bits(t))
        self.static_input_scale = input_global_scale is not None

    # -- views used by forward -----------------------------------------------------------------
    @property
    def weight_global_scale(self) -> torch.Tensor:
        return self.weight_global_scale_bits.view(torch.float32)

    @property
    def input_global_scale(self) -> torch.Tensor:
        return self.input_global_scale_bits.view(torch.float32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"FP4Linear: x: expected last dimension {self.in_features}, "
                             f"got shape {tuple(x.shape)}")
        lead = x.shape[:-1]
        out_dtype = x.dtype if x.dtype in OUT_DTYPES else self.compute_dtype
        a = x.reshape(-1, self.in_features).to(self.compute_dtype).contiguous()
        nv = self.fmt is F.NVFP4
        if self.activations == "bf16":
            alpha = F.nvfp4_alpha(None, self.weight_global_scale) if nv else None
            y = ops.mm_fp4(a, self.weight.T, None, self.weight_scale.T, alpha, out_dtype,
                           self.fmt.block_size)
        elif nv:
            gs_a = self.input_global_scale if self.static_input_scale else ops.compute_global_scale(a)
            aq, as_ = ops.nvfp4_quantize(a, gs_a)
            y = ops.mm_fp4(aq, self.weight.T, as_, self.weight_scale.T,
                           F.nvfp4_alpha(gs_a, self.weight_global_scale), out_dtype)
        else:
            aq, as_ = ops.mxfp4_quantize(a)
            y = ops.mm_fp4(aq, self.weight.T, as_, self.weight_scale.T, None, out_dtype, 32)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        mode = "W4A16" if self.activations == "bf16" else "W4A4"
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, format={self.fmt.name}, {mode}, "
                f"compute_dtype={self.compute_dtype}")


def _format(fmt: Union[str, F.Fp4Format]) -> F.Fp4Format:
    if isinstance(fmt, F.Fp4Format):
        return fmt
    for f in F.FORMATS:
        if f.name == fmt:
            return f
    raise ValueError(f"fmt: expected 'nvfp4' or 'mxfp4', got {fmt!r}")


Filter = Union[None, str, Callable[[str, torch.nn.Module], bool]]


@dataclass(frozen=True)
class QuantConfig:
    """What quantize_model does.

    fmt: "nvfp4" or "mxfp4"; activations: "bf16" (W4A16) or "fp4" (W4A4);
    include: None (every nn.Linear), a glob on the module's qualified name ("*.mlp.*"), or a
    predicate (name, module) -> bool; exclude: the same form, applied after include.
    """
    fmt: str = "nvfp4"
    activations: str = "bf16"
    include: Filter = None
    exclude: Filter = None


def _matches(flt: Filter, name: str, module: torch.nn.Module, default: bool) -> bool:
    if flt is None:
        return default
    if isinstance(flt, str):
        return fnmatch.fnmatchcase(name, flt)
    return bool(flt(name, module))


def quantize_model(model: torch.nn.Module, config: QuantConfig = QuantConfig()) -> torch.nn.Module:
    """Replace the nn.Linear modules of `model` selected by `config` with FP4Linear, in place.

    Layers whose in_features is not a multiple of the block size stay dense, and a warning
    names each of them. Returns the model.
    """
    fmt = _format(config.fmt)
    skipped = []
    targets = [(name, mod) for name, mod in model.named_modules()
               if isinstance(mod, torch.nn.Linear) and not isinstance(mod, FP4Linear)
               and _matches(config.include, name, mod, True)
               and not _matches(config.exclude, name, mod, False)]
    for name, linear in targets:
        if linear.in_features % fmt.block_size:
            skipped.append(f"{name} (in_features={linear.in_features})")
            continue
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, FP4Linear.from_linear(linear, fmt, config.activations))
    if skipped:
        warnings.warn(f"quantize_model: kept {len(skipped)} layer(s) dense because in_features is "
                      f"not a multiple of {fmt.block_size}: " + ", ".join(skipped), stacklevel=2)
    return model
