"""Every small-M tactic at decode sizes (M = 1, 8, 16) on "sm90" and row-major weights, with 2 to 6
stages (the tactic space offers 2-4), beside `auto`'s choice, the Hopper GEMM's heuristic and torch
bf16, against the copy bandwidth of the same run, on an sm_90 GPU:

    python scripts/sweep_small_m_decode.py [CSV] [--shapes N,K;N,K] [--ms 1,8,16] [--layouts sm90,row]
        [--stages 2,3,4,5,6] [--max-waves 2]

Per problem: every tactic (of those stage counts, at most max-waves x 132 CTAs) timed once over rotating operands (time_tactics), then the five fastest,
`auto`'s tactic and the Hopper GEMM's heuristic in three interleaved rounds with bf16 (medians);
`floor` = (FP4 weight + scale bytes) / copy bandwidth / time (1.0: the weights stream at copy
speed). The fastest and `auto`'s outputs are compared bit for bit on grid-exact data."""
import argparse
import itertools
import statistics

import torch

from torch_fp4 import formats as F
from torch_fp4.bench.mm import TacticWeight
from torch_fp4.bench.timing import copy_bandwidth_gbs, write_csv
from torch_fp4.bench.tune import interleaved_rounds, time_tactics
from torch_fp4.kernels.cuda import mm_space, mm_tactics as MT, mm_wgmma_tactics as WT
from torch_fp4.problems import MmProblem

SHAPES = "8192,28672;28672,8192;8192,8192;4096,14336;14336,4096"


def every_small_m(prob: MmProblem, stages=MT.STAGES, max_waves: float = 2.0) -> list:
    """Every small-M tactic with these stage counts whose CTAs number at most max_waves x 132."""
    out = []
    for (warps, tiles, bk), st, split in itertools.product(MT.TILE_SHAPES, stages, range(1, MT.MAX_SPLIT + 1)):
        t = MT.CudaMmTactic(warps, tiles, bk, st, split)
        if MT.why_not(t, prob) is None and -(-prob.n // t.block_n) * split <= max_waves * 132:
            out.append(t)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv", nargs="?")
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--ms", default="1,8,16")
    ap.add_argument("--layouts", default="sm90,row")
    ap.add_argument("--stages", default=",".join(map(str, MT.STAGES)))
    ap.add_argument("--max-waves", type=float, default=2.0, help="CTAs per tactic, in waves of 132")
    args_ = ap.parse_args()
    dev, rows = torch.device("cuda"), []
    copy = copy_bandwidth_gbs(dev)
    print(f"copy bandwidth {copy:.0f} GB/s", flush=True)
    for shape in args_.shapes.split(";"):
        n, k = map(int, shape.split(","))
        for layout in args_.layouts.split(","):
            wt = TacticWeight(n, k, dev, F.WeightLayout(layout))
            launch = wt.launch
            for m in map(int, args_.ms.split(",")):
                p, args, prob = wt.problem(m)
                auto = mm_space.default(prob)
                small = every_small_m(prob, tuple(map(int, args_.stages.split(","))), args_.max_waves)
                timed = sorted(time_tactics(small, launch, args), key=lambda r: r[1])
                compared = list(dict.fromkeys([t for t, _ in timed[:5]] + [auto] + (
                    [WT.default(prob)] if WT.problem_reason(prob) is None else [])))
                times, bf16 = interleaved_rounds(compared, launch, args, 3, wt.bf16(p))
                med = {t: statistics.median(v) for t, v in times.items() if v}
                best = min((t for t in med if isinstance(t, MT.CudaMmTactic)), key=med.get)
                bf = statistics.median(bf16)
                wbytes = n * k // 2 + n * k // 16
                exact = wt.exact_args(m)
                same = torch.equal(launch(*exact, tactic=best), launch(*exact, tactic=auto))
                print(f"{layout:4s} M={m:2d} N={n:5d} K={k:5d} bf16 {bf:6.1f}  auto {med[auto]:6.1f} "
                      f"(floor {wbytes / copy / 1e3 / med[auto]:.2f}, {auto.label()})", flush=True)
                for t in sorted(med, key=med.get):
                    us = med[t]
                    print(f"    {us:7.2f} us  x bf16 {bf / us:.2f}  floor {wbytes / copy / 1e3 / us:.2f}  {t.label()}")
                    rows.append(dict(layout=layout, m=m, n=n, k=k, tactic=t.label(), rounds=3, us=round(us, 2),
                                     bf16_us=round(bf, 2), floor=round(wbytes / copy / 1e3 / us, 3),
                                     auto=t == auto, best=t == best, same_bits_best_auto=same, copy_gbs=round(copy)))
                print(f"    best vs auto bits {'same' if same else 'DIFFER'}; once-timed top 10: " +
                      ", ".join(f"{us:.1f}" for _, us in timed[:10]), flush=True)
                for t, us in timed:
                    rows.append(dict(layout=layout, m=m, n=n, k=k, tactic=t.label(), rounds=1, us=round(us, 2),
                                     bf16_us="", floor=round(wbytes / copy / 1e3 / us, 3), auto=t == auto,
                                     best="", same_bits_best_auto="", copy_gbs=round(copy)))
    write_csv(args_.csv, rows)


if __name__ == "__main__":
    main()
