"""Named tactics of the Hopper wgmma GEMM (csrc/mm_wgmma.cu) against `auto`'s, on an sm_90 GPU:
NVFP4 weights in one layout, rotating operands, medians of interleaved rounds
(bench.tune.interleaved_rounds) with torch bf16 in the same rounds, and each tactic's output on
grid-exact operands against auto's bit for bit (every tactic is exact there).

    python scripts/ab_tactics.py [--layout sm90|row] [--rounds 5] [--csv FILE] [--plan] CASE ...

CASE is M,N,K/TACTIC/TACTIC...; a TACTIC is fields joined by '+': bmB (block_m, required), sS
(split_k), p (persistent), sk (stream-K), c2 (two CTAs per SM), kg2 (two K groups), stS (stages;
default: as many as fit). Example: `256,8192,8192/bm256+p+sk/bm128+p`. --plan prints auto's
tactic and each named one (or why it cannot run) without a GPU."""
import argparse
import statistics

import torch

from torch_fp4 import formats as F
from torch_fp4.bench.mm import meta_problem
from torch_fp4.kernels.cuda import mm_wgmma_tactics as WT
from torch_fp4.kernels.cuda import mm_space

FLAGS = {"p": ("persistent", True), "sk": ("stream_k", True), "c2": ("ctas_per_sm", 2), "kg2": ("k_groups", 2)}
PREFIXES = (("bm", "block_m"), ("st", "stages"), ("s", "split_k"))


def parse_tactic(text: str, problem) -> WT.WgmmaMmTactic:
    """The tactic a '+'-joined spec names; stages, unless given, as many as fit."""
    fields = {}
    for tok in text.split("+"):
        if tok in FLAGS:
            name, value = FLAGS[tok]
            fields[name] = value
            continue
        prefix = next((pre for pre, _ in PREFIXES if tok.startswith(pre) and tok[len(pre):].isdigit()), None)
        if prefix is None:
            raise SystemExit(f"ab_tactics: unknown tactic field {tok!r} in {text!r}")
        fields[dict(PREFIXES)[prefix]] = int(tok[len(prefix):])
    if "block_m" not in fields:
        raise SystemExit(f"ab_tactics: {text!r} names no block_m (bmB)")
    if "stages" not in fields:
        ctas, kg = fields.get("ctas_per_sm", 1), fields.get("k_groups", 1)
        fields["stages"] = WT.max_stages(fields["block_m"], WT.smem_limit(problem, ctas), fields.get("persistent", False),
                                         kg, ctas_per_sm=ctas, packed=problem.packed)
    return WT.WgmmaMmTactic(**fields)


def parse_case(text: str):
    shape, *specs = text.split("/")
    m, n, k = (int(v) for v in shape.split(","))
    return m, n, k, specs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cases", nargs="+")
    ap.add_argument("--layout", choices=("sm90", "row"), default="sm90")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--csv")
    ap.add_argument("--plan", action="store_true")
    opt = ap.parse_args()
    layout = F.WeightLayout(opt.layout)
    plans = []
    for case in opt.cases:
        m, n, k, specs = parse_case(case)
        p = meta_problem(m, n, k, layout)
        auto = mm_space.default(p)
        named = []
        for s in specs:
            t = parse_tactic(s, p)
            reason = WT.why_not(t, p)
            print(f"M={m} N={n} K={k} {s}: {t.label()}" + (f"  cannot run: {reason}" if reason else ""))
            if reason is None and t != auto:
                named.append((s, t))
        print(f"M={m} N={n} K={k} auto: {auto.label()}", flush=True)
        plans.append((m, n, k, auto, named))
    if opt.plan:
        return
    from torch_fp4.bench.mm import LatestWeight
    from torch_fp4.bench.timing import write_csv
    from torch_fp4.bench.tune import interleaved_rounds
    rows, weight = [], LatestWeight(torch.device("cuda"), layout)
    for m, n, k, auto, named in plans:
        tw = weight(n, k)
        pr, args, _ = tw.problem(m)
        tactics = [auto] + [t for _, t in named]
        times, bf16 = interleaved_rounds(tactics, tw.launch, args, opt.rounds, tw.bf16(pr))
        exact = tw.exact_args(m)
        ref = tw.launch(*exact, tactic=auto)
        b = statistics.median(bf16)
        base = statistics.median(times[auto])
        for spec, t in [("auto", auto)] + named:
            got = times[t] or [float("nan")]   # a tactic that failed to run has no times
            us = statistics.median(got)
            same = torch.equal(tw.launch(*exact, tactic=t), ref)
            rows.append(dict(layout=layout.value, m=m, n=n, k=k, spec=spec, tactic=t.label(), us=round(us, 2),
                             over_auto=round(us / base, 4), bf16_us=round(b, 2), x_bf16=round(b / us, 3),
                             min_us=round(min(got), 2), max_us=round(max(got), 2), same_bits_exact=same))
            print(f"M={m:5d} N={n:5d} K={k:5d} {spec:<16} {us:8.2f} us  /auto {us / base:.3f}  x bf16 {b / us:.2f}"
                  f"  bits {'same' if same else 'DIFFER'}  {t.label()}", flush=True)
    write_csv(opt.csv, rows)


if __name__ == "__main__":
    main()
