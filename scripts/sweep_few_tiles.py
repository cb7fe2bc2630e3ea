"""Every one-tile split-K launch of the Hopper GEMM where the weight tiles are few (N <= ~4600 at
K < 8192, mm_wgmma_tactics._few_tiles), beside `auto`'s tactic and torch bf16 over rotating
weights, on an sm_90 GPU:

    python scripts/sweep_few_tiles.py M[,M...] N K [N K ...] [--layout sm90|row]

Per problem: every block_m up to the smallest one covering M (256 above M = 128), one or two CTAs
per SM (block_m <= 64), split 2..8 (two K groups where the heuristic would take them: "sm90"
weights, block_m <= 64, one CTA per SM), each with as many stages as fit and at most two waves of
CTAs, timed once over rotating operands (time_tactics); then `auto`'s tactic. One line per
tactic: block_m, CTAs per SM, split, K groups, CTAs, clusters, us, x bf16."""
import argparse

import torch

from torch_fp4 import formats as F
from torch_fp4.bench.mm import TacticWeight
from torch_fp4.bench.tune import time_tactics
from torch_fp4.kernels._common import sm_count
from torch_fp4.kernels.cuda import mm_wgmma_tactics as WT
from torch_fp4.problems import MmProblem


def one_tile_launches(prob: MmProblem, sms: int) -> list:
    m, n = prob.m, prob.n
    top = next(b for b in WT.BLOCK_MS if b >= m) if m <= 128 else 256
    out = []
    for b in (b for b in WT.BLOCK_MS if b <= top):
        for c in ((1, 2) if b <= WT.TWO_CTA_MAX_BLOCK_M else (1,)):
            for s in range(2, WT.MAX_SPLIT + 1):
                if -(-m // b) * -(-n // WT.ROWS) * s > 2 * c * sms:
                    continue
                kg = 2 if prob.packed and b <= WT.K_GROUPS_MAX_BLOCK_M and c == 1 else 1
                st = WT.max_stages(b, WT.smem_limit(prob, c), False, kg, ctas_per_sm=c, packed=prob.packed)
                t = WT.WgmmaMmTactic(b, st, s, False, c, False, kg)
                if WT.why_not(t, prob) is None:
                    out.append(t)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ms")
    ap.add_argument("nk", nargs="+", type=int)
    ap.add_argument("--layout", choices=("row", "sm90"), default="sm90")
    opt = ap.parse_args()
    dev = torch.device("cuda")
    sms = sm_count(dev)
    for n, k in zip(opt.nk[::2], opt.nk[1::2]):
        wt = TacticWeight(n, k, dev, F.WeightLayout(opt.layout))
        for m in (int(v) for v in opt.ms.split(",")):
            p, args, prob = wt.problem(m)
            auto = WT.default(prob)
            cands = [auto] + [t for t in one_tile_launches(prob, sms) if t != auto]
            res = time_tactics(cands, wt.launch, args)
            bf16 = wt.bf16(p)()
            print(f"== M={m} N={n} K={k} {opt.layout} bf16 {bf16:.1f} us; default {auto.label()}", flush=True)
            for t, us in res:
                ctas = -(-m // t.block_m) * -(-n // WT.ROWS) * t.split_k
                print(f"{t.label():<100} ctas {ctas:4d} clusters {ctas // t.split_k:3d} {us:8.2f} us  x bf16 "
                      f"{bf16 / us:5.2f}{'  <- default' if t == auto else ''}", flush=True)
        del wt
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
