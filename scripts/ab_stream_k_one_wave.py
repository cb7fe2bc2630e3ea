"""auto's tactic against the same heuristic without stream-K below one wave (mm_wgmma_tactics.
stream_k_pays: tiles of 128 rows or more that fill less than one wave of the CTA slots, at long K),
on an sm_90 GPU: "sm90" NVFP4 weights, rotating operands, medians of five interleaved rounds,
torch bf16 beside, and the largest difference between the two tactics' outputs (their fp32 sums
run in another order) relative to the largest output. Problems where both pick the same tactic
print "same".

    python scripts/ab_stream_k_one_wave.py M,N,K [M,N,K ...]
"""
import sys

import torch

from torch_fp4.bench.mm import rotated, sm90_under
from torch_fp4.bench.timing import interleaved_medians
from torch_fp4.kernels.cuda import mm_wgmma_tactics as WT


def without_one_wave_stream_k(problem):
    """The heuristic's tactic with stream_k_pays refusing launches of less than one wave."""
    pays = WT.stream_k_pays
    WT.stream_k_pays = lambda tiles, slots, *rest: tiles >= slots and pays(tiles, slots, *rest)
    try:
        return WT.default(problem)
    finally:
        WT.stream_k_pays = pays


def label(t) -> str:
    return f"{t.block_m}/{t.split_k}{'sk' if t.stream_k else ''}"


def main(problems: list[tuple[int, int, int]]) -> None:
    dev = torch.device("cuda")
    for m, n, k in problems:
        r = rotated(m, n, k, dev)
        new = WT.default(r.sm90_problem())
        old = without_one_wave_stream_k(r.sm90_problem())
        if old == new:
            print(f"M={m} N={n} K={k}: same {label(new)}", flush=True)
            continue
        a, b = (sm90_under(t)(r.problems[0], r.packs[0]).float() for t in (old, new))
        diff = ((a - b).abs().max() / a.abs().max()).item()
        us = interleaved_medians({"old": lambda: r.time_sm90(sm90_under(old)),
                                  "new": lambda: r.time_sm90(sm90_under(new)), "bf16": r.time_bf16}, 5)
        print(f"M={m} N={n} K={k}: old {label(old)} {us['old']:.1f}  new {label(new)} {us['new']:.1f}  "
              f"bf16 {us['bf16']:.1f}  new/old {us['new'] / us['old']:.3f}  x bf16 {us['bf16'] / us['old']:.2f} -> "
              f"{us['bf16'] / us['new']:.2f}  max diff {diff:.1e}", flush=True)
        del r
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main([tuple(int(v) for v in s.split(",")) for s in sys.argv[1:]])
