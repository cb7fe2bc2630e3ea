"""K groups and CTAs per SM in the Hopper wgmma GEMM (csrc/mm_wgmma.cu) on "sm90" weights, at
`auto`'s block_m, interleaved over several rounds (clock drift hits all alike), torch bf16 matmul in
the same rounds. Two sets of tactics:
- default: the heuristic tactic and every two-K-group candidate of its block_m;
- `--ctas`: the persistent launch at two CTAs per SM (64-K stages at block_m 64), then one CTA per SM
  with one or two K groups, with and without stream-K (stages of two sub-tiles: the block scales
  converted once per CTA); every output also against the first tactic's (max |diff| / max |out|)
  and against itself run again (bits).
`python scripts/ab_k_groups.py [--ctas] [ROUNDS] [M,N,K ...]` on an sm_90 GPU. Medians and ranges
per tactic."""
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

argv = sys.argv[1:]
ctas_set = bool(argv) and argv[0] == "--ctas"
argv = argv[1:] if ctas_set else argv
rounds = int(argv[0]) if argv else 3
cases = [tuple(int(v) for v in c.split(",")) for c in argv[1:]] or [
    (m, n, k) for n, k in ((8192, 28672), (28672, 8192), (8192, 8192)) for m in (32, 64, 128, 256)]


def ctas_tactics(problem: MmProblem, bm: int) -> list:
    """Two CTAs per SM, then one CTA per SM: one or two K groups, without and with stream-K."""
    out = [WT.WgmmaMmTactic(bm, WT.max_stages(bm, WT.smem_limit(problem, 2), True, ctas_per_sm=2, packed=True),
                            1, True, 2)]
    for kg in (2, 1):
        stages = WT.max_stages(bm, WT.smem_limit(problem), True, kg, ctas_per_sm=1, packed=True)
        out += [WT.WgmmaMmTactic(bm, stages, 1, True, 1, sk, kg) for sk in (False, True)]
    return out


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
    if ctas_set:
        pair = ctas_tactics(problem, default.block_m)
    else:
        pair = [default, *(t for t in WT.candidates(problem) if t.k_groups == 2 and t.block_m == default.block_m)]
    pair = [t for t in dict.fromkeys(pair) if WT.why_not(t, problem) is None]

    def launch(*a, tactic):
        with tactics.use_tactic(tactic):
            return ops.mm_fp4(*a, backend="cuda", weight_layout="sm90")
    first = launch(*args, tactic=pair[0]).float()
    times, bf16 = interleaved_rounds(pair, launch, args, rounds, bf16_timer(p.a, w16))
    b = statistics.median(bf16)
    print(f"M={m:5d} N={n:5d} K={k:5d} bf16 {b:8.1f} us (auto: {default.label()})", flush=True)
    for t, v in times.items():
        if not v:
            continue
        med = statistics.median(v)
        line = f"    {t.label():<100} {med:8.1f} us ({min(v):.1f}-{max(v):.1f}) x bf16 {b / med:.3f}"
        if ctas_set:
            out, again = launch(*args, tactic=t).float(), launch(*args, tactic=t).float()
            rel = ((out - first).abs().max() / first.abs().max()).item()
            line += f"  vs first {rel:.1e} same bits again {torch.equal(out, again)}"
        print(line, flush=True)
