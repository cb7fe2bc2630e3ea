"""The Hopper GEMM ("sm90" weights, auto's tactic) and quack's W4A16 GEMM with one weight set and with
three rotated between calls (as a model's layers rotate), and ours without stream-K where auto takes
it: python scripts/mm_weight_rotation.py (sm_90 GPU, quack-kernels installed). Interleaved rounds,
min of three, one graph-replay timer; 28672 x 8192 at M = 256 and 128, 8192 x 28672 at M = 128."""
import dataclasses
import torch
from torch_fp4 import ops, tactics
from torch_fp4 import formats as F
from torch_fp4.bench.mm import Problem, nvfp4_weight, quack_w4a16
from torch_fp4.bench.timing import graph_time_us
from torch_fp4.kernels.cuda import mm_wgmma_tactics as WT
from torch_fp4.problems import MmProblem
dev = torch.device("cuda")
for n, k, m in ((28672, 8192, 256), (28672, 8192, 128), (8192, 28672, 128)):
    ws = [nvfp4_weight(n, k, dev, seed=s) for s in range(3)]
    pks = [ops.prepack_weight(w[0]) for w in ws]
    qs = [quack_w4a16(w[0], w[1], n, k) for w in ws]
    p = Problem(m, n, k, ws[0], dev)
    args = (p.a, pks[0].T, None, p.w_scale.T, p.alpha)
    prob = MmProblem.of(*args, torch.bfloat16, F.NVFP4, F.SfLayout.LAYOUT_128x4, F.WeightLayout.SM90)
    t = WT.default(prob)

    def ours(i):
        return ops.mm_fp4(p.a, pks[i].T, None, ws[i][1].T, p.alpha, weight_layout="sm90")

    def quack(i):
        return qs[i](p.a)
    one, three = [(0,)], [(0,), (1,), (2,)]
    cols = {"ours": (ours, one), "ours rot3": (ours, three), "quack": (quack, one), "quack rot3": (quack, three)}
    if t.stream_k:
        t0 = dataclasses.replace(t, stream_k=False)

        def no_sk(i):
            with tactics.use_tactic(t0):
                return ours(i)
        cols["ours no-sk"] = (no_sk, one)
    res = {c: [] for c in cols}
    for _ in range(3):
        for c, (fn, inputs) in cols.items():
            res[c].append(graph_time_us(fn, inputs))
    print(f"{n}x{k} M={m} {t.label()}: " + "  ".join(f"{c} {min(v):.1f}" for c, v in res.items()), flush=True)
