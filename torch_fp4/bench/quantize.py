"""`python -m torch_fp4 bench quantize`: NVFP4/MXFP4 quantization per backend against the copy
bandwidth and torch.compile of the reference quantizer, measured in the same run."""
from __future__ import annotations

import csv
import sys

import torch

from .. import formats as F
from .. import ops, reference
from ..backends import Backend
from .timing import copy_bandwidth_gbs, geomean, graph_time_us, rotation

FULL_M = [128 << i for i in range(11)]                     # 128 .. 131072
FULL_K = [512, 1024, 2048, 4096, 6144, 8192, 12288, 16384, 32768]
QUICK_M = [128, 2048, 32768]
QUICK_K = [1024, 4096, 16384]
GPU_BACKENDS = (Backend.TRITON, Backend.CUTE_DSL, Backend.CUDA)
COMPILE_PEER_MAX_ELEMENTS = 1 << 31   # the compiled reference needs several fp32 temporaries
BANDS = (("M*K >= 2^25", 1 << 25, 1 << 62), ("2^20 <= M*K < 2^25", 1 << 20, 1 << 25),
         ("M*K < 2^20", 0, 1 << 20))


def _call(fmt: F.Fp4Format, backend: Backend):
    if fmt is F.NVFP4:
        return lambda x, gs: ops.nvfp4_quantize(x, gs, backend=backend)
    return lambda x, gs: ops.mxfp4_quantize(x, backend=backend)


def _compiled_reference(fmt: F.Fp4Format):
    layout = F.SfLayout.LAYOUT_128x4
    if fmt is F.NVFP4:
        fn = lambda x, gs: reference.nvfp4_quantize(x, gs, layout)  # noqa: E731
    else:
        fn = lambda x, gs: reference.mxfp4_quantize(x, layout)  # noqa: E731
    return torch.compile(fn, dynamic=True)


def _moved_bytes(m: int, k: int, fmt: F.Fp4Format) -> int:
    mp, kp = F.padded_scale_shape(m, k // fmt.block_size, "128x4")
    return m * k * 2 + m * k // 2 + mp * kp


def run(quick: bool = False, csv_path: str | None = None, fmt_name: str = "nvfp4",
        backends: list[str] | None = None) -> list[dict]:
    dev = torch.device("cuda")
    fmt = F.NVFP4 if fmt_name == "nvfp4" else F.MXFP4
    probe = torch.zeros(128, 64, device=dev, dtype=torch.bfloat16)
    chosen = [Backend.parse(b) for b in backends] if backends else list(GPU_BACKENDS)
    gs = [] if fmt is F.MXFP4 else [torch.ones(1, device=dev)]
    usable = [b for b in chosen if ops.unsupported_reason(f"{fmt.name}_quantize", b, probe, *gs) is None]
    copy_bw = copy_bandwidth_gbs(dev)
    name = torch.cuda.get_device_name(dev)
    print(f"bench quantize ({fmt.name}, bf16 input, 128x4 scales) on {name}; copy bandwidth "
          f"{copy_bw:.0f} GB/s; backends {[b.label for b in usable]}; peer: torch.compile(reference)",
          flush=True)
    peer = _compiled_reference(fmt)
    ms, ks = (QUICK_M, QUICK_K) if quick else (FULL_M, FULL_K)
    rows = []
    for i, m in enumerate(ms):
        for k in ks:
            x0 = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            gs = ops.compute_global_scale(x0)
            nbytes = _moved_bytes(m, k, fmt)
            inputs = [(x0, gs)] + [(torch.randn_like(x0), gs) for _ in range(rotation(m * k * 2, dev) - 1)]
            row = {"gpu": name, "format": fmt.name, "M": m, "K": k, "copy_gbs": round(copy_bw, 1)}
            if m * k <= COMPILE_PEER_MAX_ELEMENTS:
                row["compile_us"] = graph_time_us(peer, inputs)
            for b in usable:
                us = graph_time_us(_call(fmt, b), inputs)
                row[f"{b.label}_us"] = us
                row[f"{b.label}_gbs"] = nbytes / us / 1e3
                row[f"{b.label}_frac"] = row[f"{b.label}_gbs"] / copy_bw
            rows.append(row)
            del inputs, x0
        print(f"  M={m}: done ({i + 1}/{len(ms)})", flush=True)
    _print_table(rows, usable)
    _print_summary(rows, usable)
    graph_us = {b.label: graph_time_us(_call(fmt, b), [(torch.randn(128, 4096, device=dev, dtype=torch.bfloat16),
                                                        ops.compute_global_scale(probe))], calls=100)
                for b in usable}
    print("128x4096 quantize inside a CUDA-graph replay: "
          + ", ".join(f"{b} {us:.2f} us" for b, us in graph_us.items()))
    if csv_path:
        with open(csv_path, "w", newline="") as f:
            keys = sorted({k for r in rows for k in r}, key=lambda k: (k not in ("gpu", "format", "M", "K"), k))
            writer = csv.DictWriter(f, fieldnames=keys)
            writer.writeheader()
            writer.writerows(rows)
    return rows


def _print_table(rows: list[dict], usable: list[Backend]) -> None:
    cols = "".join(f" {b.label + ' us':>12} {'GB/s':>6} {'%copy':>6}" for b in usable)
    print(f"\n{'M':>7} {'K':>6} {'compile us':>11}{cols} {'best vs compile':>16}")
    for r in rows:
        line = f"{r['M']:>7} {r['K']:>6} {r.get('compile_us', float('nan')):>11.1f}"
        for b in usable:
            line += (f" {r[b.label + '_us']:>12.1f} {r[b.label + '_gbs']:>6.0f}"
                     f" {100 * r[b.label + '_frac']:>5.0f}%")
        best = min(r[b.label + "_us"] for b in usable)
        line += f" {r.get('compile_us', float('nan')) / best:>15.1f}x"
        print(line)


def _print_summary(rows: list[dict], usable: list[Backend]) -> None:
    print(f"\n{'backend':<10} {'band':<20} {'geomean %copy':>13} {'min':>6} {'max':>6} {'wins':>5} "
          f"{'geomean vs compile':>19}")
    for b in usable:
        for band, lo, hi in BANDS:
            sel = [r for r in rows if lo <= r["M"] * r["K"] < hi]
            if not sel:
                continue
            fr = [r[b.label + "_frac"] for r in sel]
            wins = sum(1 for r in sel if r[b.label + "_us"] == min(r[c.label + "_us"] for c in usable))
            sp = [r["compile_us"] / r[b.label + "_us"] for r in sel if "compile_us" in r]
            print(f"{b.label:<10} {band:<20} {100 * geomean(fr):>12.0f}% {100 * min(fr):>5.0f}% "
                  f"{100 * max(fr):>5.0f}% {wins:>5} {geomean(sp):>18.1f}x")
    sys.stdout.flush()
