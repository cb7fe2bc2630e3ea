"""Backend implementations per op, their requirement functions, and the inference-only rule."""
from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from .. import tactics
from ..backends import Backend
from ..tuning import auto_order

# A requirement function gets the op's arguments and returns None when the backend can run them,
# or a short reason when it cannot.
Requirement = Callable[..., Optional[str]]


@dataclass(frozen=True)
class Impl:
    fn: Callable
    requirement: Requirement


_IMPLS: dict[str, dict[Backend, Impl]] = {}
_BROKEN: dict[Backend, str] = {}



def _always(*args, **kwargs) -> None:
    return None


def register_impl(op: str, backend: Backend, fn: Callable, requirement: Requirement = _always) -> None:
    _IMPLS.setdefault(op, {})[backend] = Impl(fn, requirement)


def _lazy(module: str, name: str) -> Callable:
    """A function that imports `module` on first call (keeps GPU toolchains out of import time)."""
    @functools.cache
    def target() -> Callable:
        return getattr(importlib.import_module(module), name)

    def call(*args, **kwargs):
        return target()(*args, **kwargs)
    call.__name__ = name
    return call


def register_backend_package(backend: Backend, package: str) -> None:
    """Register the ops a kernel package offers. The package's __init__ (cheap to import) holds
    OPS = {op: "module:function"} and requirement(op, *args) -> None or a reason."""
    try:
        mod = importlib.import_module(package)
    except Exception as exc:  # a broken optional backend must not break `import torch_fp4`
        _BROKEN[backend] = f"{package} failed to import: {exc!r}"
        return
    for op, target in mod.OPS.items():
        module, name = target.split(":")
        register_impl(op, backend, _lazy(f"{package}.{module}", name),
                      functools.partial(mod.requirement, op))
    # Tactic spaces live in modules that are cheap to import (no GPU toolchain at import time).
    for op, target in getattr(mod, "TACTIC_SPACES", {}).items():
        module, name = target.split(":")
        try:
            sp = getattr(importlib.import_module(f"{package}.{module}"), name)
        except Exception as exc:
            _BROKEN[backend] = f"{package}.{module} failed to import: {exc!r}"
            continue
        tactics.register_space(op, backend, sp)


def unsupported_reason(op: str, backend: Backend, *args) -> Optional[str]:
    """None when `backend` can run `op` on these arguments, else why not."""
    impl = _IMPLS.get(op, {}).get(backend)
    if impl is None:
        if backend in _BROKEN:
            return _BROKEN[backend]
        have = ", ".join(b.label for b in _IMPLS.get(op, {}))
        return f"no {backend.label} implementation of {op} is installed (available: {have})"
    return impl.requirement(*args)


def supported_backends(op: str, *args) -> list[Backend]:
    """Backends that can run `op` on these arguments, in the order "auto" tries them."""
    return [b for b in auto_order(op, args) if unsupported_reason(op, b, *args) is None]


def resolve_backend(op: str, backend: Backend, *args) -> Backend:
    """`backend`, checked, or for AUTO the first supported backend in the measured preference
    order of torch_fp4.tuning."""
    if backend is Backend.AUTO:
        for b in auto_order(op, args):
            if unsupported_reason(op, b, *args) is None:
                return b
        raise RuntimeError(f"{op}: no backend supports these inputs")
    reason = unsupported_reason(op, backend, *args)
    if reason is not None:
        raise ValueError(f"{op}: backend: {backend.label!r} cannot run here: {reason}")
    return backend


def _arg_key(a):
    """What the requirement functions and tactic spaces may look at in one launcher argument:
    a tensor's dtype, device, shape, strides and 16-byte alignment; any other argument itself."""
    if isinstance(a, torch.Tensor):
        return (a.dtype, a.device, tuple(a.shape), a.stride(), a.data_ptr() % 16)
    return a


_DECISIONS: dict[tuple, tuple[Backend, Optional[tactics.Tactic]]] = {}
_MAX_DECISIONS = 4096


def clear_decisions() -> None:
    """Forget every cached dispatch decision and validation (tests that patch requirement tables
    call this)."""
    _DECISIONS.clear()
    _VALIDATED.clear()


def _meta_key(a):
    """What an op's validation may look at in one argument: a tensor's dtype, device, shape and
    strides (never its values or address); any other argument itself."""
    if isinstance(a, torch.Tensor):
        return (a.dtype, a.device, tuple(a.shape), a.stride())
    return a


_VALIDATED: dict[tuple, object] = {}


def validated(validate: Callable, *args):
    """validate(*args), run once per problem: its result is cached under the `_meta_key` of every
    argument, so a repeated call with tensors of the same dtypes, devices, shapes and strides is
    one dict lookup. An input that fails raises every time (failures are not cached). For the
    real implementations only: fake implementations validate afresh."""
    try:
        key = (validate, *map(_meta_key, args))
        hit = _VALIDATED.get(key)
    except TypeError:  # an unhashable argument: validate without the cache
        key, hit = None, None
    if hit is not None:
        return hit
    result = validate(*args)
    if key is not None:
        if len(_VALIDATED) >= _MAX_DECISIONS:
            _VALIDATED.clear()
        _VALIDATED[key] = result
    return result


def decide(op: str, backend: Backend, args: tuple) -> tuple[Backend, Optional[tactics.Tactic]]:
    """The backend (AUTO resolved, see resolve_backend) and the tactic (None for a backend
    without a tactic space for `op`) that run `op` on the launcher arguments `args`. The decision
    is cached per problem (`_arg_key` of every argument and the tactic cache's generation), so a
    repeated call is one dict lookup; inside `use_tactic` or `autotune` it is made afresh."""
    forced = tactics.forced()
    problem = None
    if forced is None and not tactics.tuning():
        try:
            problem = (op, backend, *map(_arg_key, args))
            hit = _DECISIONS.get((tactics.generation(), problem))
        except TypeError:  # an unhashable argument: decide without the cache
            problem, hit = None, None
        if hit is not None:
            return hit
    if backend is Backend.AUTO and forced is not None:
        backend = forced.backend
    b = resolve_backend(op, backend, *args)
    t = None
    if tactics.space(op, b) is not None:
        t = tactics.choose(op, b, args, _IMPLS[op][b].fn)
    if problem is not None:
        if len(_DECISIONS) >= _MAX_DECISIONS:
            _DECISIONS.clear()
        # The generation after choosing: a first lookup that loaded the tactic cache counts.
        _DECISIONS[(tactics.generation(), problem)] = (b, t)
    return b, t


def dispatch(op: str, backend: Backend, *args):
    """Run `op` on the launcher arguments `args` with `backend`: the one way every public op
    reaches a kernel (decide, then the backend's implementation, with its tactic if it has a
    tactic space; a forced tactic also picks the backend)."""
    b, t = decide(op, backend, args)
    fn = _IMPLS[op][b].fn
    return fn(*args) if t is None else fn(*args, tactic=t)


INFERENCE_ONLY = ("torch_fp4 ops are inference-only: {op} has no backward. Run it under "
                  "torch.no_grad()/torch.inference_mode(), or detach its inputs.")


def inference_only(custom_op) -> None:
    """Register an autograd formula that refuses to run backward."""
    name = custom_op._name if hasattr(custom_op, "_name") else str(custom_op)

    def backward(ctx, *grads):
        raise RuntimeError(INFERENCE_ONLY.format(op=name))

    custom_op.register_autograd(backward)


def define(name: str, fn: Callable, fake: Callable) -> "torch.library.CustomOpDef":
    """Declare torch_fp4::<name> with implementation `fn` and fake `fake`; no autograd."""
    op = torch.library.custom_op(f"torch_fp4::{name}", fn, mutates_args=())
    op.register_fake(fake)
    inference_only(op)
    return op
