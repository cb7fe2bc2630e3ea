"""`python -m torch_fp4 precompile [--shapes FILE] [--device cuda] [--autotune]`: build and load,
once, every kernel the current device would run for a set of model shapes, so that a serving
image can bake the result and a new process starts without JIT waits.

What a first call in a fresh process would otherwise wait for, and where it is kept:
- the cuda backend's kernel libraries (torch_fp4/csrc, built by nvcc, all of them in parallel
  here): $TORCH_FP4_CACHE_DIR/cuda (default ~/.cache/torch_fp4/cuda);
- the Triton kernels, one per tactic and dtype: Triton's cache (TRITON_CACHE_DIR, default
  ~/.triton/cache);
- with --autotune, the measured tactic of every problem: torch_fp4's tactic cache
  ($TORCH_FP4_CACHE_DIR/tactics.json).
Each problem runs the public ops the way `FP4Linear` / `FP4MoE` call them: mm_fp4 W4A16 (weights in
the layout `preferred_weight_layout` picks) and W4A4 (compute_global_scale, then mm_fp4 quantizing
the activations: quantize_a), and for MoE shapes route + fused_moe, W4A16 and W4A4, at every batch size
given (different batch sizes pick different kernels). Weights are zeros: only the shapes matter.

Shapes file (JSON): {"linear": [[N, K], ...], "moe": [[experts, hidden, intermediate, top_k], ...],
"batches": [M, ...]}; a missing key keeps the default.
"""
from __future__ import annotations

import contextlib
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch

from . import formats as F
from . import ops, tactics


@dataclass(frozen=True)
class MoeShape:
    experts: int
    hidden: int
    inter: int
    top_k: int


@dataclass(frozen=True)
class Shapes:
    linear: tuple[tuple[int, int], ...]
    moe: tuple[MoeShape, ...]
    batches: tuple[int, ...]


# Llama-3.1-70B's linear layers (qkv, o, gate+up, down), Mixtral-8x7B's and Qwen3-30B-A3B's experts.
DEFAULT = Shapes(linear=((10240, 8192), (8192, 8192), (57344, 8192), (8192, 28672)),
                 moe=(MoeShape(8, 4096, 14336, 2), MoeShape(128, 2048, 768, 8)),
                 batches=(1, 16, 32, 64, 128, 256, 1024))


def _positive_ints(value, where: str, count: Optional[int]) -> tuple[int, ...]:
    ok = isinstance(value, (list, tuple)) and all(isinstance(v, int) and v > 0 for v in value)
    if not ok or (count is not None and len(value) != count):
        what = f"{count} positive integers" if count is not None else "a list of positive integers"
        raise ValueError(f"precompile: shapes file: {where}: expected {what}, got {value!r}")
    return tuple(value)


def load_shapes(path: Optional[str]) -> Shapes:
    """The shapes of a JSON file (see the module docstring), or DEFAULT for None."""
    if path is None:
        return DEFAULT
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"precompile: --shapes: cannot read {path!r} as JSON: {exc}") from exc
    if not isinstance(data, dict) or set(data) - {"linear", "moe", "batches"}:
        raise ValueError(f"precompile: shapes file: expected an object with keys 'linear', 'moe' and "
                         f"'batches', got {data!r:.200}")
    linear, moe, batches = DEFAULT.linear, DEFAULT.moe, DEFAULT.batches
    if "linear" in data:
        linear = tuple(_positive_ints(v, f"linear[{i}] (N, K)", 2) for i, v in enumerate(data["linear"]))
        for n, k in linear:
            if k % 32:
                raise ValueError(f"precompile: shapes file: linear (N={n}, K={k}): K must be a multiple of 32")
    if "moe" in data:
        moe = tuple(MoeShape(*_positive_ints(v, f"moe[{i}] (experts, hidden, intermediate, top_k)", 4))
                    for i, v in enumerate(data["moe"]))
    if "batches" in data:
        batches = _positive_ints(data["batches"], "batches", None)
    return Shapes(linear, moe, batches)


def _zero_weight(n: int, k: int, device: torch.device, experts: Optional[int] = None):
    """FP4 weight data [(E,) N, K/2] and 128x4 NVFP4 scales of zeros."""
    rows, cols = F.padded_scale_shape(n, k // 16, F.SfLayout.LAYOUT_128x4)
    lead = () if experts is None else (experts,)
    return (torch.zeros(*lead, n, k // 2, dtype=torch.uint8, device=device),
            torch.zeros(*lead, rows, cols, dtype=torch.uint8, device=device).view(torch.float8_e4m3fn))


def _linear_steps(n: int, k: int, batches, device: torch.device) -> list[tuple[str, Callable[[], object]]]:
    data, scale = _zero_weight(n, k, device)
    layout = ops.preferred_weight_layout(device, n, k)
    w = ops.prepack_weight(data) if layout is F.WeightLayout.SM90 else data
    one = torch.ones(1, device=device)
    steps = []
    for m in batches:
        def w4a16(m=m):
            a = torch.zeros(m, k, dtype=torch.bfloat16, device=device)
            return ops.mm_fp4(a, w.T, None, scale.T, None, weight_layout=layout.value, b_global_scale=one)

        def w4a4(m=m):
            a = torch.zeros(m, k, dtype=torch.bfloat16, device=device)
            gs = ops.compute_global_scale(a)
            return ops.mm_fp4(a, w.T, None, scale.T, None, weight_layout=layout.value, quantize_a=True,
                              a_global_scale=gs, b_global_scale=one)
        steps += [(f"mm_fp4 W4A16 {layout.value} N={n} K={k} M={m}", w4a16),
                  (f"mm_fp4 W4A4 {layout.value} N={n} K={k} M={m}", w4a4)]
    return steps


def _moe_steps(s: MoeShape, batches, device: torch.device) -> list[tuple[str, Callable[[], object]]]:
    w1, w1s = _zero_weight(2 * s.inter, s.hidden, device, s.experts)
    w2, w2s = _zero_weight(s.hidden, s.inter, device, s.experts)
    gs = torch.ones(s.experts, device=device)
    one = torch.ones(1, device=device)
    steps = []
    for t in batches:
        def run(t=t, w4a4=False):
            x = torch.zeros(t, s.hidden, dtype=torch.bfloat16, device=device)
            ids, weights = ops.route(torch.zeros(t, s.experts, device=device), s.top_k)
            scales = dict(a1_global_scale=one, a2_global_scale=one) if w4a4 else {}
            return ops.fused_moe(x, w1, w1s, gs, w2, w2s, gs, ids, weights, **scales)
        what = f"E={s.experts} H={s.hidden} I={s.inter} k={s.top_k} T={t}"
        steps += [(f"fused_moe W4A16 {what}", run), (f"fused_moe W4A4 {what}", lambda t=t: run(t, True))]
    return steps


def run(shapes: Shapes = DEFAULT, device: str | None = None, autotune: bool = False,
        out=None) -> float:
    """Run every step once (progress on `out`, default stderr); returns the seconds it took."""
    out = sys.stderr if out is None else out
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    start = time.perf_counter()
    if dev.type == "cuda":
        from .kernels.cuda.native import load_all
        print("precompile: building / loading the cuda kernel libraries ...", file=out, flush=True)
        load_all(dev.index if dev.index is not None else torch.cuda.current_device())
        print(f"precompile: kernel libraries ready ({time.perf_counter() - start:.1f} s)", file=out, flush=True)
    steps = [s for n, k in shapes.linear for s in _linear_steps(n, k, shapes.batches, dev)]
    steps += [s for m in shapes.moe for s in _moe_steps(m, shapes.batches, dev)]
    tune = tactics.autotune() if autotune else contextlib.nullcontext()
    with torch.inference_mode(), tune:
        for i, (what, step) in enumerate(steps, 1):
            t0 = time.perf_counter()
            step()
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            print(f"precompile: [{i}/{len(steps)}] {what}: {time.perf_counter() - t0:.2f} s", file=out,
                  flush=True)
    total = time.perf_counter() - start
    print(f"precompile: {len(steps)} problems on {dev} in {total:.1f} s", file=out, flush=True)
    return total

