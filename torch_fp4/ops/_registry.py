"""Backend implementations per op, their requirement functions, and the inference-only rule."""
from __future__ import annotations

import functools
import importlib
import inspect
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Optional

import torch
from torch import _C

from .. import tactics
from ..backends import Backend
from ..problems import Problem
from ..tuning import auto_order
from ._checks import fail

# A requirement function gets the op's problem (torch_fp4.problems) and returns None when the
# backend can run it, or a short reason when it cannot. It states the backend's problem-level
# limits once; tactic spaces check only what is particular to a tactic.
Requirement = Callable[[Problem], Optional[str]]


@dataclass(frozen=True)
class Impl:
    fn: Callable
    requirement: Requirement


_IMPLS: dict[str, dict[Backend, Impl]] = {}
_BROKEN: dict[Backend, str] = {}
# op -> (its public function, its validation: (*public arguments) -> (problem, backend))
_PROBLEMS: dict[str, tuple[Callable, Callable]] = {}


def _always(p: Problem) -> None:
    return None


def register_impl(op: str, backend: Backend, fn: Callable, requirement: Requirement = _always) -> None:
    _IMPLS.setdefault(op, {})[backend] = Impl(fn, requirement)


def register_problem(op: str, public: Callable, validate: Callable) -> None:
    """How supported_backends / unsupported_reason read `op`'s public arguments: bound to the
    public function's signature (its defaults), then validated into the problem. The validation
    takes the public parameters in the same order (the schema's), and accepts their public
    forms (enums or names)."""
    names, checked = list(inspect.signature(public).parameters), list(inspect.signature(validate).parameters)
    if names != checked:
        raise TypeError(f"{op}: the validation's parameters {checked} are not the public ones {names}")
    _PROBLEMS[op] = (public, validate)


def _lazy(module: str, name: str) -> Callable:
    """A function that imports `module` on first call (keeps GPU toolchains out of import time)."""
    @functools.cache
    def target() -> Callable:
        return getattr(importlib.import_module(module), name)

    def call(*args, **kwargs):
        return target()(*args, **kwargs)
    call.__name__ = name
    call.target = target   # run() keeps the imported function itself in its plans
    return call


def register_backend_package(backend: Backend, package: str) -> None:
    """Register the ops a kernel package offers. The package's __init__ (cheap to import) holds
    OPS = {op: "module:function"} and requirement(op, problem) -> None or a reason."""
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


def problem_of(op: str, *args, **kwargs) -> Problem:
    """The problem of `op` for `args`: one problem object (returned as it is), or the op's public
    arguments as torch_fp4.<op> takes them (validated; bad input raises as the op would)."""
    first = next(iter(args), None)
    if isinstance(first, Problem) and len(args) == 1 and not kwargs:
        return first
    if op not in _PROBLEMS:
        fail(op, "op", "one of " + ", ".join(map(repr, _PROBLEMS)), repr(op))
    public, validate = _PROBLEMS[op]
    bound = inspect.signature(public).bind(*args, **kwargs)
    bound.apply_defaults()
    return validate(*bound.arguments.values())[0]


def requirement_reason(op: str, backend: Backend, p: Problem) -> Optional[str]:
    """None when `backend` can run `op` on problem `p`, else why not."""
    impl = _IMPLS.get(op, {}).get(backend)
    if impl is None:
        if backend in _BROKEN:
            return _BROKEN[backend]
        have = ", ".join(b.label for b in _IMPLS.get(op, {}))
        return f"no {backend.label} implementation of {op} is installed (available: {have})"
    return impl.requirement(p)


def unsupported_reason(op: str, backend: Backend | str, *args, **kwargs) -> Optional[str]:
    """None when `backend` can run `op` on this problem, else why not. The problem: a problem
    object (torch_fp4.problems) or the op's public arguments (see problem_of)."""
    return requirement_reason(op, Backend.parse(backend), problem_of(op, *args, **kwargs))


def supported_backends(op: str, *args, **kwargs) -> list[Backend]:
    """Backends that can run `op` on this problem, in the order "auto" tries them. The problem:
    a problem object (torch_fp4.problems) or the op's public arguments, e.g.
    supported_backends("mm_fp4", a, w.T, a_scale, w_scale.T, block_size=32)."""
    p = problem_of(op, *args, **kwargs)
    return [b for b in auto_order(op, p) if requirement_reason(op, b, p) is None]


def tactics_for(op: str, p: Problem, backend: Backend) -> list:
    """The tactics of `op` that can run problem p: `backend`'s, or every supported backend's for
    AUTO (in the order auto tries them), each space's heuristic default first."""
    out = []
    for b in supported_backends(op, p) if backend is Backend.AUTO else [backend]:
        sp = tactics.space(op, b)
        if sp is not None:
            out += sp.candidates(p)
    return out


def resolve_backend(op: str, backend: Backend, p: Problem) -> Backend:
    """`backend`, checked, or for AUTO the first supported backend in the measured preference
    order of torch_fp4.tuning."""
    if backend is Backend.AUTO:
        for b in auto_order(op, p):
            if requirement_reason(op, b, p) is None:
                return b
        raise RuntimeError(f"{op}: no backend supports these inputs")
    reason = requirement_reason(op, backend, p)
    if reason is not None:
        raise ValueError(f"{op}: backend: {backend.label!r} cannot run here: {reason}")
    return backend


def clear_decisions() -> None:
    """Forget every cached plan (tests that patch requirement tables call this)."""
    _PLANS.clear()


def decide(op: str, backend: Backend, p: Problem, args: tuple = ()) -> tuple[Backend, Optional[tactics.Tactic]]:
    """The backend (AUTO resolved, see resolve_backend) and the tactic (None for a backend
    without a tactic space for `op`) that run `op` on problem `p`; a forced tactic also picks the
    backend. `args`: the launcher arguments, timed while autotuning."""
    forced = tactics.forced()
    if backend is Backend.AUTO and forced is not None:
        backend = forced.backend
    b = resolve_backend(op, backend, p)
    t = None
    if tactics.space(op, b) is not None:
        t = tactics.choose(op, b, p, functools.partial(_IMPLS[op][b].fn, problem=p), args)
    return b, t


class Plan(NamedTuple):
    """What run() keeps per problem: the problem object, the tactic and the function."""
    problem: Problem
    tactic: Optional[tactics.Tactic]
    fn: Callable
    generation: int     # tactics.generation() when decided (a changed tactic cache expires it)


_PLANS: dict[tuple, Plan] = {}
_MAX_PLANS = 4096
_Tensor = torch.Tensor


def _tensor_or_value(a: Any) -> tuple:
    """One argument's part of _problem_key: a tensor's dtype, shape, strides, device and 16-byte
    alignment (_TENSOR_FIELDS), anything else itself with its type."""
    if isinstance(a, _Tensor):
        return (a.dtype, a.shape, a.stride(), a.device, a.data_ptr() & 15)
    return (a.__class__, a)


# _tensor_or_value's fields of a tensor `{a}`, as key_function writes them in line
_TENSOR_FIELDS = ("{a}.dtype", "{a}.shape", "{a}.stride()", "{a}.device", "{a}.data_ptr() & 15")


def _problem_key(validate: Callable, args: tuple) -> tuple:
    """What validation, requirements and tactics may look at: each tensor's metadata (never its
    values), any other argument itself with its type (so 2.0 or True never reuses the plan of 2
    or 1: validation sees every type). run() uses each op's key_function form of it."""
    return (validate, *map(_tensor_or_value, args))


def key_function(schema: torch.FunctionSchema) -> Callable[[Callable, tuple], tuple]:
    """_problem_key specialized to an op's schema, for run(): it tells calls apart exactly as
    _problem_key does (tests/test_dispatch.py compares the two) in about two thirds of its host
    time: a Tensor argument's five fields read in line, an optional tensor's through
    _tensor_or_value (None in line), any other argument with its type. Arguments of another kind
    than the schema says (a non-tensor for a Tensor: AttributeError; another count: ValueError)
    get no key, so run() validates them, which raises; a tensor where the schema has no tensor
    fails validation, so no plan is ever kept under such a key."""
    names, parts = [], []
    for i, arg in enumerate(schema.arguments):
        a = f"a{i}"
        names.append(a)
        if isinstance(arg.type, torch.TensorType):
            parts += [f.format(a=a) for f in _TENSOR_FIELDS]
        elif isinstance(arg.type, torch.OptionalType) and isinstance(arg.type.getElementType(), torch.TensorType):
            parts.append(f"_NONE if {a} is None else _tensor_or_value({a})")
        else:
            parts += [f"{a}.__class__", a]
    src = (f"def key(validate, args):\n    {', '.join(names)}, = args\n"
           f"    return (validate, {', '.join(parts)})\n")
    scope: dict = {"_tensor_or_value": _tensor_or_value, "_NONE": (type(None), None)}
    exec(compile(src, f"<torch_fp4 key of {schema.name}>", "exec"), scope)
    return scope["key"]


_KEYS: dict[str, Callable[[Callable, tuple], tuple]] = {}   # op -> its key_function (define())


def _launch(plan: Plan, launch: tuple) -> Any:
    if plan.tactic is None:
        return plan.fn(*launch)
    return plan.fn(*launch, tactic=plan.tactic, problem=plan.problem)


def run(op: str, validate: Callable, args: tuple, build: Callable[[Problem], tuple]) -> Any:
    """The one way every public op reaches a kernel. validate(*args) checks the op's arguments
    (raising on bad input) and returns (problem, requested backend): the problem object
    (torch_fp4.problems) is built here, once. build(problem) gives the launcher arguments (the
    tensors, and parsed enums the problem holds). Then decide() picks the backend and tactic from
    the problem, and the backend's implementation runs on the launcher arguments (a backend with
    a tactic space gets the tactic and the problem too).

    The plan (problem, tactic, implementation) is cached per problem (_problem_key, in the op's
    key_function form, and the tactic cache's generation), so a repeated call is one key and one
    dict lookup: nothing is validated or built again. An input that fails raises every time
    (failures are not cached); inside `use_tactic` or `autotune` everything is done afresh. Fake
    implementations validate on their own, uncached."""
    key = None
    if tactics.forced() is None and not tactics.tuning():
        try:
            key = _KEYS.get(op, _problem_key)(validate, args)
            plan = _PLANS.get(key)
        except (TypeError, AttributeError, ValueError):   # unhashable, or not of the schema's kinds
            key, plan = None, None
        if plan is not None and plan.generation == tactics.generation():
            return _launch(plan, build(plan.problem))
    p, backend = validate(*args)
    launch = build(p)
    b, t = decide(op, backend, p, launch)
    fn = _IMPLS[op][b].fn
    fn = getattr(fn, "target", lambda: fn)()   # a lazily imported backend's function itself
    # The generation after deciding: a first lookup that loaded the tactic cache counts.
    plan = Plan(p, t, fn, tactics.generation())
    if key is not None:
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        _PLANS[key] = plan
    return _launch(plan, launch)


_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)


def eager(*tensors: Optional[torch.Tensor]) -> bool:
    """Whether a public function may call its op's implementation directly, skipping PyTorch's
    dispatcher (its custom-op path costs more host time than the whole implementation on a
    repeated call): true only in plain eager mode, where the dispatcher would call that same
    function. Not while torch.compile traces (Dynamo records the op), under a dispatch or
    torch-function mode (FakeTensorMode, FlopCounterMode, `with torch.device(...)`), inside
    functorch transforms or torch.jit.trace, while the autograd profiler records (it names the
    op), for tensor subclasses or a meta first tensor, or when autograd could record the call
    (grad enabled and an input requires grad: the op's backward refuses with INFERENCE_ONLY)."""
    if torch.compiler.is_compiling():
        return False
    if (_C._len_torch_dispatch_stack() or _C._is_torch_function_mode_enabled()
            or _C._autograd._profiler_enabled() or _C._get_tracing_state() is not None
            or _C._functorch.peek_interpreter_stack() is not None):
        return False
    grad = torch.is_grad_enabled()
    first = True
    for t in tensors:
        if t is None:
            continue
        if t.__class__ not in _PLAIN_TENSORS or (grad and t.requires_grad):
            return False
        # meta: the first tensor decides (a meta tensor among non-meta ones fails the op's
        # same-device check on either path, with the same message)
        if first:
            if t.is_meta:
                return False
            first = False
    return True


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
    _KEYS[name] = key_function(op._opoverload._schema)
    return op
