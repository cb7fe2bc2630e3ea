"""One call of a W4A16 GEMM under the profiler, after three warm-up calls (ncu --profile-from-start off):

    python scripts/ncu_one_call.py {ours,quack,bf16} M N K [--layout sm90|row] [--format nvfp4|mxfp4]
        [--act bf16|fp16] [--lib NAME=PATH]

ours: mm_fp4 (cuda backend, auto's tactic) on NVFP4 weights prepacked to "sm90" (--layout row: row-major;
--format mxfp4: MXFP4 weights; --act fp16: fp16 activations and output); --lib runs that built copy
of one cuda kernel library in place of this tree's (for example a timing variant built from other
sources: the library that serves the call, e.g. wgmma1_1 for block_m >= 128 on bf16 activations and
"sm90" NVFP4 weights, torch_fp4/kernels/cuda/build.py). quack: quack.gemm_w4.gemm_w4a16 on the same
NVFP4 weights (quack-kernels installed); bf16: torch.matmul on a bf16 weight of the same shape.
For example:

    ncu --profile-from-start off --section SpeedOfLight --section LaunchStats \\
        --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_bytes.sum \\
        python scripts/ncu_one_call.py ours 256 28672 8192"""
import argparse

import torch

import torch_fp4 as t4
from torch_fp4.bench.mm import Problem, nvfp4_weight, quack_w4a16


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("which", choices=("ours", "quack", "bf16"))
    for dim in ("m", "n", "k"):
        ap.add_argument(dim, type=int)
    ap.add_argument("--layout", choices=("sm90", "row"), default="sm90")
    ap.add_argument("--format", choices=("nvfp4", "mxfp4"), default="nvfp4")
    ap.add_argument("--act", choices=("bf16", "fp16"), default="bf16")
    ap.add_argument("--lib", help="NAME=PATH: this build of cuda library NAME")
    args = ap.parse_args()
    if args.which != "ours" and (args.layout, args.format) != ("sm90", "nvfp4"):
        ap.error(f"--layout and --format apply to ours only, got {args.which} with --layout {args.layout} "
                 f"--format {args.format}")
    m, n, k = args.m, args.n, args.k
    dev = torch.device("cuda")
    if args.lib:
        from torch_fp4.kernels.cuda import native
        name, path = args.lib.split("=", 1)
        native._LOADED[(dev.index or 0, name)] = native.Library(name, path)
    dtype = torch.float16 if args.act == "fp16" else torch.bfloat16
    if args.which == "ours":
        a = torch.randn(m, k, device=dev, dtype=dtype)
        if args.format == "mxfp4":
            w, ws = t4.mxfp4_quantize(torch.randn(n, k, device=dev, dtype=torch.bfloat16))
            alpha, block = None, 32
        else:
            w, ws, _ = nvfp4_weight(n, k, dev)
            alpha, block = torch.ones(1, device=dev), 16
        if args.layout == "sm90":
            w = t4.prepack_weight(w)
        call = lambda: t4.mm_fp4(a, w.T, None, ws.T, alpha, dtype, block, backend="cuda", weight_layout=args.layout)
    elif args.which == "quack":
        w = nvfp4_weight(n, k, dev)
        p = Problem(m, n, k, w, dev)
        gemm = quack_w4a16(w[0], w[1], n, k)
        if gemm is None:
            raise SystemExit("ncu_one_call: quack-kernels is not installed (or cannot run this shape)")
        call = lambda: gemm(p.a)
    else:
        a = torch.randn(m, k, device=dev, dtype=dtype)
        w16 = torch.randn(n, k, device=dev, dtype=dtype)
        call = lambda: torch.matmul(a, w16.T)
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    call()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
