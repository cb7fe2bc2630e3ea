"""`auto`'s Hopper-GEMM tactic against the one it would take with fewer block_m choices, in one
process, beside torch bf16 ("sm90" NVFP4 weights, rotating operands, medians of five interleaved
rounds, and whether both give the same bits):

    python scripts/ab_block_m.py N K M [M ...] [--without 160,224]      (sm_90 GPU)"""
import argparse

import torch

from torch_fp4 import formats as F
from torch_fp4 import ops, tactics
from torch_fp4.bench.mm import rotated
from torch_fp4.bench.timing import interleaved_medians
from torch_fp4.kernels.cuda import mm_wgmma_tactics as WT
from torch_fp4.problems import MmProblem

ap = argparse.ArgumentParser()
ap.add_argument("n", type=int)
ap.add_argument("k", type=int)
ap.add_argument("ms", type=int, nargs="+")
ap.add_argument("--without", default="160,224", help="block_m left out, comma-separated")
opt = ap.parse_args()
dev = torch.device("cuda")
for m in opt.ms:
    r = rotated(m, opt.n, opt.k, dev)
    ps, packs = r.problems, r.packs
    p0 = ps[0]
    problem = MmProblem.of(p0.a, packs[0].T, None, p0.w_scale.T, p0.alpha, torch.bfloat16, F.NVFP4,
                           F.SfLayout.LAYOUT_128x4, F.WeightLayout.SM90)
    new = WT.default(problem)
    kept = WT.BLOCK_MS
    WT.BLOCK_MS = tuple(b for b in kept if str(b) not in opt.without.split(","))
    old = WT.default(problem)
    WT.BLOCK_MS = kept

    def run(t, p, pk):
        with tactics.use_tactic(t):
            return ops.mm_fp4(p.a, pk.T, None, p.w_scale.T, p.alpha, weight_layout="sm90", backend="cuda")
    cols = {"auto": lambda: r.time_sm90(lambda p, pk: run(new, p, pk)),
            f"without {opt.without}": lambda: r.time_sm90(lambda p, pk: run(old, p, pk)),
            "bf16": r.time_bf16}
    us = interleaved_medians(cols, 5)
    same = torch.equal(run(new, p0, packs[0]), run(old, p0, packs[0]))
    print(f"M={m} N={opt.n} K={opt.k}: " + "  ".join(f"{c} {v:.2f}" for c, v in us.items()) +
          f"  auto x bf16 {us['bf16'] / us['auto']:.2f}  same bits: {same}  auto {new.label()}  without {old.label()}",
          flush=True)
    del r, ps, packs
    torch.cuda.empty_cache()
