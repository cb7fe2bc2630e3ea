"""Tactic sweep of the cuda fused_moe (W4A16; grouped small-M GEMMs below 16 routed rows per
expert, grouped Hopper GEMMs from there) on the bench moe models, and of the SwiGLU kernel's tile
on FC1's output. Prints per (model, T) the default tactic's time and the fastest candidates' (NVFP4 models).
Usage: python scripts/sweep_moe_cuda.py [--no-silu] [--sm90] [T ...] (default 64 256 1024 4096);
--sm90: the experts prepacked (fused_moe(..., weight_layout="sm90"))."""
import sys

import torch
import triton

import torch_fp4 as t4
from torch_fp4 import formats as F
from torch_fp4.bench import moe as B
from torch_fp4.bench.timing import graph_time_us
from torch_fp4.kernels.cuda import moe as CM
from torch_fp4.kernels.cuda import moe_tactics as MT
from torch_fp4.kernels.triton import moe_grouped as MG
from torch_fp4.problems import MoeProblem


def sweep(m: B.Model, tokens: int, layout: F.WeightLayout = F.WeightLayout.ROW) -> None:
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    experts = B._experts_that_fit(m, dev, tokens)
    w1, w2, x, ids, tw = B.routed_batch(m, experts, tokens, dev, gen)
    if layout is F.WeightLayout.SM90:
        w1, w2 = (t4.prepack_weight(w1[0]), *w1[1:]), (t4.prepack_weight(w2[0]), *w2[1:])
    p = MoeProblem.of(x, w1[0], w1[1], w2[0], w2[1], ids, None, None, 0, experts, torch.bfloat16,
                      weight_layout=layout)
    default = MT.default(p)
    times = []
    failed = []
    for t in MT.candidates(p):
        run = lambda: CM.fused_moe(x, *w1, *w2, ids, tw, None, None, 0, torch.bfloat16,  # noqa: E731
                                   weight_layout=layout, tactic=t, problem=p)
        try:
            run()
            torch.cuda.synchronize()
            times.append((graph_time_us(run, [()]), t))
        except Exception as e:   # a tactic that fails is reported, not timed
            torch.cuda.synchronize()
            failed.append(t)
            print(f"  FAILED {t.label()}: {type(e).__name__}: {str(e)[-160:]}", flush=True)
    best = min(times, key=lambda v: v[0])
    d = next((us for us, t in times if t == default), float("nan"))
    fastest = sorted(times, key=lambda v: v[0])[:8]
    print(f"{m.name:<14} T={tokens:<5} {layout.value} default {default.label()} {d:.1f} us; best {best[1].label()} "
          f"{best[0]:.1f} us; fastest {len(fastest)} of {len(times)}: "
          + ", ".join(f"{t.label()} {us:.1f}" for us, t in fastest)
          + (f"; {len(failed)} failed" if failed else ""), flush=True)


def sweep_silu(rows: int, inter: int) -> None:
    dev = torch.device("cuda")
    h = torch.randn(rows, 2 * inter, device=dev).to(torch.bfloat16)
    out = torch.empty(rows, inter, device=dev, dtype=torch.bfloat16)
    res = []
    for br, bc, w in ((8, 256, 4), (1, 1024, 4), (1, 2048, 8), (2, 1024, 4), (4, 512, 4), (16, 256, 8),
                      (4, 1024, 8)):
        def run():
            MG._silu_mul_kernel[(triton.cdiv(rows, br), triton.cdiv(inter, bc))](
                h, out, h, rows, inter, BM=1, BR=br, BC=bc, GROUPED=False, PORTABLE=False, USE_GDC=False,
                num_warps=w, enable_fp_fusion=False)
        us = graph_time_us(run, [()])
        res.append(f"{br}x{bc}/w{w} {us:.0f} us ({rows * inter * 6 / us / 1e6:.0f} GB/s)")
    print(f"silu_mul [{rows}, {2 * inter}]: " + ", ".join(res), flush=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    layout = F.WeightLayout.ROW
    if "--sm90" in args:
        args.remove("--sm90")
        layout = F.WeightLayout.SM90
    if "--no-silu" in args:
        args.remove("--no-silu")
    else:
        sweep_silu(9216, 14336)
    tokens = [int(a) for a in args] or [64, 256, 1024, 4096]
    for m in B.MODELS:
        if m.gpt_oss:   # NVFP4 experts only (the gpt-oss rows need fused_moe's MXFP4/bias arguments)
            continue
        if layout is F.WeightLayout.SM90 and (F.sm90_layout_reason(2 * m.inter, m.hidden)
                                              or F.sm90_layout_reason(m.hidden, m.inter)):
            continue
        for t in tokens:
            sweep(m, t, layout)
        torch.cuda.empty_cache()
