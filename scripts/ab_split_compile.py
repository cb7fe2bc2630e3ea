"""Kernel times of the cuda libraries built with nvcc's --split-compile=THREADS (0: without), on an
sm_90 GPU: python scripts/ab_split_compile.py TAG THREADS. Times `auto` mm_fp4 W4A16 ("sm90" NVFP4
weights, N = K = 8192 and 4096, M = 1-128) and fused_moe W4A16 on the cuda backend (Mixtral-8x7B
experts, T = 1, 4, 16) and prints one line starting with TAG. Each THREADS value builds its own
libraries (the flags are part of the cache folder's hash); run the values in turn to compare."""
import sys
import torch_fp4.kernels.cuda.build as B
B.SPLIT_COMPILE = int(sys.argv[2])
import torch
from torch_fp4 import ops
from torch_fp4.bench.mm import Problem, nvfp4_weight
from torch_fp4.bench.timing import graph_time_us
from torch_fp4.bench import moe as BM
tag = sys.argv[1]
dev = torch.device("cuda")
out = []
for n, k in ((8192, 8192), (4096, 4096)):
    w = nvfp4_weight(n, k, dev)
    pk = ops.prepack_weight(w[0])
    for m in (1, 16, 32, 64, 128):
        p = Problem(m, n, k, w, dev)
        f = lambda: ops.mm_fp4(p.a, pk.T, None, p.w_scale.T, p.alpha, weight_layout="sm90")
        out.append(f"mm{m}/{n}:{graph_time_us(f, [()]):.2f}")
gen = torch.Generator(device=dev); gen.manual_seed(0)
mdl = BM.MODELS[0]
w1, w2, _, _, _ = BM.routed_batch(mdl, mdl.experts, 1, dev, gen)
for t in (1, 4, 16):
    x = torch.randn(t, mdl.hidden, device=dev, dtype=torch.bfloat16, generator=gen)
    ids, tw = ops.route(torch.randn(t, mdl.experts, device=dev, generator=gen), mdl.top_k, mdl.method, **mdl.route_kw)
    g = lambda: ops.fused_moe(x, *w1, *w2, ids, tw, backend="cuda")
    out.append(f"moe{t}:{graph_time_us(g, [()]):.2f}")
print(tag, " ".join(out), flush=True)
