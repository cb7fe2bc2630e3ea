"""Tactics: how a kernel is launched for one problem, chosen by a heuristic or by the autotuner.

A tactic is a frozen dataclass subclassing `Tactic` (a kernel family's tile sizes, stages,
split-k, cluster shape, scheduler). A kernel package registers a `TacticSpace` per (op, backend):
the valid tactics for a problem, the heuristic default, and the cache key of the problem.

Choosing a tactic for a call (`choose`):
1. inside `use_tactic(t)`: t, or an error saying why t cannot run the problem;
2. inside `autotune()` and not capturing a CUDA graph: every valid tactic is timed (CUDA events,
   rotating copies of the inputs so the L2 cache does not flatter) and the fastest is stored in
   memory and in the JSON cache `$TORCH_FP4_CACHE_DIR/tactics.json` (default
   ~/.cache/torch_fp4), keyed by device name, op, shape bucket, dtypes and layout;
3. otherwise a dict read of that cache (loaded from disk once per process), else the heuristic.
Every tactic returned has passed the space's `why_not`, so launchers trust the tactic they get.
Nothing is timed or compiled during capture: capture uses the cached tactic or the heuristic,
and a warm-up call before capture compiles it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ClassVar, Iterator, Optional, Sequence

import torch

from .backends import Backend
from .problems import Problem


@dataclass(frozen=True)
class Tactic:
    """Base of every kernel family's tactic dataclass. Subclasses set `backend` and `family`."""
    backend: ClassVar[Backend]
    family: ClassVar[str]

    def label(self) -> str:
        fields = ",".join(f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self))
        return f"{self.family}({fields})"

    def to_json(self) -> dict:
        return {"family": self.family, **dataclasses.asdict(self)}


_FAMILIES: dict[str, type[Tactic]] = {}


def register_family(cls: type[Tactic]) -> type[Tactic]:
    """Class decorator: makes the family's tactics loadable from the JSON cache."""
    _FAMILIES[cls.family] = cls
    return cls


def tactic_from_json(d: dict) -> Optional[Tactic]:
    cls = _FAMILIES.get(d.get("family", ""))
    if cls is None:
        return None
    kw = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items() if k != "family"}
    try:
        return cls(**kw)
    except TypeError:  # written by another version of the family
        return None


@dataclass(frozen=True)
class TacticSpace:
    """What a kernel package tells the tuner about one op. Each function gets the op's problem
    object (torch_fp4.problems), whose problem-level limits the backend's requirement has
    already checked: why_not checks what is particular to the tactic."""
    candidates: Callable[[Problem], list]                   # valid tactics for the problem
    default: Callable[[Problem], Tactic]                    # the heuristic choice
    key: Callable[[Problem], str]                           # shape bucket, dtypes and layout
    why_not: Callable[[Tactic, Problem], Optional[str]]     # None, or why the tactic cannot run


_SPACES: dict[tuple[str, Backend], TacticSpace] = {}


def valid_unique(ts: Sequence[Tactic], why_not: Callable[..., Optional[str]], p: Problem) -> list[Tactic]:
    """`ts` without repeats and without the tactics `why_not` rejects for problem `p`, in order."""
    seen, unique = set(), []
    for t in ts:
        if t not in seen and why_not(t, p) is None:
            seen.add(t)
            unique.append(t)
    return unique


def register_space(op: str, backend: Backend, space: TacticSpace) -> None:
    _SPACES[(op, backend)] = space


def space(op: str, backend: Backend) -> Optional[TacticSpace]:
    return _SPACES.get((op, backend))


class _State(threading.local):
    forced: Optional[Tactic] = None
    tuning: bool = False


_STATE = _State()
_MEMORY: dict[str, dict] = {}   # full key -> tactic json
_LOADED = False
_LOCK = threading.Lock()
_GENERATION = 0                 # bumped whenever _MEMORY changes (cached dispatch decisions expire)


def generation() -> int:
    """A number that changes whenever the tactic cache's contents may have changed."""
    return _GENERATION


def tuning() -> bool:
    """Whether an enclosing `autotune()` is on."""
    return _STATE.tuning


def cache_dir() -> Path:
    """torch_fp4's cache folder: $TORCH_FP4_CACHE_DIR, default ~/.cache/torch_fp4."""
    return Path(os.environ.get("TORCH_FP4_CACHE_DIR") or os.path.join(Path.home(), ".cache", "torch_fp4"))


def cache_path() -> Path:
    return cache_dir() / "tactics.json"


def _load() -> None:
    global _LOADED, _GENERATION
    with _LOCK:
        if _LOADED:
            return
        _LOADED = True
        _GENERATION += 1
        try:
            data = json.loads(cache_path().read_text())
        except (OSError, ValueError):
            return
        if isinstance(data, dict):
            _MEMORY.update({k: v for k, v in data.items() if isinstance(v, dict)})


def _save() -> None:
    path = cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(_MEMORY, indent=1, sort_keys=True))
    os.replace(tmp, path)


def full_key(op: str, backend: Backend, problem_key: str, device: torch.device) -> str:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    return f"{name}|{op}|{backend.label}|{problem_key}"


def forced() -> Optional[Tactic]:
    """The tactic set by an enclosing use_tactic, if any."""
    return _STATE.forced


@contextlib.contextmanager
def use_tactic(tactic: Tactic) -> Iterator[None]:
    """Run ops inside the block with `tactic` (benchmarks and tests); an op whose problem the
    tactic cannot run raises an error saying why."""
    prev, _STATE.forced = _STATE.forced, tactic
    try:
        yield
    finally:
        _STATE.forced = prev


@contextlib.contextmanager
def autotune(enabled: bool = True) -> Iterator[None]:
    """Inside the block, the first call of a tunable op on each new problem times every valid
    tactic and keeps the fastest (in memory and in the JSON cache). Not during graph capture."""
    prev, _STATE.tuning = _STATE.tuning, enabled
    try:
        yield
    finally:
        _STATE.tuning = prev


def choose(op: str, backend: Backend, p: Problem, launch: Callable[..., object], args: tuple = ()) -> Tactic:
    """The tactic for `op` on `backend` for problem `p`. `launch(*args, tactic=t)` runs the op
    on its launcher arguments `args` with tactic t (used only while autotuning)."""
    sp = _SPACES[(op, backend)]
    forced = _STATE.forced
    if forced is not None:
        if forced.backend != backend:
            raise ValueError(f"{op}: tactic {forced.label()} is for backend {forced.backend.label!r}, "
                             f"the call runs backend {backend.label!r}")
        reason = sp.why_not(forced, p)
        if reason is not None:
            raise ValueError(f"{op}: tactic {forced.label()} cannot run this problem: {reason}")
        return forced
    _load()
    key = full_key(op, backend, sp.key(p), p.device)
    hit = _MEMORY.get(key)
    if hit is not None:
        t = tactic_from_json(hit)
        if t is not None and sp.why_not(t, p) is None:
            return t
    if _STATE.tuning and not torch.cuda.is_current_stream_capturing():
        from .bench.tune import fastest
        best = fastest(f"{op} {sp.key(p)}", sp.candidates(p), launch, args)
        global _GENERATION
        with _LOCK:
            _MEMORY[key] = best.to_json()
            _GENERATION += 1
            _save()
        return best
    t = sp.default(p)
    reason = sp.why_not(t, p)
    if reason is not None:
        raise ValueError(f"{op}: the {backend.label} heuristic's tactic {t.label()} cannot run this "
                         f"problem: {reason}")
    return t


def forget() -> None:
    """Drop the in-memory cache (the file is re-read on the next lookup)."""
    global _LOADED, _GENERATION
    with _LOCK:
        _MEMORY.clear()
        _LOADED = False
        _GENERATION += 1
