"""Command line: `python -m torch_fp4 demo [--device cpu|cuda] [--seed N]` and
`python -m torch_fp4 bench quantize [--quick] [--csv FILE] [--format nvfp4|mxfp4]`."""
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
    args = parser.parse_args(argv)
    if args.command == "demo":
        from . import demo as demo_mod
        demo_mod.run(args.device, args.seed)
    elif args.command == "bench":
        import torch
        if not torch.cuda.is_available():
            parser.error("bench needs a CUDA GPU")
        from .bench import quantize as bench_quantize
        bench_quantize.run(args.quick, args.csv, args.format, args.backends)
    return 0


if __name__ == "__main__":
    sys.exit(main())
