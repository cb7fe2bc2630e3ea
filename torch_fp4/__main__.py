"""Command line: `python -m torch_fp4 demo [--device cpu|cuda] [--seed N]`."""
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
    args = parser.parse_args(argv)
    if args.command == "demo":
        from . import demo as demo_mod
        demo_mod.run(args.device, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
