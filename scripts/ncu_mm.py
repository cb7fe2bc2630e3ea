"""One mm_fp4 call (W4A16, NVFP4, heuristic tactic) for profiling: `ncu -k regex:_mm_kernel
python scripts/ncu_mm.py M N K [wgmma]` (wgmma: the Hopper GEMM for any M > 16)."""
import sys

import torch

import torch_fp4.tuning as tuning
from torch_fp4.bench.mm import Problem, nvfp4_weight

m, n, k = (int(v) for v in sys.argv[1:4])
if "wgmma" in sys.argv[4:]:
    tuning.HOPPER_MM_MS = (17, 1 << 30)
dev = torch.device("cuda")
p = Problem(m, n, k, nvfp4_weight(n, k, dev), dev)
for _ in range(2):
    p.w4a16()
torch.cuda.synchronize()
