"""Same-round timing of W4A16 and the W4A4 paths on bench mm's problems (CUDA-graph replays,
five interleaved rounds, medians; torch bf16 in the same rounds): FP4Linear's path (mm_fp4 with
quantize_a, "W4A4"), the two-launch path it replaced (fp4_quantized_values, then mm_fp4 on the
values, "values") and the codes path (nvfp4_quantize, then mm_fp4 on the FP4 codes and scales).
Row-major weights in those columns; on sm_90 also W4A16 and W4A4 with "sm90" weights (what
FP4Linear keeps there).

    python scripts/ab_w4a4_values.py 1,16,64,128 out.csv
"""
import sys

import torch
from torch_fp4 import ops
from torch_fp4.bench.mm import Problem, nvfp4_weight, SHAPES
from torch_fp4.bench.timing import same_round_medians, write_csv

dev = torch.device("cuda")
MS = [int(x) for x in sys.argv[1].split(",")]
rows = []
name = torch.cuda.get_device_name(dev)
print(name)
print(f"{'N':>6} {'K':>6} {'M':>5} | {'bf16':>7} | {'W4A16':>7} {'W4A4':>7} {'values':>7} {'codes':>7} | "
      f"{'A4/A16':>6} {'val/A16':>7} {'codes/A16':>9} | {'sm90 A16':>8} {'sm90 A4':>8} {'A4/A16':>6}", flush=True)
hopper = torch.cuda.get_device_capability(dev) == (9, 0)
for n, k in SHAPES:
    w = nvfp4_weight(n, k, dev)
    wb = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
    packed = ops.prepack_weight(w[0]) if hopper else None
    for m in MS:
        p = Problem(m, n, k, w, dev)
        cols = {"bf16": lambda p=p: torch.matmul(p.a, wb.T),
                "a16": p.w4a16, "a4": p.w4a4, "values": p.w4a4_values, "codes": p.w4a4_codes}
        if packed is not None:
            cols["a16_sm90"] = lambda p=p: p.w4a16_sm90(packed)
            cols["a4_sm90"] = lambda p=p: p.w4a4(packed)
        md = same_round_medians(cols)
        nan = float("nan")
        s16, s4 = md.get("a16_sm90", nan), md.get("a4_sm90", nan)
        rows.append(dict(gpu=name, n=n, k=k, m=m, **{c + "_us": v for c, v in md.items()},
                         a4_over_a16=md["a4"] / md["a16"], values_over_a16=md["values"] / md["a16"],
                         codes_over_a16=md["codes"] / md["a16"], sm90_a4_over_a16=s4 / s16))
        print(f"{n:>6} {k:>6} {m:>5} | {md['bf16']:7.1f} | {md['a16']:7.1f} {md['a4']:7.1f} {md['values']:7.1f} {md['codes']:7.1f} | "
              f"{md['a4']/md['a16']:6.3f} {md['values']/md['a16']:7.3f} {md['codes']/md['a16']:9.3f} | {s16:8.1f} {s4:8.1f} {s4/s16:6.3f}",
              flush=True)
    del w, wb, packed
    torch.cuda.empty_cache()
write_csv(sys.argv[2], rows)
