"""Every GPU kernel family of every installed backend on small, odd-shaped problems, one case at a
time, for compute-sanitizer (scripts/sanitize_kernels.sh runs it under memcheck, racecheck,
synccheck and initcheck and tabulates the errors per case).

`python scripts/sanitize_kernels.py --sanitize` first runs every case plainly (compiling and
caching every kernel, so the sanitized runs check kernels, not JIT compilers), then runs them all
under each tool in one process per tool and prints a table of errors per case and tool (exit
status 1 if any). Driver API calls that fail by design (the CuTe DSL runtime probing entry points
with cuGetProcAddress) are not errors here (`--report-api-errors no`): they are API results, not
memory or synchronization errors. Without `--sanitize` it runs every case once; `--list` prints
the case names; `--case NAME` runs one; `--cases A,B` limits either mode to those cases (the
table is printed after each tool, so a device call that ends early keeps what finished). Each
case prints `=== case NAME` before it and `=== done NAME` after it, so a report is attributed to
the case that launched the kernel.
Shapes: M = 1, 16, 33 and 129 (partial tiles), N = 136 (not a multiple of 128 or 64), K a
multiple of the block only; fused_moe with empty experts, one expert taking every pair, T = 1
and expert-parallel offsets.
"""
from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Callable

import torch

import torch_fp4 as t4
from torch_fp4 import testing as T
from torch_fp4.backends import Backend

DEV = "cuda"
GPU_BACKENDS = (Backend.TRITON, Backend.CUTE_DSL, Backend.CUDA)


def _quantize(backend: Backend) -> None:
    x = torch.randn(129, 96, device=DEV, dtype=torch.bfloat16)
    x3 = torch.randn(3, 9, 64, device=DEV, dtype=torch.float16)
    gs = t4.compute_global_scale(x, backend=backend)
    for layout in ("128x4", "8x4", "linear"):
        d, s = t4.nvfp4_quantize(x, gs, layout, backend=backend)
        t4.fp4_dequantize(d, s, gs, sf_layout=layout, backend=backend)
        dm, sm = t4.mxfp4_quantize(x3, layout, backend=backend)
        t4.fp4_dequantize(dm, sm, block_size=32, sf_layout=layout, out_dtype=torch.float32,
                          backend=backend)
    if t4.unsupported_reason("fp4_quantized_values", backend, x, gs) is None:
        t4.fp4_quantized_values(x, gs, backend=backend)
        t4.fp4_quantized_values(x3, None, 32, backend=backend)


def _mm_every_tactic(backend: Backend, weight_layout: str, fmts=(t4.NVFP4, t4.MXFP4)) -> None:
    """Every tactic `mm_fp4_tactics` lists for `backend`, W4A16 and W4A4, formats `fmts`."""
    n, k = (136, 192) if weight_layout == "row" else (256, 192)
    for fmt in fmts:
        wq, ws, _ = T.quantized_weight(n, k, fmt, DEV)
        if weight_layout != "row":
            wq = t4.prepack_weight(wq, weight_layout)
        for m in (1, 16, 33, 129):
            x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16)
            if fmt is t4.NVFP4:
                xq, xs = t4.nvfp4_quantize(x, torch.ones(1, device=DEV))
            else:
                xq, xs = t4.mxfp4_quantize(x)
            for a, a_scale in ((x, None), (xq, xs)):
                args = (a, wq.T, a_scale, ws.T, None, torch.bfloat16, fmt.block_size, "128x4",
                        backend, weight_layout)
                if t4.unsupported_reason("mm_fp4", backend, *args) is not None:
                    continue
                for tactic in t4.mm_fp4_tactics(*args) or [None]:   # None: no tactic space
                    with t4.use_tactic(tactic) if tactic is not None else contextlib.nullcontext():
                        t4.mm_fp4(*args)


def _tma_store_read_back() -> None:
    """The cuda Hopper GEMM's persistent launches with TMA tensor stores (16-bit outputs), each
    output then read by a copy kernel: for initcheck, whether the tool sees the tensor stores'
    writes (if not, the copy's reads are reported as uninitialized though every element was
    written; the tests' poisoned outputs show that they are)."""
    n, k = 256, 192
    wq, ws, _ = T.quantized_weight(n, k, t4.NVFP4, DEV)
    wq = t4.prepack_weight(wq, "sm90")
    x = torch.randn(129, k, device=DEV, dtype=torch.bfloat16)
    args = (x, wq.T, None, ws.T, None, torch.bfloat16, 16, "128x4", Backend.CUDA, "sm90")
    seen = set()
    for tactic in t4.mm_fp4_tactics(*args):   # one persistent tactic per block_m
        if getattr(tactic, "persistent", False) and tactic.block_m not in seen:
            seen.add(tactic.block_m)
            with t4.use_tactic(tactic):
                t4.mm_fp4(*args).clone()


def _moe(backend: Backend) -> None:
    for w4a4 in (False, True):
        for tokens, experts, top_k in ((1, 4, 2), (33, 8, 2), (129, 8, 4)):
            kw = T.moe_problem(tokens, 64, 32, experts, top_k, DEV, w4a4=w4a4)
            logits = torch.randn(tokens, experts, device=DEV)
            ids, weights = t4.route(logits, top_k)                   # route has its own case
            kw.update(topk_ids=ids, topk_weights=weights)
            t4.fused_moe(**kw, backend=backend)
            kw["topk_ids"] = torch.zeros_like(ids)                    # one expert takes every pair
            t4.fused_moe(**kw, backend=backend)
            kw["topk_ids"] = (ids + 2).to(torch.int32)     # expert parallelism: local experts 3..E+2,
            t4.fused_moe(**kw, local_expert_offset=3,      # pairs with id 2 belong to another rank
                         num_local_experts=experts, backend=backend)


def _moe_gpt_oss(backend: Backend) -> None:
    """gpt-oss's features (MXFP4 experts at hidden 96, bf16 biases, the clamped SwiGLU): the cuda
    backend's decode path (twice: its graph is built, then updated) and, at 129 tokens, its grouped
    Hopper GEMMs; the triton kernels at every size. cuda also W4A4 with MXFP4 activations (the
    grouped Hopper GEMMs at every size: the gathered exact values and the activation kernel)."""
    for tokens in (1, 1, 33, 129):
        kw = T.gpt_oss_moe_problem(tokens, 96, 64, 4, 2, DEV)
        t4.fused_moe(**kw, backend=backend)
        if backend is Backend.CUDA:
            t4.fused_moe(**kw, activations="fp4", backend=backend)
        kw["w2_bias"] = kw["w2_bias"].float()     # fp32 bias on FC2, none on FC1
        kw["w1_bias"] = None
        t4.fused_moe(**kw, backend=backend)
        if backend is Backend.CUDA:
            t4.fused_moe(**kw, activations="fp4", backend=backend)


def _moe_sm90() -> None:
    """The cuda backend on experts prepacked ("sm90"): the decode path's packed readers (FC1's gate
    and up halves from two 128-row groups; block_m 8 and 16) and the grouped Hopper GEMMs, NVFP4
    (W4A16, W4A4) and MXFP4 with gpt-oss's biases, one expert taking every pair and expert
    parallelism."""
    for w4a4 in (False, True):
        for tokens, experts, top_k in ((1, 4, 2), (9, 8, 2), (129, 8, 4)):
            kw = T.moe_problem(tokens, 128, 64, experts, top_k, DEV, w4a4=w4a4)
            kw.update(w1=t4.prepack_weight(kw["w1"]), w2=t4.prepack_weight(kw["w2"]), weight_layout="sm90")
            t4.fused_moe(**kw, backend=Backend.CUDA)
            kw["topk_ids"] = torch.zeros_like(kw["topk_ids"])
            t4.fused_moe(**kw, backend=Backend.CUDA)
            kw["topk_ids"] = (kw["topk_ids"] + 2).to(torch.int32)
            t4.fused_moe(**kw, local_expert_offset=3, num_local_experts=experts, backend=Backend.CUDA)
    for tokens in (1, 33):
        kw = T.gpt_oss_moe_problem(tokens, 128, 64, 4, 2, DEV)
        kw.update(w1=t4.prepack_weight(kw["w1"]), w2=t4.prepack_weight(kw["w2"]), weight_layout="sm90")
        t4.fused_moe(**kw, backend=Backend.CUDA)


def _route(backend: Backend) -> None:
    for tokens, experts, top_k in ((1, 8, 2), (129, 64, 6), (33, 256, 8)):
        logits = torch.randn(tokens, experts, device=DEV)
        t4.route(logits, top_k, backend=backend)
        t4.route(logits, top_k, "softmax", renormalize=True, backend=backend)
        t4.route(logits, top_k, "renormalize", backend=backend)
        t4.route(logits, top_k, "deepseek_v3", bias=torch.randn(experts, device=DEV),
                 n_group=experts // 4 if experts >= 32 else None,
                 topk_group=2 if experts >= 32 else None, routed_scaling_factor=2.5, backend=backend)
    t4.route(torch.randn(17, 16, device=DEV), 1, "llama4", backend=backend)


def cases() -> dict[str, Callable[[], None]]:
    """Case name -> what it runs (only the backends installed and able to run on this GPU)."""
    out: dict[str, Callable[[], None]] = {}
    probe = torch.randn(128, 64, device=DEV, dtype=torch.bfloat16)
    for b in GPU_BACKENDS:
        if t4.unsupported_reason("nvfp4_quantize", b, probe, torch.ones(1, device=DEV)) is None:
            out[f"quantize/{b.label}"] = lambda b=b: _quantize(b)
    for b in (Backend.CUDA, Backend.CUTE_DSL):
        out[f"mm_fp4 row/{b.label}"] = lambda b=b: _mm_every_tactic(b, "row")
    # triton: one case per format (each tactic is a module of its own, which a tool instruments
    # when it loads: about 250 kernels per format, so that each case fits a 10-minute call)
    for fmt in (t4.NVFP4, t4.MXFP4):
        out[f"mm_fp4 row {fmt.name}/triton"] = lambda fmt=fmt: _mm_every_tactic(Backend.TRITON, "row", (fmt,))
    out["mm_fp4 sm90/cuda"] = lambda: _mm_every_tactic(Backend.CUDA, "sm90")
    out["route/triton"] = lambda: _route(Backend.TRITON)
    out["fused_moe/triton"] = lambda: _moe(Backend.TRITON)
    out["fused_moe gpt-oss/triton"] = lambda: _moe_gpt_oss(Backend.TRITON)
    if torch.cuda.get_device_capability() == (9, 0):
        out["fused_moe/cuda"] = lambda: _moe(Backend.CUDA)
        out["fused_moe gpt-oss/cuda"] = lambda: _moe_gpt_oss(Backend.CUDA)
        out["fused_moe sm90/cuda"] = _moe_sm90
        out["tma-store read-back/cuda"] = _tma_store_read_back
    return out


def run(name: str, fn: Callable[[], None]) -> None:
    print(f"=== case {name}", flush=True)
    fn()
    torch.cuda.synchronize()
    print(f"=== done {name}", flush=True)


TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")


UNTRACKED = "Internal Sanitizer Error"   # the tool could not follow a launch: no finding about the kernel


def _errors_per_case(output: str) -> tuple[dict[str, int], dict[str, int]]:
    """Sanitizer error reports per case, and apart from them the launches the tool reported it
    could not track (its own failure, e.g. out of memory for synccheck's state of a kernel with
    200 KiB of shared memory: those launches went unchecked). A report starts with '========= '
    and a word (its details are indented further); summaries and banners are not reports."""
    counts: dict[str, int] = {}
    untracked: dict[str, int] = {}
    case = "(before any case)"
    for line in output.splitlines():
        if line.startswith("=== case "):
            case = line[len("=== case "):].strip()
            counts.setdefault(case, 0)
        elif line.startswith("========= ") and not line.startswith("=========  "):
            text = line[len("========= "):]
            if text.startswith(UNTRACKED):
                untracked[case] = untracked.get(case, 0) + 1
            elif text.strip() and not text.startswith(("ERROR SUMMARY", "COMPUTE-SANITIZER", "RACECHECK SUMMARY",
                                                       "Target application", "LEAK SUMMARY")):
                counts[case] = counts.get(case, 0) + 1
    return counts, untracked


def _print_table(names: list[str], tools: tuple[str, ...], table: dict[str, dict[str, str]]) -> None:
    width = max(len(n) for n in names)
    print(f"{'case':<{width}} | " + " | ".join(f"{t:>16}" for t in tools))
    for n in names:
        print(f"{n:<{width}} | " + " | ".join(f"{table[n].get(t, '-'):>16}" for t in tools), flush=True)


def sanitize(tools: tuple[str, ...], timeout: int, names: list[str], log_dir: str | None = None) -> int:
    import subprocess

    run_all = [sys.executable, __file__, "--cases", ",".join(names)]
    subprocess.run(run_all, check=True, stdout=subprocess.DEVNULL)        # compile and cache
    table: dict[str, dict[str, str]] = {n: {} for n in names}
    failed = False
    for tool in tools:
        cmd = ["compute-sanitizer", "--tool", tool, "--report-api-errors", "no", "--print-limit", "100000",
               "--target-processes", "all", *run_all]
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            text = out.stdout + out.stderr
        except subprocess.TimeoutExpired as e:
            text = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            text += "\n=== timeout"
        if log_dir is not None:   # the tool's whole report, for the errors behind the counts
            with open(f"{log_dir}/sanitize_{tool}.log", "w") as f:
                f.write(text)
        counts, untracked = _errors_per_case(text)
        for n in names:
            done = f"=== done {n}" in text
            errors = counts.get(n, 0)
            cell = str(errors) + (f" ({untracked[n]} untracked)" if untracked.get(n) else "")
            table[n][tool] = cell if done else f"{cell} (did not finish)"
            failed |= errors > 0 or not done
        print(f"--- after {tool}:", flush=True)   # the table so far: a timeout later loses nothing
        _print_table(names, tools, table)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print the case names")
    parser.add_argument("--case", help="run one case")
    parser.add_argument("--cases", help="comma-separated case names (default: every case)")
    parser.add_argument("--sanitize", action="store_true",
                        help="run every case under each compute-sanitizer tool and print a table")
    parser.add_argument("--tools", default=",".join(TOOLS), help="comma-separated tools")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per tool")
    parser.add_argument("--log-dir", default=None, help="write each tool's report to DIR/sanitize_TOOL.log")
    args = parser.parse_args(argv)
    table = cases()
    if args.list:
        print("\n".join(table))
        return 0
    flag, names = None, list(table)
    if args.case is not None:
        flag, names = "--case", [args.case]
    elif args.cases:
        flag, names = "--cases", args.cases.split(",")
    unknown = [n for n in names if n not in table]
    if unknown:
        print(f"sanitize_kernels: {flag}: expected names from {list(table)}, got {unknown}", file=sys.stderr)
        return 2
    if args.sanitize:
        return sanitize(tuple(args.tools.split(",")), args.timeout, names, args.log_dir)
    for name in names:
        run(name, table[name])
    return 0


if __name__ == "__main__":
    sys.exit(main())
