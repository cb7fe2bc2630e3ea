"""One call of a W4A16 GEMM under the profiler, after three warm-up calls (ncu --profile-from-start off):
python scripts/ncu_one_call.py {ours,quack,bf16} M N K
ours: mm_fp4 on "sm90" NVFP4 weights, auto's tactic; quack: quack.gemm_w4.gemm_w4a16 on the same weights
(quack-kernels installed); bf16: torch.matmul on a bf16 weight of the same shape. For example:
ncu --clock-control none --profile-from-start off --section SpeedOfLight --section LaunchStats \\
    --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_bytes.sum \\
    python scripts/ncu_one_call.py ours 256 28672 8192"""
import sys

import torch

from torch_fp4 import ops
from torch_fp4.bench.mm import Problem, nvfp4_weight, quack_w4a16

which, m, n, k = sys.argv[1], *(int(v) for v in sys.argv[2:5])
dev = torch.device("cuda")
w = nvfp4_weight(n, k, dev)
p = Problem(m, n, k, w, dev)
if which == "ours":
    packed = ops.prepack_weight(w[0])
    call = lambda: ops.mm_fp4(p.a, packed.T, None, p.w_scale.T, p.alpha, weight_layout="sm90")
elif which == "quack":
    gemm = quack_w4a16(w[0], w[1], n, k)
    if gemm is None:
        raise SystemExit("ncu_one_call: quack-kernels is not installed (or cannot run this shape)")
    call = lambda: gemm(p.a)
elif which == "bf16":
    w16 = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
    call = lambda: torch.matmul(p.a, w16.T)
else:
    raise SystemExit(f"ncu_one_call: which must be ours, quack or bf16, got {which!r}")
for _ in range(3):
    call()
torch.cuda.synchronize()
torch.cuda.profiler.start()
call()
torch.cuda.synchronize()
torch.cuda.profiler.stop()
