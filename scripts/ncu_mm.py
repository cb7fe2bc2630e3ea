"""One mm_fp4 call (W4A16, NVFP4, heuristic tactic) for profiling: `ncu -k regex:_mm_kernel
python scripts/ncu_mm.py M N K [wgmma | wgmma=BLOCK_M,STAGES,SPLIT_K[,PERSISTENT[,CTAS_PER_SM[,STREAM_K[,K_GROUPS]]]]]
[sm90] [w4a4]`
(wgmma: the Hopper GEMM for any M > 16; with values: that tactic; sm90: weights prepacked; w4a4:
the activations quantized to NVFP4 beforehand, so only the GEMM runs)."""
import contextlib
import sys

import torch

import torch_fp4
import torch_fp4.tuning as tuning
from torch_fp4.bench.mm import Problem, nvfp4_weight

m, n, k = (int(v) for v in sys.argv[1:4])
from torch_fp4 import tactics
from torch_fp4.kernels.cuda.mm_wgmma_tactics import WgmmaMmTactic

forced = contextlib.nullcontext()
for arg in sys.argv[4:]:
    if arg.startswith("wgmma"):
        tuning.HOPPER_MM_MS = (17, 1 << 30)
    if arg.startswith("wgmma="):
        v = [int(x) for x in arg[6:].split(",")]
        fields = dict(zip(("persistent", "ctas_per_sm", "stream_k", "k_groups"), v[3:]))
        for flag in ("persistent", "stream_k"):
            if flag in fields:
                fields[flag] = bool(fields[flag])
        forced = tactics.use_tactic(WgmmaMmTactic(*v[:3], **fields))
dev = torch.device("cuda")
p = Problem(m, n, k, nvfp4_weight(n, k, dev), dev)
packed = torch_fp4.prepack_weight(p.w_data) if "sm90" in sys.argv[4:] else None
w = p.w_data if packed is None else packed
q, s = torch_fp4.nvfp4_quantize(p.a, p.gs_a) if "w4a4" in sys.argv[4:] else (p.a, None)
with forced:
    for _ in range(2):
        torch_fp4.mm_fp4(q, w.T, s, p.w_scale.T, p.alpha, weight_layout="row" if packed is None else "sm90")
torch.cuda.synchronize()
