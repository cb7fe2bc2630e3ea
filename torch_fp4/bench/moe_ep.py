"""`python -m torch_fp4 bench moe --ep N`: the expert-parallel FP4 MoE
(torch_fp4.nn.ExpertParallelFP4MoE over NCCL, E / N experts per GPU) on N GPUs of one host, on
the expert shapes of Qwen3-30B-A3B and DeepSeek-V3 (all E routed experts), against peers timed in
the same run. Every column is the time of one whole MoE layer call (router GEMM, routing, experts,
collectives) for T tokens x [T, H] bf16:

- single: the whole FP4MoE (all E experts) on one GPU, no collectives;
- ep: ExpertParallelFP4MoE, tokens="replicated": every rank holds all T tokens, routes them, runs
  its E / N experts (fused_moe, fp32 out) and all-reduces;
- ep_sharded: ExpertParallelFP4MoE, tokens="sharded": each rank brings T / N of the tokens
  (all-gather, local experts, reduce-scatter); nan where N does not divide T;
- bf16_ep: a BF16 expert-parallel MoE with the same router GEMM, routing and all-reduce: the
  rank's E / N experts as bf16 weights through torch._grouped_mm over the (token, slot) pairs
  routed to them (bench.moe.grouped_experts_fp32, masked); nan where torch._grouped_mm does not run.

Ratios: single / ep (the EP speed-up over one GPU) and bf16_ep / ep.

Every rank builds the same whole layer from random NVFP4 codes (bench.moe._fp4_experts, one seed;
timing does not depend on the values) and the same tokens. Every column is timed by
bench.timing.graph_time_us (CUDA-graph replays) with a fixed count of calls per graph, CALLS, the
same on every rank: graph_time_us otherwise picks the count from a timing, which can differ
between ranks, and ranks whose graphs hold different numbers of collectives deadlock on replay.
One eager all-reduce runs before any capture (NCCL sets its communicator up then, not inside a
capture). Reported: the slowest rank's median time per call (a MAX all-reduce of the ranks'
medians). Rank 0 prints the table and writes the CSV; the parent process bounds the run: a rank
that fails stops the others, and no progress for STALL_S seconds stops them all.
"""
from __future__ import annotations

import functools
import gc
import os
import tempfile
import time
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..nn.moe import FP4MoE
from ..nn.parallel import ExpertParallelFP4MoE, _all_reduce
from .moe import (MODELS, QUICK_TOKENS, TOKENS, Bf16Moe, Model, _fp4_experts, _grouped_mm_works,
                  grouped_experts_fp32)
from .timing import graph_time_us, write_csv

DEFAULT_MODELS = ("Qwen3-30B-A3B", "DeepSeek-V3")
CALLS = 20          # calls per captured graph, fixed so that every rank captures as many collectives
STALL_S = 900.0     # stop the run when no rank reports progress (a column timed) for this long
SEED = 0
HEADER = (f"{'model':<14} {'E':>4} {'T':>5} | {'single us':>9} {'ep us':>9} {'sharded us':>10} "
          f"{'bf16 ep us':>10} | {'x 1 GPU':>7} {'x bf16 EP':>9}")


@dataclass(frozen=True)
class Settings:
    """One `bench moe --ep` run, as every rank receives it."""
    world: int
    models: tuple[Model, ...]
    tokens: tuple[int, ...]
    csv_path: str | None = None
    calls: int = CALLS


def problem(world: int, models: Sequence[str] | None = None) -> str | None:
    """Why `bench moe --ep world` over `models` (default DEFAULT_MODELS) cannot run on this
    machine, or None when it can."""
    if world < 2:
        return f"bench moe --ep: expected at least 2 GPUs, got --ep {world}"
    known = {m.name: m for m in MODELS}
    unknown = [name for name in models or () if name not in known]
    if unknown:
        return (f"bench moe --ep: --models: expected names among {', '.join(known)}, "
                f"got {', '.join(unknown)}")
    for name in models or DEFAULT_MODELS:
        if known[name].gpt_oss:
            return (f"bench moe --ep {world}: {name}: the expert-parallel bench runs NVFP4 experts "
                    "only (gpt-oss's MXFP4 experts: bench moe without --ep)")
        if known[name].experts % world:
            return (f"bench moe --ep {world}: {name}'s {known[name].experts} experts do not split "
                    f"evenly over {world} GPUs")
    found = torch.cuda.device_count()
    if found < world:
        return f"bench moe --ep {world}: needs {world} GPUs, found {found}"
    return None


def run(world: int, quick: bool = False, csv_path: str | None = None,
        tokens: tuple[int, ...] | None = None, models: tuple[str, ...] | None = None) -> None:
    """Every model of `models` (default DEFAULT_MODELS) at every batch of TOKENS (QUICK_TOKENS, or
    `tokens`) on `world` spawned ranks, one GPU each. Raises RuntimeError when it cannot run
    (see `problem`) or when a rank fails or stalls."""
    why = problem(world, models)
    if why is not None:
        raise RuntimeError(why)
    names = models or DEFAULT_MODELS
    settings = Settings(world, tuple(m for m in MODELS if m.name in names),
                        tuple(tokens or (QUICK_TOKENS if quick else TOKENS)), csv_path)
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")      # NVLink multicast stays off
    _spawn(settings)


# ---------------------------------------------------------------------------------------------
# Parent: spawn the ranks, bound the run
# ---------------------------------------------------------------------------------------------
def _touch(path: str) -> None:
    with open(path, "a"):
        os.utime(path)


def _spawn(s: Settings) -> None:
    with tempfile.TemporaryDirectory(prefix="torch_fp4_moe_ep_") as tmp:
        beat = os.path.join(tmp, "heartbeat")
        _touch(beat)
        ctx = mp.start_processes(_rank_main, args=(s, os.path.join(tmp, "store"), beat),
                                 nprocs=s.world, join=False, start_method="spawn")
        try:
            # join stops the other ranks (SIGTERM, then SIGKILL) when one fails, and raises
            while not ctx.join(timeout=5, grace_period=10):
                idle = time.time() - os.path.getmtime(beat)
                if idle > STALL_S:
                    raise RuntimeError(f"bench moe --ep {s.world}: no progress for {idle:.0f} s "
                                       f"(a rank hangs, or a collective waits for one that died); "
                                       f"stopped the ranks")
        except (mp.ProcessRaisedException, mp.ProcessExitedException) as exc:
            raise RuntimeError(f"bench moe --ep {s.world}: a rank failed: {exc}") from None
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
                p.join(timeout=30)


# ---------------------------------------------------------------------------------------------
# Ranks
# ---------------------------------------------------------------------------------------------
def _rank_main(rank: int, s: Settings, store: str, beat: str) -> None:
    dev = torch.device("cuda", rank)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=rank, world_size=s.world)
    try:
        dist.all_reduce(torch.ones(1, device=dev))     # NCCL's communicator, before any capture
        torch.cuda.synchronize(dev)
        with torch.no_grad():
            rows = _rank_rows(rank, s, dev, beat)
        if rank == 0:
            write_csv(s.csv_path, rows)
        dist.barrier(device_ids=[rank])
    finally:
        dist.destroy_process_group()


def _rank_rows(rank: int, s: Settings, dev: torch.device, beat: str) -> list[dict]:
    gpu = torch.cuda.get_device_name(dev)
    grouped = _grouped_mm_works(dev)
    if rank == 0:
        nccl = torch.cuda.nccl.version()          # a tuple in recent torch, an int in older ones
        nccl = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
        print(f"bench moe --ep {s.world} on {s.world} x {gpu}; torch {torch.__version__}; NCCL {nccl}; "
              f"{s.calls} calls per CUDA graph; slowest rank's median us per layer; bf16 EP peer: "
              f"{'torch._grouped_mm' if grouped else 'none (torch._grouped_mm does not run)'}", flush=True)
    rows = []
    for m in s.models:
        contenders = _contenders(m, s.world, rank, dev, grouped)
        _touch(beat)
        if rank == 0:
            print(HEADER, flush=True)
        for tokens in s.tokens:
            row = _row(m, s, dev, gpu, contenders, tokens, beat)
            rows.append(row)
            if rank == 0:
                _print_row(row)
        del contenders
        gc.collect()
        torch.cuda.empty_cache()
    return rows


def whole_layer(m: Model, dev: torch.device) -> FP4MoE:
    """The whole FP4MoE of model m from random NVFP4 codes, a random router (weights ~ N(0, 1/H))
    and, for DeepSeek-V3, a random correction bias: the same on every rank (one seed)."""
    gen = torch.Generator(device=dev).manual_seed(SEED)
    w1 = _fp4_experts(m.experts, 2 * m.inter, m.hidden, dev, gen)
    w2 = _fp4_experts(m.experts, m.hidden, m.inter, dev, gen)
    router = torch.nn.Linear(m.hidden, m.experts, bias=False, device=dev, dtype=torch.bfloat16)
    with torch.no_grad():
        router.weight.copy_(torch.randn(m.experts, m.hidden, device=dev, generator=gen) * m.hidden ** -0.5)
    kw = dict(m.route_kw)
    if m.method == "deepseek_v3":
        kw["routing_bias"] = torch.randn(m.experts, device=dev, generator=gen) * 0.01
    return FP4MoE.from_quantized(router, *w1, *w2, top_k=m.top_k, method=m.method, **kw)


def bf16_ep_forward(moe: FP4MoE, w1: torch.Tensor, w2: torch.Tensor, offset: int, group,
                    x: torch.Tensor) -> torch.Tensor:
    """The BF16 EP peer: moe's router GEMM and routing, this rank's bf16 experts
    (grouped_experts_fp32, masked), the all-reduce ExpertParallelFP4MoE uses, rounded to bf16 once."""
    ids, weights = moe._route(x)
    return _all_reduce(grouped_experts_fp32(x, ids, weights, w1, w2, offset, masked=True), group).to(x.dtype)


def _contenders(m: Model, world: int, rank: int, dev: torch.device, grouped: bool) -> dict:
    """Column name -> fn(x [T, H]) for one model (None: not run here)."""
    moe = whole_layer(m, dev)
    ep = ExpertParallelFP4MoE(moe)
    sharded = ExpertParallelFP4MoE(moe, tokens="sharded")

    def ep_sharded(x):
        part = x.shape[0] // world
        return sharded(x.narrow(0, rank * part, part))

    bf16 = None
    if grouped:
        peer = Bf16Moe(m, ep.local_experts, dev, torch.Generator(device=dev).manual_seed(SEED + 1 + rank))
        bf16 = functools.partial(bf16_ep_forward, moe, peer.w1, peer.w2, ep.offset, ep.group)
    return {"single": moe, "ep": ep, "ep_sharded": ep_sharded, "bf16_ep": bf16}


def _slowest(us: float, dev: torch.device) -> float:
    t = torch.tensor([us], dtype=torch.float64, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def _row(m: Model, s: Settings, dev: torch.device, gpu: str, contenders: dict, tokens: int,
         beat: str) -> dict:
    """One row: every contender on the same tokens x [T, H] (the same on every rank), touching
    the heartbeat file after each. Whether a column runs depends only on T and the machine, so
    every rank times the same columns."""
    gen = torch.Generator(device=dev).manual_seed(SEED + 1000 + tokens)
    x = torch.randn(tokens, m.hidden, device=dev, dtype=torch.bfloat16, generator=gen)
    us = {}
    for name, fn in contenders.items():
        if fn is None or (name == "ep_sharded" and tokens % s.world):
            us[name] = float("nan")
        else:
            us[name] = _slowest(graph_time_us(functools.partial(fn, x), [()], calls=s.calls), dev)
        _touch(beat)
    return dict(gpu=gpu, world=s.world, model=m.name, experts=m.experts, hidden=m.hidden,
                inter=m.inter, top_k=m.top_k, tokens=tokens, single_us=us["single"], ep_us=us["ep"],
                ep_sharded_us=us["ep_sharded"], bf16_ep_us=us["bf16_ep"],
                ep_speedup_over_single=us["single"] / us["ep"], ep_x_bf16_ep=us["bf16_ep"] / us["ep"])


def _print_row(r: dict) -> None:
    print(f"{r['model']:<14} {r['experts']:>4} {r['tokens']:>5} | {r['single_us']:>9.1f} "
          f"{r['ep_us']:>9.1f} {r['ep_sharded_us']:>10.1f} {r['bf16_ep_us']:>10.1f} | "
          f"{r['ep_speedup_over_single']:>7.2f} {r['ep_x_bf16_ep']:>9.2f}", flush=True)
