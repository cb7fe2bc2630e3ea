"""`python -m torch_fp4 demo`: a small causal transformer LM and its MoE variant (random weights,
fixed seed) in bf16 and quantized to FP4, eager and compiled: next-token accuracy against bf16,
tokens/s and weight memory, as a table (and optionally a plot).

Runs on the GPU when there is one (compiled with CUDA graphs: mode="reduce-overhead"), on the
CPU otherwise (reference backend; torch.compile(fullgraph=True), skipped by --quick there).
"""
from __future__ import annotations

import contextlib
import copy
import gc
import importlib.util
import sys
import time
from dataclasses import dataclass, replace
from typing import Callable, Optional

import torch
import torch.nn.functional as Fn

from .examples.tiny_lm import LMConfig, TinyLM, moe_to_fp4
from .nn import QuantConfig, quantize_model

DEFAULT = LMConfig()
QUICK = LMConfig(vocab=256, hidden=64, heads=2, layers=2, ffn=128, experts=4, expert_ffn=64)


@dataclass(frozen=True)
class Sizes:
    batch: int
    seq: int
    warmup: int
    iters: int


# name, format, activations; the MoE model gets the NVFP4 ones (FP4MoE experts are NVFP4)
MODES = (("NVFP4 W4A16", "nvfp4", "bf16"), ("NVFP4 W4A4", "nvfp4", "fp4"),
         ("MXFP4 W4A16", "mxfp4", "bf16"), ("MXFP4 W4A4", "mxfp4", "fp4"))


@dataclass(frozen=True)
class Row:
    model: str                       # "dense" or "MoE"
    variant: str                     # "bf16", "NVFP4 W4A16", ...
    cosine: float                    # mean over positions of the logits' cosine similarity
    kl: float                        # mean KL(bf16 || variant) of the next-token distributions
    top1: float                      # fraction of positions with the same argmax token
    eager_tps: float                 # tokens/s
    compiled_tps: Optional[float]    # None when not compiled
    weight_bytes: int                # every parameter and buffer
    ratio: float                     # bf16 model bytes / weight_bytes


# -- progress ----------------------------------------------------------------------------------
class TextBar:
    """A small progress bar on stderr, used when tqdm is not installed (the tqdm calls it uses:
    set_description_str, update, close)."""

    def __init__(self, total: int, desc: str = "", width: int = 24):
        self.total, self.n, self.desc, self.width = total, 0, desc, width
        self.tty = sys.stderr.isatty()

    def set_description_str(self, desc: str) -> None:
        self.desc = desc
        self._draw(newline=not self.tty)

    def update(self, n: int = 1) -> None:
        self.n += n
        if self.tty:
            self._draw(newline=False)

    def close(self) -> None:
        if self.tty:
            sys.stderr.write("\n")
        else:
            self.desc = "done"
            self._draw(newline=True)
        sys.stderr.flush()

    def _draw(self, newline: bool) -> None:
        fill = self.width * self.n // max(self.total, 1)
        line = f"[{'#' * fill}{'.' * (self.width - fill)}] {self.n}/{self.total} {self.desc}"
        sys.stderr.write(line + "\n" if newline else "\r" + line.ljust(78))
        sys.stderr.flush()


def progress(total: int, desc: str = ""):
    """tqdm when it is installed, else TextBar."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return TextBar(total, desc)
    return tqdm(total=total, desc=desc, file=sys.stderr, leave=False)


# -- measurements ------------------------------------------------------------------------------
def accuracy(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float, float]:
    """(cosine, KL(ref || out), top-1 agreement) of logits [..., V], averaged over positions."""
    o, r = out.float().flatten(0, -2), ref.float().flatten(0, -2)
    # In fp64 and clamped: a cosine is at most 1, which fp32 rounding can overshoot by an ulp.
    cos = Fn.cosine_similarity(o.double(), r.double(), dim=-1).clamp(-1.0, 1.0).mean().item()
    log_p, log_q = r.log_softmax(-1), o.log_softmax(-1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1).mean().item()
    top1 = (o.argmax(-1) == r.argmax(-1)).float().mean().item()
    return cos, kl, top1


def seconds_per_call(fn: Callable[[], object], device: torch.device, sizes: Sizes) -> float:
    """After warm-up: on CUDA the mean over `iters` back-to-back calls timed with CUDA events; on
    the CPU the fastest of `iters` calls timed with perf_counter (the least disturbed by other
    work on the machine, as timeit advises)."""
    for _ in range(sizes.warmup):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(sizes.iters):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / sizes.iters
    times = []
    gc.collect()
    gc.disable()                     # as timeit does: no collection inside a timed call
    try:
        for _ in range(sizes.iters):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    finally:
        gc.enable()
    return min(times)


def weight_bytes(model: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))


def _compile_settings(device: torch.device):
    """On the CPU, compile in this process: inductor's pool of compile workers would otherwise
    compete with the timed runs for the cores."""
    if device.type == "cuda":
        return contextlib.nullcontext()
    import torch._inductor.config as inductor_config
    return inductor_config.patch(compile_threads=1)


def compiled(model: torch.nn.Module, device: torch.device) -> Callable[[torch.Tensor], torch.Tensor]:
    """torch.compile(fullgraph=True); on CUDA with CUDA graphs (mode="reduce-overhead")."""
    torch._dynamo.reset()          # one model at a time: no recompile limit across variants
    if device.type != "cuda":
        return torch.compile(model, fullgraph=True)
    fn = torch.compile(model, mode="reduce-overhead", fullgraph=True)

    def step(tokens: torch.Tensor) -> torch.Tensor:
        torch.compiler.cudagraph_mark_step_begin()
        return fn(tokens)
    return step


# -- the demo ----------------------------------------------------------------------------------
def _variants(dense: TinyLM, moe: TinyLM, calib: torch.Tensor):
    """(model kind, variant name, builder of the variant)."""
    keep_head = "lm_head"           # the LM head stays bf16
    out = [("dense", "bf16", lambda: dense)]
    for name, fmt, act in MODES:
        out.append(("dense", name, lambda fmt=fmt, act=act: quantize_model(
            copy.deepcopy(dense), QuantConfig(fmt, act, exclude=keep_head))))
    out.append(("MoE", "bf16", lambda: moe))
    for name, fmt, act in MODES[:2]:
        # experts -> FP4MoE (router kept dense), then attention via quantize_model, which
        # leaves FP4MoE alone
        out.append(("MoE", name, lambda fmt=fmt, act=act: quantize_model(
            moe_to_fp4(copy.deepcopy(moe), act, calib), QuantConfig(fmt, act, exclude=keep_head))))
    return out


def _fmt_tps(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:,.0f}"


def print_table(rows: list[Row]) -> None:
    head = (f"{'model':<6} {'variant':<12} {'logit cos':>9} {'KL':>8} {'top-1':>6} "
            f"{'eager tok/s':>12} {'compiled tok/s':>15} {'weights MiB':>12} {'vs bf16':>8}")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r.model:<6} {r.variant:<12} {r.cosine:>9.5f} {r.kl:>8.5f} {r.top1:>6.3f} "
              f"{_fmt_tps(r.eager_tps):>12} {_fmt_tps(r.compiled_tps):>15} "
              f"{r.weight_bytes / 2**20:>12.2f} {r.ratio:>7.2f}x")


def plot_available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def plot_speed(rows: list[Row], path: str, title: str) -> None:
    """Horizontal bars of tokens/s per variant (eager, and compiled when measured)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    labels = [f"{r.model} {r.variant}" for r in rows]
    pos = list(range(len(rows)))
    has_compiled = any(r.compiled_tps is not None for r in rows)
    h = 0.4 if has_compiled else 0.7
    fig, ax = plt.subplots(figsize=(8, 1.5 + 0.45 * len(rows)))
    ax.barh([p - (h / 2 if has_compiled else 0) for p in pos], [r.eager_tps for r in rows],
            height=h, label="eager")
    if has_compiled:
        ax.barh([p + h / 2 for p in pos], [r.compiled_tps or 0 for r in rows], height=h,
                label="compiled")
    ax.set_yticks(pos, labels)
    ax.invert_yaxis()
    ax.set_xlabel("tokens/s")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _fp4_vs_bf16(rows: list[Row]) -> str:
    """The measured eager speed of the FP4 variants against bf16's, per model kind."""
    parts = []
    for kind in dict.fromkeys(r.model for r in rows):
        base = next(r.eager_tps for r in rows if r.model == kind and r.variant == "bf16")
        ratios = [r.eager_tps / base for r in rows if r.model == kind and r.variant != "bf16"]
        if ratios:
            parts.append(f"{kind} {min(ratios):.2f}-{max(ratios):.2f}x")
    return "here FP4 ran eager at " + ", ".join(parts) + " of bf16's tokens/s."


def run(device: Optional[str] = None, seed: int = 0, quick: bool = False,
        compile: Optional[bool] = None, plot: Optional[str] = None) -> list[Row]:
    """Build, quantize, measure and print; returns the table's rows. compile=None compiles
    except for quick runs on the CPU; plot: a PNG path for the speed chart (needs matplotlib)."""
    if plot is not None and not plot_available():
        raise ImportError("plot: needs matplotlib, which is not installed (pip install matplotlib)")
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cuda = dev.type == "cuda"
    do_compile = (cuda or not quick) if compile is None else compile
    cfg = QUICK if quick else DEFAULT
    sizes = Sizes(*((2, 16) if quick else (4, 64)), *((3, 20) if cuda else (2, 5)))
    where = torch.cuda.get_device_name(dev) if cuda else "CPU, reference backend"
    print(f"torch_fp4 demo on {dev} ({where}): causal LM with {cfg.layers} blocks, hidden "
          f"{cfg.hidden}, {cfg.heads} heads, vocab {cfg.vocab}; dense MLP {cfg.ffn} / MoE "
          f"{cfg.experts} experts of {cfg.expert_ffn}, top-{cfg.top_k}; {sizes.batch}x{sizes.seq} "
          f"tokens per forward", flush=True)
    if not do_compile:
        why = "--quick on the CPU; --compile adds about 40 s" if compile is None else "--no-compile"
        print(f"compiled: off ({why})", flush=True)
    elif not cuda:
        print("compiling 8 models on the CPU after the eager runs (minutes the first time; "
              "--no-compile skips it)", flush=True)
    gen = torch.Generator().manual_seed(seed + 1)
    tokens, calib = (torch.randint(cfg.vocab, (sizes.batch, sizes.seq), generator=gen).to(dev)
                     for _ in range(2))
    dense = TinyLM(cfg, moe=False, seed=seed, device=dev)
    moe = TinyLM(cfg, moe=True, seed=seed, device=dev)
    variants = _variants(dense, moe, calib)
    bar = progress(len(variants) * (3 + do_compile), "demo")
    started = time.perf_counter()
    models, rows, refs, base_bytes = [], [], {}, {}
    per_s = sizes.batch * sizes.seq
    try:
        with torch.no_grad(), _compile_settings(dev):
            # Every eager measurement first: on the CPU, eager timings taken after inductor
            # kernels have run in the process are erratic.
            for kind, name, build in variants:
                label = f"{kind} {name}"
                bar.set_description_str(f"{label}: build")
                model = build()
                bar.update()
                bar.set_description_str(f"{label}: accuracy")
                logits = model(tokens)
                if name == "bf16":
                    refs[kind], base_bytes[kind] = logits, weight_bytes(model)
                acc = accuracy(logits, refs[kind])
                bar.update()
                bar.set_description_str(f"{label}: eager speed")
                eager = per_s / seconds_per_call(lambda: model(tokens), dev, sizes)
                bar.update()
                nbytes = weight_bytes(model)
                models.append(model)
                rows.append(Row(kind, name, *acc, eager, None, nbytes, base_bytes[kind] / nbytes))
            for i, model in enumerate(models if do_compile else ()):
                bar.set_description_str(f"{rows[i].model} {rows[i].variant}: compile and speed")
                fn = compiled(model, dev)
                rows[i] = replace(rows[i], compiled_tps=per_s / seconds_per_call(
                    lambda: fn(tokens), dev, sizes))
                bar.update()
    finally:
        bar.close()
    print()
    print_table(rows)
    print(f"\nAccuracy: next-token logits at {per_s} positions ({sizes.batch} sequences of {sizes.seq} "
          f"random tokens) vs the bf16 model of the same kind; KL(bf16 || FP4) in nats.")
    timing = "CUDA events, mean" if cuda else "perf_counter, best"
    how = ("torch.compile(fullgraph=True" + (", mode='reduce-overhead'): CUDA graphs" if cuda
                                              else ")")) if do_compile else "not run"
    print(f"Speed: one forward over {per_s} tokens ({timing} of {sizes.iters} after {sizes.warmup} "
          f"warm-up); compiled: {how}.")
    if cuda:
        print("These layers are small, so a forward is mostly kernel launches (eager: also the "
              "ops' Python dispatch); the FP4 kernels gain where weight traffic dominates "
              "(BENCHMARKS.md: mm_fp4 and fused_moe at decode sizes).")
    else:
        print("On the CPU every torch_fp4 op runs the reference backend, which dequantizes the "
              "weights on every call (the fast FP4 kernels are GPU backends): " + _fp4_vs_bf16(rows))
    print("Weights: every parameter and buffer; the token embedding, norms, routers and LM head "
          "stay in bf16. MoE experts are NVFP4 only (fused_moe).")
    print(f"The demo took {time.perf_counter() - started:.0f} s on {where} (building, measuring"
          f"{' and compiling' if do_compile else ''}).")
    if plot is not None:
        plot_speed(rows, plot, f"torch_fp4 demo: tokens/s on {where}")
        print(f"Speed chart written to {plot}")
    return rows
