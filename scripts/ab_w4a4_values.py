"""Same-round timing of W4A16 and the two W4A4 paths on bench mm's problems (CUDA-graph replays,
five interleaved rounds, medians; torch bf16 in the same rounds): FP4Linear's path
(fp4_quantized_values, then mm_fp4 on the values) and the codes path (nvfp4_quantize, then mm_fp4
on the FP4 codes and scales). Row-major weights in every column.

    python scripts/ab_w4a4_values.py 1,16,64,128 out.csv
"""
import statistics
import sys

import torch
from torch_fp4 import ops
from torch_fp4.bench.mm import Problem, nvfp4_weight, SHAPES
from torch_fp4.bench.timing import graph_time_us, write_csv

dev = torch.device("cuda")
MS = [int(x) for x in sys.argv[1].split(",")]
ROUNDS = 5
rows = []
name = torch.cuda.get_device_name(dev)
print(name)
print(f"{'N':>6} {'K':>6} {'M':>5} | {'bf16':>7} {'values':>6} | {'W4A16':>7} {'W4A4':>7} {'codes':>7} | {'A4/A16':>6} {'codes/A16':>9} {'x bf16 A16':>10} {'x bf16 A4':>9}", flush=True)
for n, k in SHAPES:
    w = nvfp4_weight(n, k, dev)
    wb = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
    for m in MS:
        p = Problem(m, n, k, w, dev)
        cols = {"bf16": lambda p=p: torch.matmul(p.a, wb.T),
                "values": lambda p=p: ops.fp4_quantized_values(p.a, p.gs_a),
                "a16": p.w4a16, "a4": p.w4a4, "codes": p.w4a4_codes}
        for f in cols.values():
            f()
        torch.cuda.synchronize()
        res = {c: [] for c in cols}
        for _ in range(ROUNDS):
            for c, f in cols.items():
                res[c].append(graph_time_us(f, [()]))
        md = {c: statistics.median(v) for c, v in res.items()}
        rows.append(dict(gpu=name, n=n, k=k, m=m, **{c + "_us": v for c, v in md.items()},
                         a4_over_a16=md["a4"] / md["a16"], codes_over_a16=md["codes"] / md["a16"]))
        print(f"{n:>6} {k:>6} {m:>5} | {md['bf16']:7.1f} {md['values']:6.2f} | {md['a16']:7.1f} {md['a4']:7.1f} {md['codes']:7.1f} | "
              f"{md['a4']/md['a16']:6.3f} {md['codes']/md['a16']:9.3f} {md['bf16']/md['a16']:10.2f} {md['bf16']/md['a4']:9.2f}", flush=True)
    del w, wb
    torch.cuda.empty_cache()
write_csv(sys.argv[2], rows)
