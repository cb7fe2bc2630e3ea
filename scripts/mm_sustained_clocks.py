"""The Hopper GEMM ("sm90" weights, auto's tactic, and without stream-K where auto takes it), quack's
W4A16 GEMM and torch bf16 matmul under sustained load, with the SM clock and board power nvidia-smi
reads meanwhile: python scripts/mm_sustained_clocks.py [N,K,M ...] (sm_90 GPU, quack-kernels
installed). Each column replays a CUDA graph of 20 calls for 1.5 s (about 10^4 calls), long enough
for the board's power limit to settle the clock; the medians of the samples after the first quarter
are printed. Two interleaved rounds. Default problems: 28672,8192,256 8192,8192,1024 8192,28672,128."""
import dataclasses
import statistics
import subprocess
import sys
import time

import torch

from torch_fp4 import formats as F
from torch_fp4 import ops, tactics
from torch_fp4.bench.mm import Problem, nvfp4_weight, quack_w4a16
from torch_fp4.kernels.cuda import mm_wgmma_tactics as WT
from torch_fp4.problems import MmProblem

SMI = ["nvidia-smi", "--query-gpu=clocks.sm,power.draw,clocks_event_reasons.active",
       "--format=csv,noheader,nounits", "-lms", "50"]


def sustained(fn, seconds: float = 1.5) -> tuple[float, float, float, list[str]]:
    """(us per call, median SM MHz, median W, the clock-event reasons seen) over `seconds` of replays."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(20):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    smi = subprocess.Popen(SMI, stdout=subprocess.PIPE, text=True)
    time.sleep(0.3)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0, replays = time.time(), 0
    start.record()
    while time.time() - t0 < seconds:
        for _ in range(5):
            graph.replay()
        replays += 5
        torch.cuda.synchronize()
    end.record()
    end.synchronize()
    smi.terminate()
    rows = [line.split(",") for line in smi.communicate()[0].strip().splitlines() if line.count(",") == 2]
    settled = rows[len(rows) // 4:]
    clock = statistics.median(float(r[0]) for r in settled) if settled else float("nan")
    power = statistics.median(float(r[1]) for r in settled) if settled else float("nan")
    return start.elapsed_time(end) * 1000 / (20 * replays), clock, power, sorted({r[2].strip() for r in rows})


def main(problems: list[tuple[int, int, int]]) -> None:
    dev = torch.device("cuda")
    for n, k, m in problems:
        w = nvfp4_weight(n, k, dev)
        p = Problem(m, n, k, w, dev)
        packed = ops.prepack_weight(w[0])
        quack = quack_w4a16(w[0], w[1], n, k)
        if quack is None:
            raise SystemExit("mm_sustained_clocks: quack-kernels is not installed (or cannot run this shape)")
        w16 = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
        args = (p.a, packed.T, None, p.w_scale.T, p.alpha)
        auto = WT.default(MmProblem.of(*args, torch.bfloat16, F.NVFP4, F.SfLayout.LAYOUT_128x4,
                                       F.WeightLayout.SM90))

        def ours():
            return ops.mm_fp4(*args, weight_layout="sm90")
        cols = {"ours": ours, "quack": lambda: quack(p.a), "bf16": lambda: torch.matmul(p.a, w16.T)}
        if auto.stream_k:
            whole = dataclasses.replace(auto, stream_k=False)

            def no_stream_k():
                with tactics.use_tactic(whole):
                    return ours()
            cols["ours no-sk"] = no_stream_k
        for rnd in range(2):
            for name, fn in cols.items():
                us, clock, power, reasons = sustained(fn)
                print(f"{n}x{k} M={m} r{rnd} {name:10s} {us:8.1f} us  sm {clock:6.0f} MHz  {power:5.0f} W  "
                      f"clock events {reasons}", flush=True)


if __name__ == "__main__":
    specs = sys.argv[1:] or ["28672,8192,256", "8192,8192,1024", "8192,28672,128"]
    main([tuple(int(v) for v in s.split(",")) for s in specs])
