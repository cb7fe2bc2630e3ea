"""mm_fp4 GPU backends and their tactics against the spec (section 5).

Exact on grid-exact operands (partial sums exact in fp32); within the spec's bound on random
quantized data; outputs poisoned with NaN at allocation; CUDA-graph capture + replay equal to
eager; identical bits across runs; the autotuner never tunes during capture; a tactic that cannot
run a problem says why. Every tactic family is covered by a structural sample of tactics (swap /
no swap, split-K 1 and > 1, every block_k), and every tactic of one small problem runs once.
"""
import pytest
import torch

import torch_fp4 as t4
from torch_fp4 import formats as F
from torch_fp4 import tactics
from torch_fp4 import testing as T
from torch_fp4.backends import Backend

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poisoned_fresh_tactics")]
FMTS = {"nvfp4": F.NVFP4, "mxfp4": F.MXFP4}
GPU_BACKENDS = ("triton", "cute-dsl", "cuda")
# The quick GPU tier (conftest.py): one case per kernel family, activation kind and backend; the
# other cases run with --full. Case ids: m-activations-layout-format-backend.
QUANTIZE_A_MS = (1, 5, 16, 33, 64)
B_GLOBAL_SCALE_MS = (1, 16, 33, 129, 300)
QUICK = {
    "test_grid_exact_every_structural_tactic": {
        "1-bf16-128x4-nvfp4-cuda", "129-fp4-8x4-nvfp4-cuda", "1-fp16-128x4-mxfp4-cuda",
        "129-fp4-128x4-nvfp4-triton", "1-bf16-128x4-mxfp4-triton",
        "129-fp4-128x4-nvfp4-cute-dsl", "1-bf16-128x4-mxfp4-cute-dsl"},
    "test_random_within_bound": {
        "fp4-128x4-nvfp4-cuda", "bf16-128x4-mxfp4-cuda", "bf16-128x4-nvfp4-triton",
        "fp4-128x4-nvfp4-cute-dsl"},
    # one case per M: the tier's workers share a case's M values out
    "test_quantize_a_gives_the_bits_of_the_values_path": {
        f"{m}-{case}" for m in QUANTIZE_A_MS
        for case in ("nvfp4-bf16-sm90-cuda", "mxfp4-bf16-row-cuda", "nvfp4-fp16-row-cuda", "nvfp4-bf16-row-triton")},
    "test_b_global_scale_gives_the_bits_of_alpha": {
        f"{m}-{case}" for m in B_GLOBAL_SCALE_MS for case in ("sm90-cuda", "row-triton")},
    "test_b_global_scale_is_read_at_graph_replay": {"sm90-cuda", "row-triton"},
}


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def problem(m, n, k, fmt, a_mode, layout="128x4", seed=0, grid=True):
    """(args of the public op, a_hat, w_hat): grid-exact or random quantized operands."""
    g = _gen(seed)
    if grid:
        wd, ws, what = T.grid_exact_operand(n, k, fmt, "128x4", g, "cuda")
    else:
        wd, ws, gs = T.quantized_weight(n, k, fmt, "cuda")
        what = t4.fp4_dequantize(wd, ws, None, block_size=fmt.block_size, out_dtype=torch.float32)
    if a_mode == "fp4":
        if grid:
            ad, as_, ahat = T.grid_exact_operand(m, k, fmt, layout, g, "cuda")
        else:
            x = torch.randn(m, k, generator=g).cuda()
            if fmt is F.NVFP4:
                ad, as_ = t4.nvfp4_quantize(x, torch.ones(1, device="cuda"), sf_layout=layout)
            else:
                ad, as_ = t4.mxfp4_quantize(x, sf_layout=layout)
            ahat = t4.fp4_dequantize(ad, as_, None, block_size=fmt.block_size, sf_layout=layout,
                                     out_dtype=torch.float32)
    else:
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[a_mode]
        if grid:
            ahat = torch.randint(-16, 17, (m, k), generator=g).float().div(8).cuda()
        else:
            ahat = torch.randn(m, k, generator=g).to(dtype).float().cuda()
        ad, as_ = ahat.to(dtype), None
    return (ad, wd.T, as_, ws.T), ahat, what


def call(args, fmt, layout="128x4", out_dtype=torch.float32, alpha=None, backend="auto"):
    a, b, a_scale, b_scale = args
    return t4.mm_fp4(a, b, a_scale, b_scale, alpha=alpha, out_dtype=out_dtype,
                     block_size=fmt.block_size, sf_layout=layout, backend=backend)


def _need(backend, args, fmt, layout="128x4", out_dtype=torch.float32):
    a, b, a_scale, b_scale = args
    reason = t4.unsupported_reason("mm_fp4", Backend.parse(backend), a, b, a_scale, b_scale, None,
                                   out_dtype, fmt.block_size, layout)
    if reason is not None:
        pytest.skip(f"{backend}: {reason}")


def _sample(ts, tiles=False):
    """The first tactic of each structural choice: family, swap, split-K or not (and with `tiles`,
    each cuda small-M tile shape)."""
    picked, seen = [], set()
    for t in ts:
        sig = (t.family, getattr(t, "swap_ab", None), getattr(t, "split_k", 1) > 1)
        if tiles:
            sig += (getattr(t, "warps", None), getattr(t, "tiles_per_warp", None), getattr(t, "block_k", None))
        if sig not in seen:
            seen.add(sig)
            picked.append(t)
    return picked


def structural_sample(args, fmt, layout, backend):
    """A few tactics covering each structural choice of the backend's tactic space."""
    return _sample(t4.mm_fp4_tactics(*args, block_size=fmt.block_size, sf_layout=layout, backend=backend))


MODES = [("fp4", "128x4"), ("fp4", "8x4"), ("fp4", "linear"), ("bf16", "128x4"), ("fp16", "128x4")]


@pytest.mark.parametrize("backend", GPU_BACKENDS)
@pytest.mark.parametrize("fmt_name", FMTS)
@pytest.mark.parametrize("a_mode,layout", MODES)
@pytest.mark.parametrize("m", [1, 129])
def test_grid_exact_every_structural_tactic(backend, fmt_name, a_mode, layout, m):
    fmt = FMTS[fmt_name]
    n, k = 200, 640  # N not a multiple of 128, K not a multiple of 128 (a multiple of both blocks)
    args, ahat, what = problem(m, n, k, fmt, a_mode, layout, seed=m)
    _need(backend, args, fmt, layout)
    want = (ahat.double() @ what.double().T)
    for t in structural_sample(args, fmt, layout, backend):
        with t4.use_tactic(t):
            got = call(args, fmt, layout)
        assert torch.equal(got, want.float()), (t.label(), (got.double() - want).abs().max().item())
    for out_dtype in (torch.bfloat16, torch.float16):   # the default tactic, every output type
        got = call(args, fmt, layout, out_dtype, backend=backend)
        assert torch.equal(got, want.to(out_dtype)), (out_dtype, (got.double() - want).abs().max().item())


@pytest.mark.parametrize("backend", GPU_BACKENDS)
@pytest.mark.parametrize("fmt_name", FMTS)
@pytest.mark.parametrize("a_mode,layout", MODES)
def test_random_within_bound(backend, fmt_name, a_mode, layout):
    fmt = FMTS[fmt_name]
    for m, n, k in ((1, 256, 4096), (129, 136, 1056), (300, 384, 512)):
        args, ahat, what = problem(m, n, k, fmt, a_mode, layout, seed=k, grid=False)
        _need(backend, args, fmt, layout)
        alpha = torch.tensor([0.37], device="cuda")
        for t in structural_sample(args, fmt, layout, backend):
            with t4.use_tactic(t):
                out = call(args, fmt, layout, torch.float32, alpha)
            T.assert_mm_within_bound(out, ahat, what, alpha)
        out = call(args, fmt, layout, torch.bfloat16, alpha, backend)
        T.assert_mm_within_bound(out, ahat, what, alpha)


@pytest.mark.full
def test_every_tactic_of_one_problem():
    fmt = F.NVFP4
    for a_mode, m in (("bf16", 8), ("fp4", 300)):
        args, ahat, what = problem(m, 264, 1024, fmt, a_mode, seed=m)
        want = (ahat.double() @ what.double().T).float()
        ts = t4.mm_fp4_tactics(*args)
        assert ts, "no tactic listed"
        for t in ts:
            with t4.use_tactic(t):
                got = call(args, fmt)
            assert torch.equal(got, want), t.label()


@pytest.mark.parametrize("a_mode", ["bf16", "fp4"])
@pytest.mark.parametrize("m", [1, 16, 200])
def test_graph_replay_and_determinism(a_mode, m):
    fmt = F.NVFP4
    args, ahat, what = problem(m, 1000, 2048, fmt, a_mode, seed=3, grid=False)
    alpha = torch.tensor([1.5], device="cuda")
    eager = call(args, fmt, out_dtype=torch.bfloat16, alpha=alpha)
    for _ in range(3):
        assert torch.equal(call(args, fmt, out_dtype=torch.bfloat16, alpha=alpha), eager)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call(args, fmt, out_dtype=torch.bfloat16, alpha=alpha)
    out.fill_(float("nan"))
    graph.replay()
    assert torch.equal(out, eager)
    alpha.fill_(3.0)   # device-side alpha is read at replay time
    graph.replay()
    assert torch.equal(out, call(args, fmt, out_dtype=torch.bfloat16, alpha=alpha))


def test_autotune_stores_and_never_tunes_in_capture(monkeypatch, tmp_path):
    fmt = F.NVFP4
    args, _, _ = problem(16, 512, 2048, fmt, "bf16", seed=5)
    with t4.autotune():
        tuned = call(args, fmt)
    assert (tmp_path / "tactics.json").exists()
    tactics.forget()   # a fresh process: read back from the JSON file
    assert torch.equal(call(args, fmt), tuned)

    def boom(*a, **k):
        raise AssertionError("tuned during capture")
    from torch_fp4.bench import tune
    monkeypatch.setattr(tune, "fastest", boom)
    args2, _, _ = problem(32, 512, 4096, fmt, "bf16", seed=6)   # not tuned yet
    call(args2, fmt)   # warm-up compiles the heuristic tactic
    graph = torch.cuda.CUDAGraph()
    with t4.autotune(), torch.cuda.graph(graph):
        out = call(args2, fmt)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, call(args2, fmt))


def test_tactic_that_cannot_run_says_why():
    fmt = F.MXFP4
    args, _, _ = problem(4, 256, 256, fmt, "bf16")
    bad = t4.mm_fp4_tactics(*args, block_size=fmt.block_size)[0]
    import dataclasses
    bad = dataclasses.replace(bad, block_k=48)     # not a multiple of the MXFP4 block
    with pytest.raises(ValueError, match="block_k=48 is not a multiple"):
        with t4.use_tactic(bad):
            call(args, fmt)


@pytest.mark.parametrize("backend", ("cuda", "triton"))
@pytest.mark.parametrize("weights", ["row", "sm90"])
@pytest.mark.parametrize("fmt_name,a_dtype", [("nvfp4", torch.bfloat16), ("nvfp4", torch.float16),
                                              ("mxfp4", torch.bfloat16)], ids=["nvfp4-bf16", "nvfp4-fp16", "mxfp4-bf16"])
@pytest.mark.parametrize("m", QUANTIZE_A_MS)
def test_quantize_a_gives_the_bits_of_the_values_path(backend, weights, fmt_name, a_dtype, m):
    """mm_fp4(x, quantize_a=True) gives, tactic by tactic, the bits of mm_fp4 on
    fp4_quantized_values(x) with the same tactic: every small-M tile shape, split-K, M tails,
    K % 32 == 16 (NVFP4 row-major),
    activations with Inf, NaN, large and tiny values and every E2M1 rounding tie; outputs
    NaN-poisoned; within the bound of W4A4 on the reference's codes."""
    fmt = FMTS[fmt_name]
    if weights == "sm90" and backend == "triton":
        pytest.skip("the triton backend reads row-major weights")
    n, k = (256, 1024) if weights == "sm90" else (200, 1040 if fmt is F.NVFP4 else 1056)
    g = _gen(k + m)
    wq, ws, wgs = T.quantized_weight(n, k, fmt, "cuda")
    w = t4.prepack_weight(wq) if weights == "sm90" else wq
    x = (torch.randn(m, k, generator=g) * 4).cuda()
    if m > 2:   # every E2M1 rounding tie (MXFP4: block scale 1, so x * o = x)
        x[1] = (torch.arange(k) % 32) * 0.25 - 4.0
    x[0, 3], x[m - 1, 17], x[m // 2, 40], x[m // 2, 41] = float("inf"), float("nan"), 3.0e4, 1.0e-6
    x = x.to(a_dtype)
    gs = t4.compute_global_scale(x.nan_to_num(0.0, 0.0, 0.0)) if fmt is F.NVFP4 else None
    alpha = F.nvfp4_alpha(gs, wgs) if fmt is F.NVFP4 else None
    kw = dict(block_size=fmt.block_size, weight_layout=weights)
    if t4.unsupported_reason("mm_fp4", Backend.parse(backend), x, w.T, None, ws.T, alpha, torch.float32,
                             quantize_a=True, a_global_scale=gs, **kw) is not None:
        pytest.skip(f"{backend} cannot run quantize_a at M = {m} here")
    values = t4.fp4_quantized_values(x, gs, fmt.block_size)
    ts = _sample(t4.mm_fp4_tactics(x, w.T, None, ws.T, alpha, backend=backend, quantize_a=True,
                                   a_global_scale=gs, **kw), tiles=True)
    assert ts, (m, "no tactic")
    for t in ts:
        with t4.use_tactic(t):
            got = t4.mm_fp4(x, w.T, None, ws.T, alpha, torch.float32, quantize_a=True, a_global_scale=gs, **kw)
            want = t4.mm_fp4(values, w.T, None, ws.T, alpha, torch.float32, **kw)
        assert T.same_bits_up_to_nan_payload(got, want), (m, t.label())
    got = t4.mm_fp4(x, w.T, None, ws.T, alpha, torch.bfloat16, quantize_a=True, a_global_scale=gs,
                    backend=backend, **kw)
    d, s = t4.nvfp4_quantize(x.cpu(), gs.cpu()) if fmt is F.NVFP4 else t4.mxfp4_quantize(x.cpu())
    ahat = t4.fp4_dequantize(d, s, None, block_size=fmt.block_size, out_dtype=torch.float32)
    what = t4.fp4_dequantize(wq.cpu(), ws.cpu(), None, block_size=fmt.block_size, out_dtype=torch.float32)
    rows = ~ahat.isnan().any(1) & ~x.cpu().isinf().any(1)   # an Inf's MXFP4 block may overflow fp32 sums
    T.assert_mm_within_bound(got.cpu()[rows], ahat[rows], what, 1.0 if alpha is None else alpha.cpu())
    assert got.cpu()[ahat.isnan().any(1)].isnan().all()


def _b_global_scale_weight(backend, weights):
    if weights == "sm90" and backend == "triton":
        pytest.skip("the triton backend reads row-major weights")
    wq, ws, _ = T.quantized_weight(256, 1024, F.NVFP4, "cuda")
    return (t4.prepack_weight(wq) if weights == "sm90" else wq), ws


@pytest.mark.parametrize("backend", ("cuda", "triton"))
@pytest.mark.parametrize("weights", ["row", "sm90"])
@pytest.mark.parametrize("m", B_GLOBAL_SCALE_MS)
def test_b_global_scale_gives_the_bits_of_alpha(backend, weights, m):
    """mm_fp4(..., b_global_scale=gs_w) (the cuda GEMMs form alpha in their epilogue) gives, tactic by
    tactic, the bits of mm_fp4 with alpha = nvfp4_alpha(gs_a, gs_w): W4A16, quantize_a and FP4 a,
    small-M and Hopper GEMMs, split-K, persistent; global scales whose product rounds."""
    w, ws = _b_global_scale_weight(backend, weights)
    g = _gen(11 + m)
    gs_w = torch.tensor([1234.567], device="cuda")
    x = (torch.randn(m, w.shape[1] * 2, generator=g) * 4).cuda().to(torch.bfloat16)
    gs_a = t4.compute_global_scale(x) * 1.37
    d, s_ = t4.nvfp4_quantize(x, gs_a)
    modes = {"w4a16": ((x, w.T, None, ws.T), {}, None),
             "quantize_a": ((x, w.T, None, ws.T), dict(quantize_a=True, a_global_scale=gs_a), gs_a),
             "codes": ((d, w.T, s_, ws.T), dict(a_global_scale=gs_a), gs_a)}
    for mode, (args, kw, gs) in modes.items():
        alpha = F.nvfp4_alpha(gs, gs_w)
        kw_alpha = {key: v for key, v in kw.items() if key != "a_global_scale" or mode == "quantize_a"}
        ts = _sample(t4.mm_fp4_tactics(*args, None, backend=backend, weight_layout=weights,
                                       b_global_scale=gs_w, **kw), tiles=True)
        assert ts, (m, mode, "no tactic")
        for t in ts:
            with t4.use_tactic(t):
                got = t4.mm_fp4(*args, None, torch.float32, weight_layout=weights, b_global_scale=gs_w, **kw)
                want = t4.mm_fp4(*args, alpha, torch.float32, weight_layout=weights, **kw_alpha)
            assert torch.equal(got, want), (m, mode, t.label())
            assert not got.isnan().any(), (m, mode, t.label())


@pytest.mark.parametrize("backend", ("cuda", "triton"))
@pytest.mark.parametrize("weights", ["row", "sm90"])
def test_b_global_scale_is_read_at_graph_replay(backend, weights):
    """In a CUDA graph the global scales are read when it replays: new values in the same tensors
    give new alphas."""
    w, ws = _b_global_scale_weight(backend, weights)
    x = (torch.randn(16, w.shape[1] * 2, generator=_gen(11)) * 4).cuda().to(torch.bfloat16)
    gs_a = t4.compute_global_scale(x)
    gs_w = torch.tensor([1234.567], device="cuda")
    call = lambda: t4.mm_fp4(x, w.T, None, ws.T, None, torch.float32, weight_layout=weights, backend=backend,
                             quantize_a=True, a_global_scale=gs_a, b_global_scale=gs_w)
    call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    gs_w.fill_(0.015625 * 3)
    gs_a.mul_(0.5)
    graph.replay()
    want = t4.mm_fp4(x, w.T, None, ws.T, F.nvfp4_alpha(gs_a, gs_w), torch.float32, weight_layout=weights,
                     backend=backend, quantize_a=True, a_global_scale=gs_a)
    assert torch.equal(out, want)
