"""`python -m torch_fp4 bench overhead`: host time per call of every public op on tiny problems.

A loop of many calls with no synchronization, on problems small enough that the GPU finishes
each kernel before the host issues the next one, measures what the host spends per call: Python
validation and dispatch, PyTorch's custom-op machinery and the kernel launches. Peers in the
same run, same timer: `torch.nn.functional.linear` on the same sizes, and an empty
`torch.library.custom_op` taking the same number of tensors (what PyTorch's own op path costs).
Each op is timed through its public function and, where it differs, straight through
`torch.ops.torch_fp4.*`. "over empty op" = the op's time minus the empty op's with as many
tensor arguments, as the median over rounds of the difference within a round: every round times
every case once (200 back-to-back calls each), so a slow stretch of a shared host falls on all
cases alike. On the CPU (`--device cpu`) the reference backend's arithmetic is included.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

from .. import formats as F
from .. import nn, ops
from .. import testing as T
from .timing import write_csv

N = K = 128          # weight [N, K]; a multiple of the "sm90" tile, so FP4Linear's "auto" may use it
TOKENS = 1
EXPERTS, TOP_K = 8, 2
LINEAR = "F.linear (bf16)"   # the peer case every op's "x linear" divides by


def _empty_op(n: int) -> Callable:
    """An empty custom op with n tensor arguments returning a fresh tensor (PyTorch's own cost)."""
    args = ", ".join(f"t{i}: torch.Tensor" for i in range(n))
    scope: dict = {"torch": torch}
    # custom_op reads the signature's annotations, so the function is written out per arity.
    exec(f"def empty{n}({args}) -> torch.Tensor:\n    return torch.empty_like(t0)\n", scope)
    op = torch.library.custom_op(f"torch_fp4_bench::empty{n}", scope[f"empty{n}"], mutates_args=())
    op.register_fake(lambda *ts: torch.empty_like(ts[0]))
    return op


_EMPTY: dict[int, Callable] = {}


def empty_op(n: int) -> Callable:
    if n not in _EMPTY:
        _EMPTY[n] = _empty_op(n)
    return _EMPTY[n]


@dataclass
class Case:
    name: str
    fn: Callable[[], object]
    tensors: int            # tensor arguments of the op (the empty op's arity to compare with)


def _sample_us(fn: Callable[[], object], device: torch.device, calls: int) -> float:
    """Host time per call of `calls` back-to-back calls, then a synchronization (not timed)."""
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    us = (time.perf_counter() - t0) / calls * 1e6
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return us


def _warm(fn: Callable[[], object], device: torch.device) -> None:
    for _ in range(10):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def host_us(fn: Callable[[], object], device: torch.device, calls: int = 200, repeats: int = 7) -> float:
    """Median over `repeats` of the host time per call of `calls` back-to-back calls."""
    _warm(fn, device)
    return statistics.median(_sample_us(fn, device, calls) for _ in range(repeats))


def interleaved_us(fns: list[Callable[[], object]], device: torch.device, calls: int = 200,
                   rounds: int = 9) -> list[list[float]]:
    """Per function, its host us per call in each of `rounds` rounds; every round times every
    function once (`calls` back-to-back calls each), so a slow stretch of the host falls on all of
    them alike rather than on whichever was being timed."""
    for fn in fns:
        _warm(fn, device)
    samples: list[list[float]] = [[] for _ in fns]
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            samples[i].append(_sample_us(fn, device, calls))
    return samples


def cases(device: torch.device) -> list[Case]:
    x = torch.randn(TOKENS, K, device=device, dtype=torch.bfloat16)
    w = torch.randn(N, K, device=device, dtype=torch.bfloat16)
    wq, ws, gs = T.quantized_weight(N, K, F.NVFP4, device)
    alpha = F.nvfp4_alpha(None, gs)
    bias = torch.randn(N, device=device, dtype=torch.bfloat16)
    xq, xs = ops.nvfp4_quantize(x, gs)
    lin = nn.FP4Linear.from_linear(torch.nn.Linear(K, N, device=device, dtype=torch.bfloat16))
    lin4 = nn.FP4Linear.from_linear(torch.nn.Linear(K, N, device=device, dtype=torch.bfloat16), activations="fp4")
    lin4.calibrate(x)   # a static input scale: the batch-invariant W4A4
    moe = T.moe_problem(TOKENS, K, N, EXPERTS, TOP_K, device, w4a4=False)
    logits = torch.randn(TOKENS, EXPERTS, device=device)
    tops = torch.ops.torch_fp4
    fp4 = [
        Case("compute_global_scale", lambda: ops.compute_global_scale(x), 1),
        Case("nvfp4_quantize", lambda: ops.nvfp4_quantize(x, gs), 2),
        Case("mxfp4_quantize", lambda: ops.mxfp4_quantize(x), 1),
        Case("fp4_dequantize", lambda: ops.fp4_dequantize(xq, xs, gs), 3),
        Case("fp4_quantized_values", lambda: ops.fp4_quantized_values(x, gs), 2),
        Case("mm_fp4 W4A16", lambda: ops.mm_fp4(x, wq.T, None, ws.T, alpha), 4),
        Case("mm_fp4 W4A16 bias", lambda: ops.mm_fp4(x, wq.T, None, ws.T, alpha, bias=bias), 5),
        Case("torch.ops.torch_fp4.mm_fp4 W4A16",
             lambda: tops.mm_fp4(x, wq.T, None, ws.T, alpha, torch.bfloat16, 16, "128x4", 0, "row"), 4),
        Case("mm_fp4 W4A4", lambda: ops.mm_fp4(xq, wq.T, xs, ws.T, alpha), 5),
        Case("mm_fp4 W4A4 quantize_a",
             lambda: ops.mm_fp4(x, wq.T, None, ws.T, alpha, quantize_a=True, a_global_scale=gs), 5),
        Case("route", lambda: ops.route(logits, TOP_K), 1),
        Case("fused_moe W4A16", lambda: ops.fused_moe(**moe), 9),
        Case("FP4Linear W4A16", lambda: lin(x), 4),
        Case("FP4Linear W4A4", lambda: lin4(x), 5),
    ]
    pool = [x, wq, ws, alpha, gs, xq, xs, logits, *moe.values()]
    arities = sorted({c.tensors for c in fp4})
    empties = [Case(f"empty custom op, {n} tensors", (lambda n=n: empty_op(n)(*pool[:n])), n) for n in arities]
    return [Case(LINEAR, lambda: torch.nn.functional.linear(x, w), 2)] + empties + fp4


def run(device: str | None = None, csv_path: str | None = None) -> list[dict]:
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    where = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU"
    print(f"bench overhead: host us per call (no synchronization; M = {TOKENS}, N = K = {N}) on {where}; "
          f"torch {torch.__version__}; under torch.inference_mode() and torch.no_grad()")
    rows = []
    for mode, ctx in (("inference_mode", torch.inference_mode), ("no_grad", torch.no_grad)):
        with ctx():
            cs = cases(dev)
            samples = interleaved_us([c.fn for c in cs], dev)
        empty = {c.tensors: s for c, s in zip(cs, samples) if c.name.startswith("empty custom op")}
        linear = next(s for c, s in zip(cs, samples) if c.name == LINEAR)
        for c, s in zip(cs, samples):
            plain = c.name == LINEAR or c.name.startswith("empty")
            e = empty[c.tensors]
            rows.append({"device": where, "mode": mode, "op": c.name, "host_us": statistics.median(s),
                         "tensors": c.tensors, "empty_us": statistics.median(e),
                         # the median of the same round's differences and ratios
                         "over_empty_us": None if plain else statistics.median(a - b for a, b in zip(s, e)),
                         "x_linear": statistics.median(a / b for a, b in zip(s, linear)),
                         "rounds": len(s)})
    by = {(r["mode"], r["op"]): r for r in rows}
    print(f"{'op':<34} | {'inference_mode us':>17} {'over empty':>10} {'x linear':>8} | "
          f"{'no_grad us':>10} {'over empty':>10}")
    for r in rows[: len(rows) // 2]:
        cells = []
        for mode in ("inference_mode", "no_grad"):
            q = by[(mode, r["op"])]
            over = q["over_empty_us"]
            cells.append((q["host_us"], "" if over is None else f"{over:.1f}", q["x_linear"]))
        (a, b, c), (d, e, _) = cells
        print(f"{r['op']:<34} | {a:>17.1f} {b:>10} {c:>8.2f} | {d:>10.1f} {e:>10}")
    write_csv(csv_path, rows)
    return rows


def profile(name: str, device: str | None = None, calls: int = 2000, top: int = 30) -> None:
    """cProfile of `calls` calls of the case named `name` (where the host time goes)."""
    import cProfile
    import pstats

    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    with torch.inference_mode():
        found = [c for c in cases(dev) if c.name == name]
        if not found:
            raise ValueError(f"bench overhead: --profile: expected one of "
                             f"{[c.name for c in cases(dev)]}, got {name!r}")
        fn = found[0].fn
        host_us(fn, dev, calls=20, repeats=1)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(calls):
            fn()
        prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(top)
