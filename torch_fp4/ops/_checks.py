"""Input validation shared by the real and fake implementations. Every error names the op, the
argument, what was expected and what was given."""
from __future__ import annotations

from typing import Iterable, Optional

import torch

from .. import formats as F

FLOAT_INPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn)
HALF_DTYPES = (torch.bfloat16, torch.float16)
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _dtype_names(dtypes: Iterable[torch.dtype]) -> str:
    names = [str(d).replace("torch.", "") for d in dtypes]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def fail(op: str, arg: str, expected: str, got, exc=ValueError):
    raise exc(f"{op}: {arg}: expected {expected}, got {got}")


def tensor(op: str, name: str, t) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        fail(op, name, "a torch.Tensor", type(t).__name__, TypeError)
    return t


def tensors(op: str, **named) -> None:
    """Each named argument is a tensor (checked before the op's schema would reject it)."""
    for name, t in named.items():
        tensor(op, name, t)


def integer(op: str, name: str, value, what: str = "an int") -> int:
    """An int argument (a Python int, or a SymInt while tracing; not a bool, float or tensor)."""
    if value.__class__ is bool or not isinstance(value, (int, torch.SymInt)):
        fail(op, name, what, repr(value), TypeError)
    return value


def block_size(op: str, value):
    """The format of a block_size argument: 16 (NVFP4) or 32 (MXFP4)."""
    integer(op, "block_size", value, "16 (NVFP4) or 32 (MXFP4)")
    if value not in (16, 32):
        fail(op, "block_size", "16 (NVFP4) or 32 (MXFP4)", repr(value))
    return F.format_for_block_size(value)


def positive_finite_scales(op: str, name: str, t: torch.Tensor) -> None:
    """Encode global scales whose every value and reciprocal are positive and finite (reads them
    on the host: for load-time setters, not per-call paths)."""
    v = t.detach().float().reshape(-1).cpu()
    r = torch.reciprocal(v)
    bad = ~((v > 0) & (r > 0) & torch.isfinite(v) & torch.isfinite(r))
    if bool(bad.any()):
        fail(op, name, "positive finite global scales with finite reciprocals",
             repr(float(v[bad][0])))


def boolean(op: str, name: str, value) -> bool:
    if not isinstance(value, (bool, torch.SymBool)):
        fail(op, name, "a bool", repr(value), TypeError)
    return value


def real(op: str, name: str, value) -> float:
    """A real number argument (an int or float, or their symbolic forms while tracing; not a bool
    or a tensor)."""
    if value.__class__ is bool or not isinstance(value, (int, float, torch.SymInt, torch.SymFloat)):
        fail(op, name, "a float", repr(value), TypeError)
    return value


def dtype(op: str, name: str, t: torch.Tensor, allowed: Iterable[torch.dtype]) -> None:
    allowed = tuple(allowed)
    tensor(op, name, t)
    if t.dtype not in allowed:
        fail(op, name, f"dtype {_dtype_names(allowed)}", t.dtype, TypeError)


def dtype_arg(op: str, name: str, value, allowed: Iterable[torch.dtype]) -> None:
    """A dtype passed as an argument (e.g. out_dtype)."""
    allowed = tuple(allowed)
    if value not in allowed:
        fail(op, name, _dtype_names(allowed), value, TypeError)


def ndim(op: str, name: str, t: torch.Tensor, allowed: Iterable[int], what: str) -> None:
    if t.dim() not in tuple(allowed):
        fail(op, name, what, f"shape {tuple(t.shape)}")


def shape(op: str, name: str, t: torch.Tensor, expected: tuple, what: str = "") -> None:
    if tuple(t.shape) != tuple(expected):
        fail(op, name, f"shape {tuple(expected)}{' ' + what if what else ''}", f"shape {tuple(t.shape)}")


def contiguous(op: str, name: str, t: torch.Tensor) -> None:
    if not t.is_contiguous():
        fail(op, name, "a contiguous tensor", f"strides {t.stride()} for shape {tuple(t.shape)}")


def transposed_row_major(op: str, name: str, t: torch.Tensor, what: str) -> None:
    if not t.T.is_contiguous():
        fail(op, name, f"the transpose of a contiguous {what} (pass w.T)",
             f"strides {t.stride()} for shape {tuple(t.shape)}")


def multiple_of(op: str, name: str, value: int, block: int, what: str) -> None:
    if value <= 0 or value % block:
        fail(op, name, f"{what} to be a positive multiple of {block}", value)


def same_device(op: str, **tensors: Optional[torch.Tensor]) -> None:
    present = [(n, t) for n, t in tensors.items() if t is not None]
    first_name, first = present[0]
    for n, t in present[1:]:
        if t.device != first.device:
            fail(op, n, f"a tensor on {first.device} (the device of {first_name})", t.device)


def global_scale(op: str, name: str, gs: torch.Tensor, batch: Optional[int]) -> None:
    """A device fp32 global scale of shape [1], or [batch] when a per-batch scale is allowed."""
    dtype(op, name, gs, (torch.float32,))
    ok = gs.dim() <= 1 and (gs.numel() == 1 or (batch is not None and gs.numel() == batch))
    if not ok:
        expected = "shape [1]" + (f" or [{batch}] (one per leading entry)" if batch else "")
        fail(op, name, expected, f"shape {tuple(gs.shape)}")
