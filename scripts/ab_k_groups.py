"""One against two K groups in the Hopper wgmma GEMM (csrc/mm_wgmma.cu) on "sm90" weights: the
heuristic tactic and every two-K-group candidate of its block_m, interleaved over several rounds
(clock drift hits all alike), torch bf16 matmul in the same rounds:
`python scripts/ab_k_groups.py [ROUNDS] [M,N,K ...]` on an sm_90 GPU. Medians and ranges per tactic."""
import statistics
import sys

import torch

import torch_fp4
from torch_fp4 import formats as F
from torch_fp4 import ops, tactics
from torch_fp4.bench.mm import Problem, weight_copies, bf16_timer, nvfp4_weight
from torch_fp4.bench.tune import interleaved_rounds
from torch_fp4.kernels.cuda import mm_wgmma_tactics as WT
from torch_fp4.problems import MmProblem

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
cases = [tuple(int(v) for v in c.split(",")) for c in sys.argv[2:]] or [
    (m, n, k) for n, k in ((8192, 28672), (28672, 8192), (8192, 8192)) for m in (32, 64, 128, 256)]
dev = torch.device("cuda")
weights = {}
for m, n, k in cases:
    if (n, k) not in weights:
        weights.clear()
        torch.cuda.empty_cache()
        w = nvfp4_weight(n, k, dev)
        weights[n, k] = (w, torch_fp4.prepack_weight(w[0]),
                         weight_copies(torch.randn(n, k, device=dev, dtype=torch.bfloat16)))
    w, packed, w16 = weights[n, k]
    p = Problem(m, n, k, w, dev)
    args = (p.a, packed.T, None, p.w_scale.T, p.alpha)
    problem = MmProblem.of(*args, torch.bfloat16, F.NVFP4, F.SfLayout.LAYOUT_128x4, F.WeightLayout.SM90)
    default = WT.default(problem)
    two = [t for t in WT.candidates(problem) if t.k_groups == 2 and t.block_m == default.block_m]
    pair = [default, *two]

    def launch(*a, tactic):
        with tactics.use_tactic(tactic):
            return ops.mm_fp4(*a, backend="cuda", weight_layout="sm90")
    times, bf16 = interleaved_rounds(pair, launch, args, rounds, bf16_timer(p.a, w16))
    b = statistics.median(bf16)
    print(f"M={m:5d} N={n:5d} K={k:5d} bf16 {b:8.1f} us", flush=True)
    for t, v in times.items():
        if v:
            med = statistics.median(v)
            print(f"    {t.label():<100} {med:8.1f} us ({min(v):.1f}-{max(v):.1f}) x bf16 {b / med:.3f}", flush=True)
