"""Times tactics of the Hopper wgmma GEMM (csrc/mm_wgmma.cu) on one or more problems, with torch bf16
matmul in the same run, on an sm_90 GPU:

    python scripts/sweep_wgmma.py M[,M...] [N K] [--layout row|sm90] [--near-default]

--layout: the weight layout ("sm90", the FP4Linear default on sm_90, unless N or K do not fit it);
--near-default: only the candidates with the heuristic's block_m or half of it, instead of all."""
import argparse

import torch

from torch_fp4 import formats as F
from torch_fp4 import ops, tactics
from torch_fp4.bench.mm import Problem, weight_copies, bf16_timer, nvfp4_weight
from torch_fp4.bench.tune import time_tactics
from torch_fp4.kernels.cuda import mm_wgmma_tactics as WT
from torch_fp4.problems import MmProblem

ap = argparse.ArgumentParser()
ap.add_argument("ms")
ap.add_argument("n", nargs="?", type=int, default=8192)
ap.add_argument("k", nargs="?", type=int, default=28672)
ap.add_argument("--layout", choices=("row", "sm90"), default="sm90")
ap.add_argument("--near-default", action="store_true")
opt = ap.parse_args()
n, k = opt.n, opt.k
dev = torch.device("cuda")
w = nvfp4_weight(n, k, dev)
layout = F.WeightLayout(opt.layout) if F.sm90_layout_reason(n, k) is None else F.WeightLayout.ROW
w_data = ops.prepack_weight(w[0]) if layout is F.WeightLayout.SM90 else w[0]
w16 = weight_copies(torch.randn(n, k, device=dev, dtype=torch.bfloat16))
for m in (int(v) for v in opt.ms.split(",")):
    p = Problem(m, n, k, w, dev)
    args = (p.a, w_data.T, None, p.w_scale.T, p.alpha)
    bf16 = bf16_timer(p.a, w16)()
    problem = MmProblem.of(*args, torch.bfloat16, F.NVFP4, F.SfLayout.LAYOUT_128x4, layout)
    default = WT.default(problem)
    cands = WT.candidates(problem)
    if opt.near_default:
        keep = {default.block_m, default.block_m // 2}
        cands = [t for t in cands if t.block_m in keep]

    def launch(*a, tactic):
        with tactics.use_tactic(tactic):
            return ops.mm_fp4(*a, backend="cuda", weight_layout=layout.value)
    res = sorted(time_tactics(cands, launch, args), key=lambda r: r[1])
    print(f"== M={m} N={n} K={k} {layout.value} bf16 {bf16:.1f} us; default {default.label()}")
    for t, us in res:
        print(f"{t.label():<80} {us:9.1f} us  x bf16 {bf16 / us:5.2f}{'  <- default' if t == default else ''}",
              flush=True)
