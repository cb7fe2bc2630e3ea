"""What the drop-in modules share: input checks, the compute dtypes, and the names of formats and
activation modes."""
from __future__ import annotations

import functools
from typing import Union

import torch

from .. import formats as F
from ..ops import _checks as C

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


def keep_state_row_major(module: torch.nn.Module, names: tuple[str, ...]) -> None:
    """Register state_dict hooks on a module that keeps the FP4 weight buffers `names` in
    `module.weight_layout`: its state_dict holds their row-major bytes, and loading converts
    row-major bytes into the module's layout (a tensor of another shape is left for
    load_state_dict to report)."""
    module.register_state_dict_post_hook(functools.partial(_weights_to_row, names=names))
    module.register_load_state_dict_pre_hook(functools.partial(_weights_from_row, names=names))


def _weights_to_row(module, state_dict: dict, prefix: str, local_metadata, *, names) -> None:
    if module.weight_layout == "row":
        return
    for name in names:
        if prefix + name in state_dict:
            state_dict[prefix + name] = F.from_weight_layout(state_dict[prefix + name], module.weight_layout)


def _weights_from_row(module, state_dict: dict, prefix: str, local_metadata, strict, missing_keys,
                      unexpected_keys, error_msgs, *, names) -> None:
    if module.weight_layout == "row":
        return
    for name in names:
        t = state_dict.get(prefix + name)
        if (isinstance(t, torch.Tensor) and t.element_size() == 1
                and tuple(t.shape) == tuple(getattr(module, name).shape)):
            state_dict[prefix + name] = F.to_weight_layout(t.contiguous(), module.weight_layout)
