"""The autotuner's timing step: run every candidate tactic on rotating copies of the inputs."""
from __future__ import annotations

import logging
import math
from typing import Callable, Sequence

import torch

from .timing import copies, graph_time_us, rotation

log = logging.getLogger("torch_fp4.autotune")


def time_tactics(candidates: Sequence, launch: Callable, args: tuple) -> list[tuple[object, float]]:
    """(tactic, microseconds per call) for every candidate that runs; failures are logged and
    left out."""
    nbytes = sum(a.numel() * a.element_size() for a in args if isinstance(a, torch.Tensor))
    device = next(a for a in args if isinstance(a, torch.Tensor)).device
    inputs = copies(args, rotation(nbytes, device))
    results = []
    for t in candidates:
        try:
            us = graph_time_us(lambda *a, t=t: launch(*a, tactic=t), inputs, repeats=3, budget_ms=10.0)
        except Exception as exc:  # a tactic that cannot compile here is skipped, not fatal
            log.warning("tactic %s failed: %r", t.label(), exc)
            continue
        results.append((t, us))
    return results


def interleaved_rounds(candidates: Sequence, launch: Callable, args: tuple, rounds: int,
                       peer: Callable[[], float]) -> tuple[dict, list[float]]:
    """A/B timing: `rounds` rounds of time_tactics over the candidates (every other round in
    reverse order, so clock drift hits all alike) with the peer's timer (us per call, e.g.
    bench.mm.bf16_timer: torch bf16 matmul over rotating weight copies) run once per round:
    ({tactic: [us per round]}, [peer us per round])."""
    times: dict = {t: [] for t in candidates}
    peer_us = []
    for r in range(rounds):
        for t, us in time_tactics(candidates if r % 2 == 0 else candidates[::-1], launch, args):
            times[t].append(us)
        peer_us.append(peer())
    return times, peer_us


def fastest(what: str, candidates: Sequence, launch: Callable, args: tuple):
    """The fastest candidate tactic (ties: the earlier one)."""
    log.info("autotuning %s: %d tactics", what, len(candidates))
    results = time_tactics(candidates, launch, args)
    if not results:
        raise RuntimeError(f"autotune {what}: no tactic ran ({len(candidates)} tried)")
    best, us = min(results, key=lambda r: (r[1] if math.isfinite(r[1]) else math.inf))
    log.info("autotune %s: %s (%.1f us)", what, best.label(), us)
    return best
