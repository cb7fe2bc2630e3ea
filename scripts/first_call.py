"""Seconds to the first result of each op in this (fresh) process, on the GPU: the cold-start cost a
serving process pays before `python -m torch_fp4 precompile` and after it.
`python scripts/first_call.py [N K] [E H I TOP_K]` (default 8192 8192, Mixtral-8x7B experts)."""
import sys
import time

t0 = time.perf_counter()
import torch  # noqa: E402

from torch_fp4 import precompile as P  # noqa: E402

dev = torch.device("cuda")
torch.zeros(1, device=dev)
print(f"import torch + torch_fp4 + CUDA context: {time.perf_counter() - t0:.2f} s", flush=True)
vals = [int(v) for v in sys.argv[1:]]
n, k = vals[:2] if len(vals) >= 2 else (8192, 8192)
moe = P.MoeShape(*vals[2:6]) if len(vals) >= 6 else P.MoeShape(8, 4096, 14336, 2)
steps = P._linear_steps(n, k, (1, 16, 64), dev) + P._moe_steps(moe, (1,), dev)
with torch.inference_mode():
    for what, step in steps:
        t = time.perf_counter()
        step()
        torch.cuda.synchronize()
        print(f"first {what}: {time.perf_counter() - t:.2f} s", flush=True)
