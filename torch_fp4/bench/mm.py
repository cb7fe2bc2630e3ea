"""`python -m torch_fp4 bench mm`: FP4 GEMM (NVFP4 weights, W4A16 and W4A4) on the
Llama-3.1-70B linear shapes against torch bf16 matmul and torch fp8 `_scaled_mm`, all measured
in the same run with CUDA-graph replays (torch_fp4/bench/timing.py) that cycle through copies of
each column's operands until they are 3x the L2, so that no call finds its weights cached by the
one before (as in a model, whose every layer has weights of its own); each column's time is its
median over interleaved rounds of every column (`rounds`, default 3).

Columns: time per call; TFLOP/s; speed-up over bf16 and over fp8; fraction of the FP4 memory
floor (weight + scale bytes at the measured copy bandwidth, divided by the measured time). When
the optional peer quack-kernels is importable, `quack.gemm_w4.gemm_w4a16` (NVFP4, the same weights
repacked once by its `prepare_w4_weight`, not timed) is timed in the same run and "x quack" is
its time over ours. On sm_90 the "sm90" columns time W4A16 with the weights prepacked once
(`torch_fp4.prepack_weight`, weight_layout="sm90"; the Hopper GEMM at every M).
W4A4 times include the activation quantization (global scale given): "W4A4" is FP4Linear's W4A4
path (`mm_fp4(x, ..., quantize_a=True)`: the activations' exact values, then the W4A16 GEMM on
them), "codes" is `nvfp4_quantize` to FP4 codes and scales, then mm_fp4 on them (which
dequantizes them first).
Both use the row-major weights of the W4A16 column, and A4/A16 is their time over W4A16's.
`--tactics` times every tactic of one problem and writes them to a CSV file.
"""
from __future__ import annotations

import statistics
from typing import Callable, NamedTuple

import torch

from .. import formats as F
from .. import ops, tactics
from ..problems import MmProblem
from ..testing import grid_exact_operand
from .timing import copies, copy_bandwidth_gbs, graph_time_us, interleaved_medians, rotation, write_csv

SHAPES = ((8192, 28672), (8192, 8192), (28672, 8192))          # (N, K) of Llama-3.1-70B

MS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
QUICK_MS = (1, 16, 128, 2048)


def parse_shapes(text: str) -> tuple[tuple[int, int], ...]:
    """`--shapes` "N,K;N,K;..." (weight rows N, reduction length K) -> ((N, K), ...). N and K are
    positive and K a multiple of 16 (the NVFP4 block); anything else is refused by name."""
    shapes = []
    for item in (s.strip() for s in text.split(";")):
        try:
            n, k = map(int, item.split(","))
        except ValueError:   # not two integers
            n = k = 0
        if n < 1 or k < 16 or k % 16:
            raise ValueError(f"bench mm: --shapes expects 'N,K;N,K;...' with positive N and K a positive "
                             f"multiple of 16 (the NVFP4 block), got {item!r} in {text!r}")
        shapes.append((n, k))
    return tuple(shapes)


def weight_copies(w: torch.Tensor) -> list[torch.Tensor]:
    """w and copies of it in memory of their own, together 3x the L2 (timing.rotation)."""
    return [c for c, in copies((w,), rotation(w.numel() * w.element_size(), w.device))]


def bf16_timer(a: torch.Tensor, w16s: list[torch.Tensor]) -> Callable[[], float]:
    """A timer (us per call) of torch's bf16 matmul of `a` by each of the weight copies `w16s` in
    turn (weight_copies), the peer column of the A/B scripts: its weights come from DRAM as the FP4
    operands of time_tactics do, not from the L2 where one weight reused call after call would
    stay whenever it fits there."""
    inputs = [(w,) for w in w16s]
    return lambda: graph_time_us(lambda w: torch.matmul(a, w.T), inputs, repeats=3, budget_ms=10.0)


def nvfp4_weight(n: int, k: int, device: torch.device, seed: int = 0):
    """Random NVFP4 weight: (data [N, K/2] uint8, 128x4 scales [Np, Kp], gs fp32 [1]). Codes are
    uniform, block scales e4m3 powers of two in [2^-4, 2^2]: a realistic spread, made fast."""
    g = torch.Generator(device=device).manual_seed(seed)
    data = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=device, generator=g)
    exps = torch.randint(-4, 3, (n, k // 16), device=device, generator=g).float()
    scale = F.swizzle(torch.exp2(exps).to(torch.float8_e4m3fn), "128x4")
    return data, scale, torch.ones(1, device=device)


class Problem:
    """Inputs of every contender for one (M, N, K)."""

    def __init__(self, m: int, n: int, k: int, w, device: torch.device):
        self.m, self.n, self.k = m, n, k
        self.w_data, self.w_scale, self.gs_w = w
        self.a = torch.randn(m, k, device=device, dtype=torch.bfloat16)
        self.gs_a = torch.full((1,), 448.0 * 6 / 4.0, device=device)
        self.alpha = F.nvfp4_alpha(self.gs_a, self.gs_w)

    def w4a16(self):
        return ops.mm_fp4(self.a, self.w_data.T, None, self.w_scale.T, self.alpha)

    def w4a16_sm90(self, packed: torch.Tensor):
        return ops.mm_fp4(self.a, packed.T, None, self.w_scale.T, self.alpha, weight_layout="sm90")

    def w4a4(self, packed: torch.Tensor | None = None):
        """FP4Linear's W4A4: mm_fp4 quantizing the activations on the way in."""
        w, layout = (self.w_data, "row") if packed is None else (packed, "sm90")
        return ops.mm_fp4(self.a, w.T, None, self.w_scale.T, self.alpha, weight_layout=layout,
                          quantize_a=True, a_global_scale=self.gs_a)

    def w4a4_values(self):
        """The two-launch W4A4: fp4_quantized_values, then W4A16 mm_fp4 on those values."""
        values = ops.fp4_quantized_values(self.a, self.gs_a)
        return ops.mm_fp4(values, self.w_data.T, None, self.w_scale.T, self.alpha)

    def w4a4_codes(self):
        return ops.mm_fp4(*self.w4a4_args())

    def w4a4_args(self):
        q, s = ops.nvfp4_quantize(self.a, self.gs_a)
        return (q, self.w_data.T, s, self.w_scale.T, self.alpha)


def _peers(m: int, n: int, k: int, w_bf16: list[torch.Tensor], w_fp8: list[torch.Tensor],
           device) -> dict[str, Callable[[], float]]:
    """Timers of torch bf16 and fp8 `_scaled_mm`, each cycling through as many of its weight copies
    (and activations of its own) as make the set 3x the L2."""
    one = torch.ones((), device=device)
    bf16_in = [(torch.randn(m, k, device=device, dtype=torch.bfloat16), w)
               for w in w_bf16[:rotation((n + m) * k * 2, device)]]
    fp8_in = [(torch.randn(m, k, device=device, dtype=torch.bfloat16).to(torch.float8_e4m3fn), w)
              for w in w_fp8[:rotation((n + m) * k, device)]]

    def fp8() -> float:
        try:
            return graph_time_us(lambda a, w: torch._scaled_mm(a, w.T, one, one, out_dtype=torch.bfloat16), fp8_in)
        except RuntimeError:  # cuBLASLt shape limits
            return float("nan")
    return {"bf16": lambda: graph_time_us(lambda a, w: torch.matmul(a, w.T), bf16_in), "fp8": fp8}


class Rotated(NamedTuple):
    """One (M, N, K)'s operands in copies that together are 3x the L2 (timing.rotation): NVFP4
    weights (data, 128x4 scales, gs), a Problem per weight copy (activations of its own), their
    "sm90" prepacks, and bf16 weights for torch's column."""
    weights: list
    problems: list
    packs: list
    bf16: list

    def time_sm90(self, fn: Callable) -> float:
        """Device time per call of fn(problem, prepack), cycling through the copies."""
        return graph_time_us(fn, list(zip(self.problems, self.packs)))

    def time_bf16(self) -> float:
        """Device time per call of torch's bf16 matmul: the first copy's activations by each bf16 weight."""
        return graph_time_us(lambda b: torch.matmul(self.problems[0].a, b.T), [(b,) for b in self.bf16])

    def sm90_problem(self) -> MmProblem:
        """The mm_fp4 problem the copies pose on their "sm90" prepacks (bf16 in and out), as the
        tactic spaces see it."""
        p, pk = self.problems[0], self.packs[0]
        return _nvfp4_problem((p.a, pk.T, None, p.w_scale.T, p.alpha), F.WeightLayout.SM90)


def _nvfp4_problem(args: tuple, layout: F.WeightLayout) -> MmProblem:
    """The mm_fp4 problem of these first five arguments (NVFP4, 128x4 scales, bf16 out) in `layout`."""
    return MmProblem.of(*args, torch.bfloat16, F.NVFP4, F.SfLayout.LAYOUT_128x4, layout)


def meta_problem(m: int, n: int, k: int, layout: F.WeightLayout) -> MmProblem:
    """The mm_fp4 problem of M x K bf16 activations on N x K NVFP4 weights (128x4 scales) in `layout`,
    bf16 out, on meta tensors: what the tactic spaces see, without a GPU (132 SMs)."""
    a = torch.empty(m, k, dtype=torch.bfloat16, device="meta")
    b = torch.empty(n, k // 2, dtype=torch.uint8, device="meta")
    bs = torch.empty(-(-n // 128) * 128, -(-k // 64) * 4, dtype=torch.float8_e4m3fn, device="meta")
    return _nvfp4_problem((a, b.T, None, bs.T, None), layout)


def _forced(tactic, args: tuple, layout: F.WeightLayout):
    """The cuda backend's mm_fp4 on `args` in `layout` with `tactic` forced."""
    with tactics.use_tactic(tactic):
        return ops.mm_fp4(*args, backend="cuda", weight_layout=layout)


class TacticWeight:
    """One N x K NVFP4 weight in `layout` for the scripts that time tactics against each other:
    random codes (nvfp4_weight; prepacked for "sm90"), a bf16 weight for torch's column, and a
    grid-exact weight on which every tactic's GEMM is exact, so two tactics' outputs on it must
    agree bit for bit."""

    def __init__(self, n: int, k: int, device: torch.device, layout: F.WeightLayout = F.WeightLayout.SM90):
        self.n, self.k, self.device, self.layout = n, k, device, layout
        sm90 = layout is F.WeightLayout.SM90
        self.w = nvfp4_weight(n, k, device)
        self.b = ops.prepack_weight(self.w[0]) if sm90 else self.w[0]
        self.w16 = weight_copies(torch.randn(n, k, device=device, dtype=torch.bfloat16))
        self.gen = torch.Generator().manual_seed(n + k)
        wd, ws, _ = grid_exact_operand(n, k, F.NVFP4, "128x4", self.gen)
        self.exact_b = (ops.prepack_weight(wd) if sm90 else wd).to(device)
        self.exact_scale = ws.to(device)

    def problem(self, m: int) -> tuple[Problem, tuple, MmProblem]:
        """(inputs, mm_fp4's first five arguments, the problem the tactic spaces see) at M rows."""
        p = Problem(m, self.n, self.k, self.w, self.device)
        args = (p.a, self.b.T, None, p.w_scale.T, p.alpha)
        return p, args, _nvfp4_problem(args, self.layout)

    def exact_args(self, m: int) -> tuple:
        """mm_fp4's first five arguments on grid-exact operands of M rows (activations exact in bf16)."""
        a = grid_exact_operand(m, self.k, F.NVFP4, "128x4", self.gen)[2].to(self.device, torch.bfloat16)
        return (a, self.exact_b.T, None, self.exact_scale.T, None)

    def bf16(self, p: Problem) -> Callable[[], float]:
        """A timer of torch's bf16 GEMM on p's activations over copies of a bf16 weight (bf16_timer),
        the peer of the tactics timed beside it."""
        return bf16_timer(p.a, self.w16)

    def launch(self, *args, tactic):
        """The cuda backend's mm_fp4 in this weight's layout with `tactic` forced."""
        return _forced(tactic, args, self.layout)

    def ab(self, m: int, old, new, rounds: int = 5) -> dict:
        """An A/B of two tactics at M rows: both and torch bf16 (the peer, over rotating weights)
        in `rounds` interleaved rounds (bench.tune.interleaved_rounds), medians in us, and whether
        the two give the same bits on grid-exact operands (where both are exact)."""
        from .tune import interleaved_rounds
        p, args, _ = self.problem(m)
        times, bf16 = interleaved_rounds([old, new], self.launch, args, rounds, self.bf16(p))
        o, nw, b = (statistics.median(v) for v in (times[old], times[new], bf16))
        exact = self.exact_args(m)
        same = torch.equal(self.launch(*exact, tactic=old), self.launch(*exact, tactic=new))
        return dict(layout=self.layout.value, m=m, n=self.n, k=self.k, bf16_us=round(b, 2), old_us=round(o, 2),
                    new_us=round(nw, 2), new_over_old=round(nw / o, 4), same_bits_exact=same,
                    old=old.label(), new=new.label())


class LatestWeight:
    """The TacticWeight of the (N, K) last asked for, in `layout`: a new shape frees the previous
    weight first (the scripts walk their problems shape by shape)."""

    def __init__(self, device: torch.device, layout: F.WeightLayout):
        self.device, self.layout, self.shape, self.weight = device, layout, None, None

    def __call__(self, n: int, k: int) -> TacticWeight:
        if self.shape != (n, k):
            self.weight = None
            torch.cuda.empty_cache()
            self.shape, self.weight = (n, k), TacticWeight(n, k, self.device, self.layout)
        return self.weight


def ab_line(r: dict) -> str:
    """One printed line of a TacticWeight.ab row."""
    b, o, nw = r["bf16_us"], r["old_us"], r["new_us"]
    return (f"M={r['m']:4d} N={r['n']:5d} K={r['k']:5d} bf16 {b:6.1f}  old {o:6.2f} (x{b / o:.2f})  new {nw:6.2f} "
            f"(x{b / nw:.2f})  new/old {nw / o:.3f}  exact bits {'same' if r['same_bits_exact'] else 'DIFFER'}")


def sm90_under(tactic) -> Callable:
    """fn(problem, prepack): the cuda backend's mm_fp4 on the "sm90" prepack with `tactic` forced."""
    def call(p, pk):
        return _forced(tactic, (p.a, pk.T, None, p.w_scale.T, p.alpha), F.WeightLayout.SM90)
    return call


def rotated(m: int, n: int, k: int, device: torch.device) -> Rotated:
    """The operands of scripts' A/B columns on "sm90" weights (`bench mm` itself reuses one shape's
    weight copies across its M values)."""
    w = nvfp4_weight(n, k, device)
    ws = copies(w, rotation(n * k // 2 + w[1].numel(), device))
    w16 = copies((torch.randn(n, k, device=device, dtype=torch.bfloat16),), rotation(n * k * 2, device))
    return Rotated(ws, [Problem(m, n, k, wc, device) for wc in ws], [ops.prepack_weight(wc[0]) for wc in ws],
                   [c for c, in w16])


def quack_w4a16(w_data: torch.Tensor, w_scale: torch.Tensor, n: int, k: int):
    """quack's NVFP4 W4A16 GEMM on our weights, repacked here once: a function of the activations,
    or None when quack is not installed or cannot run the shape (it needs N and K multiples of
    64)."""
    try:
        from quack.gemm_w4 import gemm_w4a16, prepare_w4_weight
    except Exception:
        return None
    if n % 64 or k % 64:
        return None
    sf = F.unswizzle(w_scale, n, k // 16, "128x4").view(torch.float8_e4m3fn)
    blob, sf_blob = prepare_w4_weight(w_data.view(torch.uint8), sf, wformat="nvfp4")
    return lambda a: gemm_w4a16(a, blob, sf_blob, wformat="nvfp4")


def run(quick: bool = False, csv_path: str | None = None, tune: bool = False,
        ms: tuple[int, ...] | None = None, device: torch.device | None = None, rounds: int = 3,
        shapes: tuple[tuple[int, int], ...] | None = None) -> list[dict]:
    """Every column's time per problem (the weight shapes `shapes`, (N, K) pairs, default SHAPES:
    Llama-3.1-70B's): the median of `rounds` interleaved rounds (each round times
    every column once, in turn), so that the GPU's clock, which its power limit moves with the
    work that ran just before, falls on every column alike."""
    if rounds < 1:
        raise ValueError(f"bench mm: rounds must be at least 1, got {rounds}")
    dev = device or torch.device("cuda")
    name = torch.cuda.get_device_name(dev)
    copy_bw = copy_bandwidth_gbs(dev)
    print(f"bench mm (NVFP4 weights, 128x4 scales, bf16 out) on {name}; torch {torch.__version__}; "
          f"copy bandwidth {copy_bw:.0f} GB/s; tactics: {'autotuned' if tune else 'heuristic/cache'}; "
          f"medians of {rounds} interleaved rounds",
          flush=True)
    rows = []
    hdr = (f"{'N':>6} {'K':>6} {'M':>6} | {'bf16 us':>9} {'fp8 us':>9} | {'W4A16 us':>9} {'TFLOP/s':>7} "
           f"{'x bf16':>6} {'x fp8':>6} {'floor':>5} | {'sm90 us':>9} {'x bf16':>6} {'x quack':>7} | "
           f"{'quack us':>9} {'x quack':>7} | {'W4A4 us':>9} {'x bf16':>6} {'A4/A16':>6} | {'codes us':>9} {'A4/A16':>6}")
    print(hdr)
    for n, k in shapes or SHAPES:
        # Every column cycles through copies of the operands one call reads (weights in memory of
        # their own, activations per Problem) until the set is 3x the L2 (timing.rotation), as a
        # model's layers do: no weight is still in the L2 from the call before.
        w = nvfp4_weight(n, k, dev)
        w_bytes = n * k // 2 + w[1].numel()
        ws = copies(w, rotation(w_bytes, dev))
        w16 = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
        w_bf16 = [c for c, in copies((w16,), rotation(n * k * 2, dev))]
        w_fp8 = [c for c, in copies((w16.to(torch.float8_e4m3fn),), rotation(n * k, dev))]
        floor_us = w_bytes / copy_bw / 1e3
        quacks = [quack_w4a16(wd, wsc, n, k) for wd, wsc, _ in ws]
        hopper = torch.cuda.get_device_capability(dev) == (9, 0) and F.sm90_layout_reason(n, k) is None
        packs = [ops.prepack_weight(wd) for wd, _, _ in ws] if hopper else None
        for m in ms or (QUICK_MS if quick else MS):
            ps = [Problem(m, n, k, wc, dev) for wc in ws[:rotation(w_bytes + m * k * 2, dev)]]
            p = ps[0]
            with tactics.autotune(tune):
                p.w4a16()
                p.w4a4()
                p.w4a4_codes()
                if packs is not None:
                    p.w4a16_sm90(packs[0])

            def each_problem(fn):
                return lambda: graph_time_us(fn, [(q,) for q in ps])
            # Columns in print order; "sm90" (sm_90 only) and quack (when installed) may be absent.
            cols = {"w4a16": each_problem(Problem.w4a16)}
            if packs is not None:
                cols["sm90"] = lambda: graph_time_us(Problem.w4a16_sm90, list(zip(ps, packs)))
            cols.update(w4a4=each_problem(Problem.w4a4), codes=each_problem(Problem.w4a4_codes),
                        **_peers(m, n, k, w_bf16, w_fp8, dev))
            if quacks[0] is not None:
                cols["quack"] = lambda: graph_time_us(lambda f, a: f(a), [(f, q.a) for f, q in zip(quacks, ps)])
            us = interleaved_medians(cols, rounds)
            t16, tp, t4, t4c, bf16, fp8, tq = (us.get(c, float("nan")) for c in
                                               ("w4a16", "sm90", "w4a4", "codes", "bf16", "fp8", "quack"))
            flops = 2.0 * m * n * k
            r = dict(gpu=name, n=n, k=k, m=m, bf16_us=bf16, fp8_us=fp8, w4a16_us=t16, w4a4_us=t4,
                     w4a16_tflops=flops / t16 / 1e6, w4a16_x_bf16=bf16 / t16, w4a16_x_fp8=fp8 / t16,
                     w4a16_floor=floor_us / t16, quack_us=tq, w4a16_x_quack=tq / t16,
                     sm90_us=tp, sm90_x_bf16=bf16 / tp, sm90_x_quack=tq / tp,
                     w4a4_x_bf16=bf16 / t4, w4a4_over_w4a16=t4 / t16,
                     w4a4_codes_us=t4c, w4a4_codes_over_w4a16=t4c / t16,
                     copy_gbs=copy_bw)
            rows.append(r)
            print(f"{n:>6} {k:>6} {m:>6} | {bf16:>9.1f} {fp8:>9.1f} | {t16:>9.1f} {r['w4a16_tflops']:>7.0f} "
                  f"{r['w4a16_x_bf16']:>6.2f} {r['w4a16_x_fp8']:>6.2f} {r['w4a16_floor']:>5.2f} | "
                  f"{tp:>9.1f} {r['sm90_x_bf16']:>6.2f} {r['sm90_x_quack']:>7.2f} | {tq:>9.1f} {r['w4a16_x_quack']:>7.2f} | {t4:>9.1f} {r['w4a4_x_bf16']:>6.2f} {r['w4a4_over_w4a16']:>6.2f} | "
                  f"{t4c:>9.1f} {r['w4a4_codes_over_w4a16']:>6.2f}", flush=True)
            del p, ps
        del w, ws, w16, w_bf16, w_fp8, quacks, packs
        torch.cuda.empty_cache()
    write_csv(csv_path, rows)
    return rows


def run_tactics(m: int, n: int, k: int, csv_path: str | None, mode: str = "w4a16",
                device: torch.device | None = None) -> list[dict]:
    """Time every tactic of one problem (like a tactic sweep script), beside torch bf16 and fp8 over
    rotating weight copies, and write a CSV."""
    from .tune import time_tactics
    dev = device or torch.device("cuda")
    p = Problem(m, n, k, nvfp4_weight(n, k, dev), dev)
    if mode == "w4a16":
        args = (p.a, p.w_data.T, None, p.w_scale.T, p.alpha)
    else:
        args = p.w4a4_args()
    w16 = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
    peers = _peers(m, n, k, weight_copies(w16), weight_copies(w16.to(torch.float8_e4m3fn)), dev)
    bf16, fp8 = peers["bf16"](), peers["fp8"]()
    rows = []
    for t in ops.mm_fp4_tactics(*args):
        def launch(*a, tactic, t=t):
            with tactics.use_tactic(tactic):
                return ops.mm_fp4(*a)
        res = time_tactics([t], launch, args)
        us = res[0][1] if res else float("nan")
        rows.append(dict(gpu=torch.cuda.get_device_name(dev), m=m, n=n, k=k, mode=mode,
                         tactic=t.label(), us=us, x_bf16=bf16 / us, bf16_us=bf16, fp8_us=fp8))
        print(f"{t.label():<110} {us:9.1f} us  x bf16 {bf16 / us:5.2f}", flush=True)
    write_csv(csv_path, rows)
    return rows

