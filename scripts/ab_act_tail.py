"""The Hopper GEMM at an M that is no multiple of its block_m, against the same launch on a 256-row
activation tensor whose rows past M are zero (the same tactic and work, every TMA box in bounds)
and on 256 random rows, beside torch bf16 at M; "sm90" NVFP4 weights, N = K = 8192, rotating
operands, medians of five interleaved rounds, and a check that the M rows agree:

    python scripts/ab_act_tail.py M [M ...]      (sm_90 GPU; default 160 192)"""
import sys
import torch
from torch_fp4 import ops
from torch_fp4.bench.mm import rotated
from torch_fp4.bench.timing import interleaved_medians

dev = torch.device("cuda")
n = k = 8192
for m in (int(v) for v in sys.argv[1:] or ["160", "192"]):
    r = rotated(m, n, k, dev)
    ps, packs = r.problems, r.packs
    a = ps[0].a
    pad = torch.zeros(256, k, device=dev, dtype=a.dtype)
    pad[:m] = a
    full = torch.randn(256, k, device=dev, dtype=a.dtype)
    def call(x, p, pk):
        return ops.mm_fp4(x, pk.T, None, p.w_scale.T, p.alpha, weight_layout="sm90")
    cols = {
        f"M={m}": lambda: r.time_sm90(lambda p, pk: call(a, p, pk)),
        "256 zero-padded": lambda: r.time_sm90(lambda p, pk: call(pad, p, pk)),
        "256 random": lambda: r.time_sm90(lambda p, pk: call(full, p, pk)),
        f"bf16 M={m}": r.time_bf16,
    }
    us = interleaved_medians(cols, 5)
    same = torch.equal(call(a, ps[0], packs[0]), call(pad, ps[0], packs[0])[:m])
    print(f"N=K={n} " + "  ".join(f"{c}: {v:.2f}" for c, v in us.items()) + f"  same rows: {same}", flush=True)
    del r, ps, packs
    torch.cuda.empty_cache()
