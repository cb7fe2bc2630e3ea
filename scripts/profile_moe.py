"""Per-kernel GPU times of one fused_moe call (torch.profiler), for the bench moe models.

Usage: python scripts/profile_moe.py [T ...]   (default 1 16 4096; W4A16 and W4A4)
"""
import sys
from collections import defaultdict

import torch

import torch_fp4 as t4
from torch_fp4.bench import moe as B


def profile(m: B.Model, tokens: int, w4a4: bool, iters: int = 20) -> None:
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    experts = B._experts_that_fit(m, dev, tokens)
    w1, w2, x, ids, tw = B.routed_batch(m, experts, tokens, dev, gen)
    weights = (*w1, *w2)
    extra = {}
    if w4a4:
        extra = dict(a1_global_scale=t4.compute_global_scale(x),
                     a2_global_scale=torch.full((1,), 448 * 6 / 1e6, device=dev))

    def call():
        return t4.fused_moe(x, *weights, ids, tw, local_expert_offset=0, num_local_experts=experts, **extra)
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            call()
        torch.cuda.synchronize()
    times = defaultdict(float)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            times[ev.name[:40]] += ev.device_time / iters
    total = sum(times.values())
    parts = ", ".join(f"{k} {v:.1f}" for k, v in sorted(times.items(), key=lambda kv: -kv[1]))
    print(f"{m.name:<14} T={tokens:<5} {'W4A4 ' if w4a4 else 'W4A16'} kernels {total:7.1f} us: {parts}", flush=True)
    torch.cuda.empty_cache()


if __name__ == "__main__":
    tokens = [int(a) for a in sys.argv[1:]] or [1, 16, 4096]
    for m in B.MODELS:
        for t in tokens:
            for w4a4 in (False, True):
                profile(m, t, w4a4)
