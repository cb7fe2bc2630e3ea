"""Device timing: CUDA-graph replays of many calls over rotating inputs, timed with events."""
from __future__ import annotations

import csv
import math
import statistics
import sys
from typing import Callable, Sequence

import torch


def l2_bytes(device: torch.device) -> int:
    return getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 50 << 20)


def rotation(nbytes_per_input: int, device: torch.device) -> int:
    """How many input copies to cycle through so the set is 3x the L2 (no cache flattery)."""
    return max(1, min(64, math.ceil(3 * l2_bytes(device) / max(1, nbytes_per_input))))


def copies(args: tuple, n: int) -> list[tuple]:
    """args plus n-1 copies of its tensors, each in memory of its own (non-tensors shared)."""
    out = [args]
    for _ in range(n - 1):
        out.append(tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args))
    return out


def graph_time_us(fn: Callable, inputs: Sequence[tuple], calls: int | None = None,
                  repeats: int = 5, budget_ms: float = 30.0) -> float:
    """Median over `repeats` replays of a graph holding `calls` calls of fn (cycling through
    `inputs`), in microseconds per call. fn is run once per input first (compile/warm-up);
    `calls` defaults to what fits in about `budget_ms` per replay (2 to 50, at least one pass
    over the inputs)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for args in inputs:
            fn(*args)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(*inputs[0])
        end.record()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    if calls is None:
        estimate_ms = max(start.elapsed_time(end), 1e-3)
        calls = max(2, min(50, int(budget_ms / estimate_ms)))
        calls = max(calls, min(len(inputs), 64))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(*inputs[i % len(inputs)])
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / calls)
    del graph
    return statistics.median(times)


def interleaved_medians(timers: dict[str, Callable[[], float]], rounds: int) -> dict[str, float]:
    """Each timer (a measurement in us) run once per round for `rounds` interleaved rounds, every
    other round in reverse order: the median per timer. A drift of the GPU's clock (which its power
    limit moves with the work just before) or of the host over the run falls on every column alike,
    and no column always follows the same one."""
    times: dict[str, list[float]] = {c: [] for c in timers}
    order = list(timers)
    for r in range(rounds):
        for c in (order if r % 2 == 0 else order[::-1]):
            times[c].append(timers[c]())
    return {c: statistics.median(v) for c, v in times.items()}


def same_round_medians(cols: dict[str, Callable], rounds: int = 5) -> dict[str, float]:
    """interleaved_medians of each column's graph_time_us (one call per replay, no arguments)."""
    return interleaved_medians({c: (lambda f=f: graph_time_us(f, [()])) for c, f in cols.items()}, rounds)


def copy_bandwidth_gbs(device: torch.device, nbytes: int = 1 << 30) -> float:
    """Device-to-device copy bandwidth, bytes read plus bytes written, in GB/s: the faster of a
    memcpy (`copy_`, a copy-engine node inside a graph) and an SM-driven elementwise copy
    kernel over the same bytes."""
    src = torch.empty(nbytes // 4, dtype=torch.int32, device=device).random_()
    dst = torch.empty_like(src)
    us = min(graph_time_us(lambda: dst.copy_(src), [()]),
             graph_time_us(lambda: torch.bitwise_not(src, out=dst), [()]))
    del src, dst
    return 2 * nbytes / us / 1e3


def geomean(values: Sequence[float]) -> float:
    vals = [v for v in values if v > 0 and math.isfinite(v)]
    return math.exp(sum(map(math.log, vals)) / len(vals)) if vals else float("nan")


def write_csv(csv_path: str | None, rows: list[dict]) -> None:
    """Benchmark rows to a CSV file (columns from the first row), when a path is given."""
    if csv_path and rows:
        with open(csv_path, "w", newline="") as f:
            wr = csv.DictWriter(f, fieldnames=list(rows[0]))
            wr.writeheader()
            wr.writerows(rows)
        print(f"wrote {len(rows)} rows to {csv_path}", file=sys.stderr)
