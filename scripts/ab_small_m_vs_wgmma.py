"""At M <= 16 on "sm90" NVFP4 weights: the small-M GEMM's heuristic tactic against the Hopper
GEMM's (what `auto` would pick above SMALL_M_MAX), beside quack and torch bf16, over rotating
operands, medians of five interleaved rounds, on an sm_90 GPU:

    python scripts/ab_small_m_vs_wgmma.py [M,N,K ...]

Checks that both give the same bits (exact products, fp32 sums in another order can differ: the
largest relative difference is printed instead)."""
import sys

import torch

from torch_fp4.bench.mm import quack_w4a16, rotated, sm90_under
from torch_fp4.bench.timing import graph_time_us, interleaved_medians
from torch_fp4.kernels.cuda import mm_tactics as small, mm_wgmma_tactics as wg


def main(problems):
    dev = torch.device("cuda")
    for m, n, k in problems:
        r = rotated(m, n, k, dev)
        ps, packs = r.problems, r.packs
        quacks = [quack_w4a16(wc[0], wc[1], n, k) for wc in r.weights]
        prob = r.sm90_problem()
        pair = {"small-M": small.default(prob), "wgmma": wg.default(prob)}
        outs = {c: sm90_under(t)(ps[0], packs[0]).float() for c, t in pair.items()}
        diff = ((outs["wgmma"] - outs["small-M"]).abs().max() / outs["small-M"].abs().max()).item()
        cols = {c: (lambda t=t: r.time_sm90(sm90_under(t))) for c, t in pair.items()}
        if quacks[0] is not None:
            cols["quack"] = lambda: graph_time_us(lambda f, a: f(a), [(f, p.a) for f, p in zip(quacks, ps)])
        cols["bf16"] = r.time_bf16
        us = interleaved_medians(cols, 5)
        print(f"M={m} N={n} K={k}: " + "  ".join(f"{c} {v:.2f}" for c, v in us.items()) +
              f"  wgmma/small-M {us['wgmma'] / us['small-M']:.3f}  max rel diff {diff:.1e}  "
              f"[{pair['small-M'].label()} | {pair['wgmma'].label()}]", flush=True)
        del r, ps, packs, quacks
        torch.cuda.empty_cache()


if __name__ == "__main__":
    specs = sys.argv[1:] or [f"{m},{n},{k}" for n, k in ((8192, 28672), (28672, 8192), (8192, 8192))
                             for m in (4, 8, 12, 16)]
    main([tuple(int(v) for v in s.split(",")) for s in specs])
