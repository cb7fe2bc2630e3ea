"""The Hopper GEMM at each block_m from 128 up, the rest of the tactic as `auto` derives it for that
block_m (split-K, persistent, stream-K, stages), beside torch bf16 in one process ("sm90" NVFP4
weights, rotating operands, medians of interleaved rounds): which tile size wins at each M.

    python scripts/sweep_block_m.py N K M[,M...] [--bms 128,160,192,224,256] [--rounds 3]   (sm_90 GPU)

A block_m whose tactic takes another block_m (mm_wgmma_tactics._few_tiles) is left out."""
import argparse
import dataclasses

import torch

from torch_fp4.bench.mm import rotated, sm90_under
from torch_fp4.bench.timing import interleaved_medians
from torch_fp4.kernels.cuda import mm_wgmma_tactics as WT

ap = argparse.ArgumentParser()
ap.add_argument("n", type=int)
ap.add_argument("k", type=int)
ap.add_argument("ms")
ap.add_argument("--bms", default=",".join(str(b) for b in WT.BLOCK_MS if b >= 128))
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--stream-k", action="store_true",
                help="also each persistent tactic with stream-K on (column '<block_m>sk') where it is off")
opt = ap.parse_args()
dev = torch.device("cuda")
bms = [int(b) for b in opt.bms.split(",")]
print(f"N={opt.n} K={opt.k}: us per block_m (x bf16); 'auto' is the heuristic's tactic", flush=True)
for m in (int(v) for v in opt.ms.split(",")):
    r = rotated(m, opt.n, opt.k, dev)
    problem = r.sm90_problem()
    chosen = {str(bm): t for bm in bms for t in [WT._tactic_for(problem, bm)]
              if t.block_m == bm and WT.why_not(t, problem) is None}
    if opt.stream_k:
        chosen.update({f"{c}sk": dataclasses.replace(t, stream_k=True) for c, t in list(chosen.items())
                       if t.persistent and not t.stream_k})
    auto = WT.default(problem)
    cols = {c: (lambda t=t: r.time_sm90(sm90_under(t))) for c, t in chosen.items()}
    cols["bf16"] = r.time_bf16
    us = interleaved_medians(cols, opt.rounds)
    best = min((c for c in us if c != "bf16"), key=us.get)
    print(f"M={m:5d} bf16 {us['bf16']:7.1f} | " +
          "  ".join(f"{c}: {v:7.1f} ({us['bf16'] / v:4.2f})" for c, v in us.items() if c != "bf16") +
          f" | best {best} x bf16 {us['bf16'] / us[best]:.2f}; auto {auto.label()}; " +
          "; ".join(f"{c}={t.label()}" for c, t in chosen.items()), flush=True)
    del r
    torch.cuda.empty_cache()
