"""What the drop-in modules share: input checks, the compute dtypes, and the names of formats and
activation modes."""
from __future__ import annotations

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
