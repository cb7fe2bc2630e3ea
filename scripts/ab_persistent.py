"""Persistent against one-tile-per-CTA launches of the Hopper wgmma GEMM (csrc/mm_wgmma.cu) on
"sm90" weights, interleaved over several rounds so that clock drift hits both alike, with torch
bf16 matmul in the same run: `python scripts/ab_persistent.py [ROUNDS] [M,N,K ...]` on an sm_90 GPU.
Each round times both tactics with `time_tactics` (rotating inputs); medians and ranges per tactic."""
import statistics
import sys

import torch

import torch_fp4
from torch_fp4 import ops, tactics
from torch_fp4.bench.mm import Problem, weight_copies, bf16_timer, nvfp4_weight
from torch_fp4.bench.tune import interleaved_rounds
from torch_fp4.kernels.cuda import mm_wgmma_tactics as WT

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
cases = [tuple(int(v) for v in c.split(",")) for c in sys.argv[2:]] or [
    (1024, 8192, 8192), (4096, 8192, 8192), (256, 28672, 8192), (1024, 28672, 8192), (4096, 28672, 8192),
    (1024, 8192, 28672), (4096, 8192, 28672)]
dev = torch.device("cuda")
for m, n, k in cases:
    w = nvfp4_weight(n, k, dev)
    p = Problem(m, n, k, w, dev)
    packed = torch_fp4.prepack_weight(w[0])
    args = (p.a, packed.T, None, p.w_scale.T, p.alpha)
    w16 = weight_copies(torch.randn(n, k, device=dev, dtype=torch.bfloat16))

    def launch(*a, tactic):
        with tactics.use_tactic(tactic):
            return ops.mm_fp4(*a, weight_layout="sm90")
    bm = 256 if m >= 256 else next(b for b in WT.BLOCK_MS if b >= m)
    one = dict(ctas_per_sm=1, packed=True)
    pair = [WT.WgmmaMmTactic(bm, WT.max_stages(bm, persistent=True, **one), 1, True),
            WT.WgmmaMmTactic(bm, WT.max_stages(bm, **one), 1, False)]
    times, bf16 = interleaved_rounds(pair, launch, args, rounds, bf16_timer(p.a, w16))
    b = statistics.median(bf16)
    cols = " | ".join(f"{'persistent' if t.persistent else 'one tile'} {statistics.median(v):8.1f} us "
                      f"({min(v):.1f}-{max(v):.1f}) x bf16 {b / statistics.median(v):.3f}" for t, v in times.items())
    print(f"M={m:5d} N={n:5d} K={k:5d} bf16 {b:8.1f} us | {cols}", flush=True)
    torch.cuda.empty_cache()
