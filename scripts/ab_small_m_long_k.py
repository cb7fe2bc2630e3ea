"""The small-M GEMM's tactic for "sm90" weights with few 128-row tiles at long K
(mm_tactics._long_k_few_tiles) against the 64-row CTAs it replaced, on an sm_90 GPU:

    python scripts/ab_small_m_long_k.py [CSV]

Per problem: both tactics and torch bf16 over rotating operands, medians of five interleaved rounds
(bench.tune.interleaved_rounds), and both tactics' outputs compared bit for bit on grid-exact data
(both exact there)."""
import statistics
import sys
from unittest import mock

import torch

from torch_fp4.bench.mm import TacticWeight
from torch_fp4.bench.timing import write_csv
from torch_fp4.bench.tune import interleaved_rounds
from torch_fp4.kernels.cuda import mm_tactics as MT

SHAPES = ((4096, 14336), (4096, 8192), (3072, 8192), (3584, 18944), (4096, 28672))
MS = (1, 8, 16)


def main(csv=None):
    dev, rows = torch.device("cuda"), []
    for n, k in SHAPES:
        wt = TacticWeight(n, k, dev)
        for m in MS:
            p, args, prob = wt.problem(m)
            new = MT.default(prob)
            with mock.patch.object(MT, "LONG_K", 1 << 62):
                old = MT.default(prob)
            times, bf16 = interleaved_rounds([old, new], wt.launch, args, 5, wt.bf16(p))
            o, nw, b = (statistics.median(v) for v in (times[old], times[new], bf16))
            exact = wt.exact_args(m)
            same = torch.equal(wt.launch(*exact, tactic=old), wt.launch(*exact, tactic=new))
            rows.append(dict(m=m, n=n, k=k, bf16_us=round(b, 2), old_us=round(o, 2), new_us=round(nw, 2),
                             new_over_old=round(nw / o, 4), same_bits_exact=same, old=old.label(), new=new.label()))
            print(f"M={m:2d} N={n:5d} K={k:5d} bf16 {b:6.1f}  old {o:6.2f} (x{b / o:.2f})  new {nw:6.2f} "
                  f"(x{b / nw:.2f})  new/old {nw / o:.3f}  exact bits {'same' if same else 'DIFFER'}  "
                  f"{old.label()[16:]} -> {new.label()[16:]}", flush=True)
    write_csv(csv, rows)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
