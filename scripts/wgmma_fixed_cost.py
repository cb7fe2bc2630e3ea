"""The Hopper GEMM's fixed cost, on an sm_90 GPU: python scripts/wgmma_fixed_cost.py TAG [K,K,...]
(default K = 64..2048). For M x N = 32 x 4096, 64 x 4096, 128 x 4096, 128 x 8192, 256 x 4096 and
"sm90" NVFP4 weights: one-tile tactics (split 1 and 2, one K group) and the persistent launch at
that block_m, the small-M heuristic (M <= 32), auto's tactic, and torch bf16, timed alike in one
process. Prints one line per problem, starting with TAG (to compare builds run one after another);
COLS=s1,s2,pers,small,auto (the default) picks the columns besides bf16."""
import os
import sys

import torch

from torch_fp4 import ops, tactics
from torch_fp4 import formats as F
from torch_fp4.bench.mm import Problem, nvfp4_weight
from torch_fp4.bench.timing import graph_time_us
from torch_fp4.kernels.cuda import mm_tactics as MT, mm_wgmma_tactics as WT
from torch_fp4.problems import MmProblem

tag = sys.argv[1] if len(sys.argv) > 1 else ""
cols_wanted = os.environ.get("COLS", "s1,s2,pers,small,auto").split(",")
dev = torch.device("cuda")
for m, n, bm in ((32, 4096, 32), (64, 4096, 64), (128, 4096, 64), (128, 8192, 128), (256, 4096, 128)):
    for k in [int(v) for v in (sys.argv[2] if len(sys.argv) > 2 else '64,128,256,512,1024,2048').split(',')]:
        w = nvfp4_weight(n, k, dev)
        packed = ops.prepack_weight(w[0])
        w16 = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
        p = Problem(m, n, k, w, dev)
        args = (p.a, packed.T, None, p.w_scale.T, p.alpha)
        prob = MmProblem.of(*args, torch.bfloat16, F.NVFP4, F.SfLayout.LAYOUT_128x4, F.WeightLayout.SM90)
        cols = {"bf16": lambda: torch.matmul(p.a, w16.T)}
        def under(t):
            def call():
                with tactics.use_tactic(t):
                    return ops.mm_fp4(*args, weight_layout="sm90")
            return call
        tactics_by_col = {}
        for split, pers in ((1, False), (2, False), (1, True)):
            tactics_by_col["pers" if pers else f"s{split}"] = (
                WT.WgmmaMmTactic(bm, min(6, WT.max_stages(bm, persistent=pers, ctas_per_sm=1, packed=True)), split, pers), WT.why_not)
        if m <= 32:
            tactics_by_col["small"] = (MT.default(prob), MT.why_not)
        for name, (t, why_not) in tactics_by_col.items():
            if name in cols_wanted and why_not(t, prob) is None:
                cols[name if name == "small" else f"wg {name}"] = under(t)   # the labels of the data files
        if "auto" in cols_wanted:
            cols["auto"] = lambda: ops.mm_fp4(*args, weight_layout="sm90")
        us = {name: graph_time_us(fn, [()]) for name, fn in cols.items()}
        print(f"{tag} M={m:4d} N={n:5d} K={k:5d} " + "  ".join(f"{c} {v:6.2f}" for c, v in us.items()), flush=True)
