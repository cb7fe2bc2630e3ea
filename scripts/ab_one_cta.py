"""Weights of more 128-row tiles than SMs at M = 32-64 ("sm90"): the persistent launch at two CTAs
per SM (64-K stages at block_m 64) against one CTA per SM (one or two K groups, with and without
stream-K), whose stages hold two sub-tiles and so convert the block scales once per CTA, at
`auto`'s block_m. Interleaved rounds, torch bf16 in the same rounds; every output against the
two-CTA launch's (max |diff| / max |out|) and against itself run again (bits). On an sm_90 GPU:
`python scripts/ab_one_cta.py ROUNDS M,N,K ...`."""
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

rounds = int(sys.argv[1])
cases = [tuple(int(v) for v in c.split(",")) for c in sys.argv[2:]]
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
    d = WT.default(problem)
    bm, one = d.block_m, dict(ctas_per_sm=1, packed=True)
    lim = WT.smem_limit(problem)
    cand = [WT.WgmmaMmTactic(bm, WT.max_stages(bm, WT.smem_limit(problem, 2), True, ctas_per_sm=2, packed=True),
                             1, True, 2)]
    for kg in (2, 1):
        for sk in (False, True):
            cand.append(WT.WgmmaMmTactic(bm, WT.max_stages(bm, lim, True, kg, **one), 1, True, 1, sk, kg))
    cand = [t for t in dict.fromkeys(cand) if WT.why_not(t, problem) is None]
    print(f"auto: {d.label()}", flush=True)

    def launch(*a, tactic):
        with tactics.use_tactic(tactic):
            return ops.mm_fp4(*a, backend="cuda", weight_layout="sm90")
    ref = launch(*args, tactic=cand[0]).float()
    times, bf16 = interleaved_rounds(cand, launch, args, rounds, bf16_timer(p.a, w16))
    b = statistics.median(bf16)
    print(f"M={m:5d} N={n:5d} K={k:5d} bf16 {b:8.1f} us", flush=True)
    for t, v in times.items():
        out = launch(*args, tactic=t).float()
        again = launch(*args, tactic=t).float()
        rel = ((out - ref).abs().max() / ref.abs().max()).item()
        if v:
            med = statistics.median(v)
            print(f"    {t.label():<90} {med:8.1f} us ({min(v):.1f}-{max(v):.1f}) x bf16 {b / med:.3f}"
                  f"  vs two CTAs {rel:.1e} same-bits-again {torch.equal(out, again)}", flush=True)
