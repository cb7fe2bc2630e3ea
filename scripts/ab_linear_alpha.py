"""Same-round device time of FP4Linear's forward with alpha formed inside mm_fp4 (b_global_scale,
what FP4Linear does now) and with alpha computed by torch ops before mm_fp4 (what it did before:
one launch for W4A16, two for W4A4), beside torch bf16 `F.linear` and the bare mm_fp4 with a
precomputed alpha (CUDA-graph replays, five interleaved rounds, medians; bench mm's NVFP4
weights, in FP4Linear's preferred layout; W4A4 with a fixed input scale).

    python scripts/ab_linear_alpha.py 1,16,64,128 out.csv
"""
import sys

import torch
import torch.nn.functional as TF

from torch_fp4 import formats as F
from torch_fp4 import ops
from torch_fp4.bench.mm import SHAPES, nvfp4_weight
from torch_fp4.bench.timing import same_round_medians, write_csv
from torch_fp4.nn import FP4Linear

dev = torch.device("cuda")
MS = [int(x) for x in sys.argv[1].split(",")]
rows = []
name = torch.cuda.get_device_name(dev)
print(name)
head = ["bf16", "op", "a16_old", "a16_new", "a4_old", "a4_new"]
print(f"{'N':>6} {'K':>6} {'M':>5} | " + " ".join(f"{h:>8}" for h in head)
      + f" | {'old/new A16':>11} {'old/new A4':>10} {'A4/A16 new':>10} {'A4/A16 old':>10}", flush=True)
for n, k in SHAPES:
    data, scale, _ = nvfp4_weight(n, k, dev)
    gs_w = torch.full((1,), 1.7, device=dev)
    gs_a = torch.full((1,), 448.0 * 6 / 4.0, device=dev)
    lin16 = FP4Linear(k, n, bias=False, device=dev)
    lin16.set_quantized(data, scale, gs_w)
    lin4 = FP4Linear(k, n, bias=False, activations="fp4", device=dev)
    lin4.set_quantized(data, scale, gs_w, gs_a)
    wb = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
    alpha16 = F.nvfp4_alpha(None, gs_w)
    w, layout = lin16.weight, lin16.weight_layout
    for m in MS:
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)

        def a16_old(x=x):   # FP4Linear's W4A16 forward before: alpha by a torch launch, then mm_fp4
            return ops.mm_fp4(x, w.T, None, scale.T, F.nvfp4_alpha(None, gs_w), weight_layout=layout)

        def a4_old(x=x):    # and its W4A4 forward: alpha by two torch launches
            return ops.mm_fp4(x, w.T, None, scale.T, F.nvfp4_alpha(gs_a, gs_w), weight_layout=layout,
                              quantize_a=True, a_global_scale=gs_a)

        cols = {"bf16": lambda x=x: TF.linear(x, wb),
                "op": lambda x=x: ops.mm_fp4(x, w.T, None, scale.T, alpha16, weight_layout=layout),
                "a16_old": a16_old, "a16_new": lambda x=x: lin16(x),
                "a4_old": a4_old, "a4_new": lambda x=x: lin4(x)}
        want16, want4 = a16_old(), a4_old()
        assert torch.equal(lin16(x), want16) and torch.equal(lin4(x), want4), "bits differ"
        md = same_round_medians(cols)
        rows.append(dict(gpu=name, n=n, k=k, m=m, layout=layout, **{c + "_us": v for c, v in md.items()},
                         a16_old_over_new=md["a16_old"] / md["a16_new"], a4_old_over_new=md["a4_old"] / md["a4_new"],
                         a4_over_a16_new=md["a4_new"] / md["a16_new"], a4_over_a16_old=md["a4_old"] / md["a16_old"]))
        print(f"{n:>6} {k:>6} {m:>5} | " + " ".join(f"{md[h]:8.1f}" for h in head)
              + f" | {md['a16_old'] / md['a16_new']:11.3f} {md['a4_old'] / md['a4_new']:10.3f}"
              f" {md['a4_new'] / md['a16_new']:10.3f} {md['a4_old'] / md['a16_old']:10.3f}", flush=True)
    del data, scale, lin16, lin4, wb
    torch.cuda.empty_cache()
write_csv(sys.argv[2], rows)
