"""Times every tactic of the Hopper wgmma GEMM (csrc/mm_wgmma.cu) on one or more problems, with
torch bf16 matmul in the same run: `python scripts/sweep_wgmma.py M[,M...] [N K]` on an sm_90 GPU."""
import sys

import torch

from torch_fp4 import formats as F
from torch_fp4 import ops, tactics
from torch_fp4.bench.mm import Problem, nvfp4_weight
from torch_fp4.bench.timing import graph_time_us
from torch_fp4.bench.tune import time_tactics
from torch_fp4.kernels.cuda import mm_wgmma_tactics as WT

ms = [int(v) for v in sys.argv[1].split(",")]
n, k = (int(v) for v in sys.argv[2:4]) if len(sys.argv) > 3 else (8192, 28672)
dev = torch.device("cuda")
w = nvfp4_weight(n, k, dev)
w16 = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
for m in ms:
    p = Problem(m, n, k, w, dev)
    args = (p.a, p.w_data.T, None, p.w_scale.T, p.alpha)
    bf16 = graph_time_us(lambda: torch.matmul(p.a, w16.T), [()])
    launcher = (*args, torch.bfloat16, F.NVFP4, F.SfLayout.LAYOUT_128x4)

    def launch(*a, tactic):
        with tactics.use_tactic(tactic):
            return ops.mm_fp4(*a, backend="cuda")
    res = sorted(time_tactics(WT.candidates(*launcher), launch, args), key=lambda r: r[1])
    print(f"== M={m} N={n} K={k} bf16 {bf16:.1f} us; default {WT.default(*launcher).label()}")
    for t, us in res:
        print(f"{t.label():<80} {us:9.1f} us  x bf16 {bf16 / us:5.2f}", flush=True)
