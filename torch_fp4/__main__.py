"""Command line: `python -m torch_fp4 demo [--device cpu|cuda] [--seed N]` and
`python -m torch_fp4 bench quantize [--quick] [--csv FILE] [--format nvfp4|mxfp4]` and
`python -m torch_fp4 bench mm [--quick] [--csv FILE] [--tune] [--tactics [--m M --n N --k K]]`."""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torch_fp4",
                                     description="torch_fp4: NVFP4/MXFP4 ops for PyTorch")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="quantize a small random transformer block and MoE to FP4 "
                                       "and compare with bf16")
    demo.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    demo.add_argument("--seed", type=int, default=0)
    bench = sub.add_parser("bench", help="GPU benchmarks against peers measured in the same run")
    bench_sub = bench.add_subparsers(dest="what", required=True)
    bq = bench_sub.add_parser("quantize", help="FP4 quantization vs copy bandwidth and "
                                               "torch.compile of the reference")
    bq.add_argument("--quick", action="store_true", help="a 3x3 subset of the shape grid")
    bq.add_argument("--csv", default=None, help="write every measurement to this CSV file")
    bq.add_argument("--format", default="nvfp4", choices=["nvfp4", "mxfp4"])
    bq.add_argument("--backends", nargs="*", default=None, help="triton cute-dsl cuda (default: all)")
    bm = bench_sub.add_parser("mm", help="FP4 GEMM on Llama-3.1-70B shapes vs torch bf16 matmul "
                                         "and fp8 _scaled_mm")
    bm.add_argument("--quick", action="store_true", help="M in {1, 16, 128, 2048} only")
    bm.add_argument("--csv", default=None, help="write every measurement to this CSV file")
    bm.add_argument("--tune", action="store_true", help="autotune each problem first "
                                                        "(torch_fp4.autotune; fills the tactic cache)")
    bm.add_argument("--tactics", action="store_true", help="time every tactic of one problem")
    bm.add_argument("--m", type=int, default=16)
    bm.add_argument("--n", type=int, default=8192)
    bm.add_argument("--k", type=int, default=28672)
    bm.add_argument("--mode", default="w4a16", choices=["w4a16", "w4a4"])
    args = parser.parse_args(argv)
    if args.command == "demo":
        from . import demo as demo_mod
        demo_mod.run(args.device, args.seed)
    elif args.command == "bench":
        import torch
        if not torch.cuda.is_available():
            parser.error("bench needs a CUDA GPU")
        if args.what == "quantize":
            from .bench import quantize as bench_quantize
            bench_quantize.run(args.quick, args.csv, args.format, args.backends)
        elif args.tactics:
            from .bench import mm as bench_mm
            bench_mm.run_tactics(args.m, args.n, args.k, args.csv, args.mode)
        else:
            from .bench import mm as bench_mm
            bench_mm.run(args.quick, args.csv, args.tune)
    return 0


if __name__ == "__main__":
    sys.exit(main())
