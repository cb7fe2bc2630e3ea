"""The small-M GEMM's 128-row CTAs of two tiles per warp for "sm90" and row-major weights whose
128-row tiles do not fill a wave (mm_tactics._two_tile_ctas) against the tactic each rule
replaced, on an sm_90 GPU:

    python scripts/ab_small_m_two_tile.py [CSV] [--rule long_k|one_wave|row_few] [--shapes N,K;N,K] [--ms 1,8,16]
        [--layout sm90|row]

--rule long_k (default): at most SMs / 4 tiles at K >= 8192, against the 64-row CTAs;
--rule one_wave: SMs / 4 up to SMs tiles, against the 8-warp CTAs of one 128-row tile;
--rule row_few (with --layout row): SMs / 9 up to SMs / 4 tiles at any K, against the CTAs of one 128-row tile.
Per problem: both tactics and torch bf16 over rotating operands, medians of five interleaved rounds
(bench.tune.interleaved_rounds), and both tactics' outputs compared bit for bit on grid-exact data
(both exact there)."""
import argparse
from unittest import mock

import torch

from torch_fp4 import formats as F
from torch_fp4.bench.mm import TacticWeight, ab_line
from torch_fp4.bench.timing import write_csv
from torch_fp4.kernels.cuda import mm_tactics as MT

RULES = {  # the rule's switch, off
    "long_k": ("LONG_K", 1 << 62, "4096,14336;4096,8192;3072,8192;3584,18944;4096,28672"),
    "row_few": ("ROW_MIN_TILES_SHARE", 0, "4096,4096;3072,4096;2048,4096;2048,8192;1024,8192;1024,4096"),
    "one_wave": ("ONE_WAVE_TILES", 0.0, "10240,8192;14336,8192;14336,4096;12288,4096;9216,4096;16384,4096;"
                 "6144,4096;4608,4096;5120,5120;13824,5120;5120,8192;7168,8192;8192,8192;8192,28672"),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv", nargs="?")
    ap.add_argument("--rule", choices=sorted(RULES), default="long_k")
    ap.add_argument("--shapes")
    ap.add_argument("--ms", default="1,8,16")
    ap.add_argument("--layout", choices=("sm90", "row"), default="sm90")
    opt = ap.parse_args()
    switch, off, shapes = RULES[opt.rule]
    dev, rows = torch.device("cuda"), []
    for shape in (opt.shapes or shapes).split(";"):
        n, k = map(int, shape.split(","))
        wt = TacticWeight(n, k, dev, F.WeightLayout(opt.layout))
        for m in map(int, opt.ms.split(",")):
            _, _, prob = wt.problem(m)
            new = MT.default(prob)
            with mock.patch.object(MT, switch, off):
                old = MT.default(prob)
            if old == new:
                print(f"M={m:2d} N={n:5d} K={k:5d} unchanged: {new.label()}", flush=True)
                continue
            rows.append(wt.ab(m, old, new))
            print(f"{ab_line(rows[-1])}  {old.label()[16:]} -> {new.label()[16:]}", flush=True)
    write_csv(opt.csv, rows)


if __name__ == "__main__":
    main()
