"""`auto`'s Hopper-GEMM tactic against the one it would take with fewer block_m choices, in one
process, beside torch bf16 ("sm90" NVFP4 weights, rotating operands, medians of five interleaved
rounds, and whether both give the same bits):

    python scripts/ab_block_m.py N K M [M ...] [--without 160,224]      (sm_90 GPU)"""
import argparse

import torch

from torch_fp4.bench.mm import rotated, sm90_under
from torch_fp4.bench.timing import interleaved_medians
from torch_fp4.kernels.cuda import mm_wgmma_tactics as WT

ap = argparse.ArgumentParser()
ap.add_argument("n", type=int)
ap.add_argument("k", type=int)
ap.add_argument("ms", type=int, nargs="+")
ap.add_argument("--without", default="160,224", help="block_m left out, comma-separated")
opt = ap.parse_args()
dev = torch.device("cuda")
for m in opt.ms:
    r = rotated(m, opt.n, opt.k, dev)
    problem = r.sm90_problem()
    new = WT.default(problem)
    kept = WT.BLOCK_MS
    WT.BLOCK_MS = tuple(b for b in kept if str(b) not in opt.without.split(","))
    old = WT.default(problem)
    WT.BLOCK_MS = kept

    cols = {"auto": lambda: r.time_sm90(sm90_under(new)),
            f"without {opt.without}": lambda: r.time_sm90(sm90_under(old)),
            "bf16": r.time_bf16}
    us = interleaved_medians(cols, 5)
    first = (r.problems[0], r.packs[0])
    same = torch.equal(sm90_under(new)(*first), sm90_under(old)(*first))
    print(f"M={m} N={opt.n} K={opt.k}: " + "  ".join(f"{c} {v:.2f}" for c, v in us.items()) +
          f"  auto x bf16 {us['bf16'] / us['auto']:.2f}  same bits: {same}  auto {new.label()}  without {old.label()}",
          flush=True)
    del r
    torch.cuda.empty_cache()
