"""A heuristic change of the cuda backend's mm_fp4 tactics against the rule it replaced, in one
process, on an sm_90 GPU:

    python scripts/ab_tactic_rule.py BASE_FILE FUNCTION[,FUNCTION...] [CSV] [--module mm_wgmma_tactics]
        [--shapes N,K;N,K] [--ms 32,64,128] [--layout sm90|row] [--rounds 5] [--plan]

BASE_FILE is the tactic module as it was before (e.g. `git show HEAD~1:torch_fp4/kernels/cuda/
mm_wgmma_tactics.py > base.py`); each FUNCTION (e.g. _few_tiles) is taken from it and run inside
the current module in place of today's, which gives the old tactic of each problem. Per problem where
the two tactics differ: both and torch bf16 over rotating operands (bench.mm.bf16_timer), medians
of interleaved rounds (bench.tune.interleaved_rounds), and both outputs compared bit for bit on
grid-exact data (both exact there). --plan lists the problems whose tactic changes without timing
them (no GPU needed)."""
import argparse
import ast
import contextlib
import importlib
from unittest import mock

import torch

from torch_fp4 import formats as F
from torch_fp4.bench.mm import meta_problem, parse_shapes


def base_functions(path: str, names: list[str], module) -> dict:
    """Functions `names` as defined in the file `path`, compiled together in (a copy of) `module`'s
    namespace, so that each calls the others' old forms."""
    tree = ast.parse(open(path).read())
    nodes = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names}
    missing = [n for n in names if n not in nodes]
    if missing:
        raise SystemExit(f"ab_tactic_rule: no function {missing[0]!r} in {path}")
    scope = dict(vars(module))
    exec(compile(ast.Module(body=list(nodes.values()), type_ignores=[]), path, "exec"), scope)
    return {name: scope[name] for name in names}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base")
    ap.add_argument("function")
    ap.add_argument("csv", nargs="?")
    ap.add_argument("--module", default="mm_wgmma_tactics")
    ap.add_argument("--shapes", default="1024,4096;2048,4096;3584,3584;4096,4096;8192,8192;28672,8192;8192,28672")
    ap.add_argument("--ms", default="32,64,96,128,192,256")
    ap.add_argument("--layout", choices=("sm90", "row"), default="sm90")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--plan", action="store_true")
    opt = ap.parse_args()
    mod = importlib.import_module(f"torch_fp4.kernels.cuda.{opt.module}")
    old_fns = base_functions(opt.base, opt.function.split(","), mod)
    from torch_fp4.kernels.cuda import mm_space
    layout = F.WeightLayout(opt.layout)
    changed = []
    for n, k in parse_shapes(opt.shapes):
        for m in map(int, opt.ms.split(",")):
            p = meta_problem(m, n, k, layout)
            new = mm_space.default(p)
            with contextlib.ExitStack() as stack:
                for name, fn in old_fns.items():
                    stack.enter_context(mock.patch.object(mod, name, fn))
                old = mm_space.default(p)
            if old == new:
                print(f"M={m:4d} N={n:5d} K={k:5d} unchanged: {new.label()}", flush=True)
            else:
                changed.append((m, n, k, old, new))
                print(f"M={m:4d} N={n:5d} K={k:5d} {old.label()} -> {new.label()}", flush=True)
    if opt.plan:
        return
    from torch_fp4.bench.mm import LatestWeight, ab_line
    from torch_fp4.bench.timing import write_csv
    rows, weight = [], LatestWeight(torch.device("cuda"), layout)
    for m, n, k, old, new in changed:
        rows.append(weight(n, k).ab(m, old, new, opt.rounds))
        print(ab_line(rows[-1]), flush=True)
    write_csv(opt.csv, rows)


if __name__ == "__main__":
    main()
