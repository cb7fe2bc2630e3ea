"""The small-M GEMM on "sm90" weights at M = 17-32 (compiled up to mm_tactics.PACKED_MAX_M) against
the Hopper GEMM's heuristic tactic, with `auto`'s choice (mm_space.default) and torch bf16 in the
same rounds, on an sm_90 GPU:

    python scripts/sweep_small_m_sm90.py [CSV]

Per problem: every small-M candidate timed once (time_tactics), then the fastest of them, the
Hopper GEMM's heuristic and `auto`'s tactic in three interleaved rounds (medians); the outputs of
the fastest and the Hopper GEMM compared bit for bit on grid-exact data (both exact there)."""
import statistics
import sys

import torch

from torch_fp4.bench.mm import TacticWeight
from torch_fp4.bench.timing import write_csv
from torch_fp4.bench.tune import interleaved_rounds, time_tactics
from torch_fp4.kernels.cuda import mm_space, mm_tactics as MT, mm_wgmma_tactics as WT

SHAPES = ((4096, 4096), (2048, 4096), (1024, 4096), (4096, 14336), (6144, 4096), (8192, 8192), (28672, 8192))
MS = (17, 24, 32)


def main(csv=None):
    dev, rows = torch.device("cuda"), []
    for n, k in SHAPES:
        wt = TacticWeight(n, k, dev)
        launch = wt.launch
        for m in MS:
            p, args, prob = wt.problem(m)
            auto, hopper = mm_space.default(prob), WT.default(prob)
            small = [t for t in mm_space.candidates(prob) if isinstance(t, MT.CudaMmTactic)]
            best = min(time_tactics(small, launch, args), key=lambda r: r[1])[0]
            compared = list(dict.fromkeys([hopper, best, auto]))
            times, bf16 = interleaved_rounds(compared, launch, args, 3, wt.bf16(p))
            h, s, a, b = (statistics.median(v) for v in (times[hopper], times[best], times[auto], bf16))
            exact = wt.exact_args(m)
            same = torch.equal(launch(*exact, tactic=hopper), launch(*exact, tactic=best))
            rows.append(dict(m=m, n=n, k=k, bf16_us=round(b, 2), hopper_us=round(h, 2), small_m_us=round(s, 2),
                             auto_us=round(a, 2), same_bits=same, hopper=hopper.label(), small_m=best.label(),
                             auto=auto.label()))
            print(f"M={m:3d} N={n:5d} K={k:5d} bf16 {b:6.1f}  hopper {h:6.1f} (x{b / h:.2f})  best small-M "
                  f"{s:6.1f} (x{b / s:.2f})  auto {a:6.1f} (x{b / a:.2f})  bits {'same' if same else 'DIFFER'}  "
                  f"{best.label()[16:]}  auto {auto.family}", flush=True)
    write_csv(csv, rows)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
