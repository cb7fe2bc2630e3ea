"""The cuda backend's Hopper wgmma GEMM (csrc/mm_wgmma.cu) against the spec, on sm_90 only.

Every compiled tile (each block_m of mm_wgmma_tactics.BLOCK_MS) with and without split-K,
persistent (with and without stream-K) or one tile per CTA, few and many stages: exact on
grid-exact operands, within the spec's bound on random quantized data; M = 1, 33, 129, 4097; N
and K not multiples of the tiles (K a multiple of 32); NVFP4 and MXFP4; bf16, fp16 and FP4
activations; outputs NaN-poisoned at allocation; identical bits run to run; CUDA-graph replay.
"""
import pytest
import torch

import torch_fp4 as t4
from torch_fp4 import formats as F
from torch_fp4 import testing as T
from torch_fp4.problems import MmProblem
from torch_fp4.kernels.cuda import mm_wgmma_tactics as WT

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poisoned_fresh_tactics")]


@pytest.fixture(autouse=True)
def _hopper():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma GEMM runs on sm_90 only")


def _operands(m, n, k, fmt, a_mode, grid, seed):
    g = torch.Generator().manual_seed(seed)
    if grid:
        wd, ws, what = T.grid_exact_operand(n, k, fmt, "128x4", g, "cuda")
    else:
        wd, ws, _ = T.quantized_weight(n, k, fmt, "cuda")
        what = t4.fp4_dequantize(wd, ws, None, block_size=fmt.block_size, out_dtype=torch.float32)
    if a_mode == "fp4":
        ad, as_, ahat = T.grid_exact_operand(m, k, fmt, "128x4", g, "cuda")
    elif grid:
        ahat = torch.randint(-16, 17, (m, k), generator=g).float().div(8).cuda()
        ad, as_ = ahat.to({"bf16": torch.bfloat16, "fp16": torch.float16}[a_mode]), None
    else:
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[a_mode]
        ad, as_ = torch.randn(m, k, generator=g).to(dtype).cuda(), None
        ahat = ad.float()
    return (ad, wd.T, as_, ws.T), ahat, what


def _call(args, fmt, out_dtype=torch.float32, alpha=None):
    a, b, a_scale, b_scale = args
    return t4.mm_fp4(a, b, a_scale, b_scale, alpha=alpha, out_dtype=out_dtype, block_size=fmt.block_size,
                     backend="cuda")


def _tactics(args, fmt):
    a, b, a_scale, b_scale = args
    problem = MmProblem.of(a, b, a_scale, b_scale, None, torch.float32, fmt, F.SfLayout.LAYOUT_128x4)
    out = []
    for bm in WT.BLOCK_MS:
        for split, persistent in ((1, False), (1, True), (3, False), (2, False)):
            for stages in (WT.MIN_STAGES, WT.max_stages(bm, persistent=persistent, ctas_per_sm=1,
                                                         packed=problem.packed))[:1 if split == 2 else 2]:
                t = WT.WgmmaMmTactic(bm, stages, split, persistent)
                if WT.why_not(t, problem) is None:
                    out.append(t)
            for ctas, sk in ((2, False), (1, True), (2, True)):
                if sk and not persistent:
                    continue
                t = WT.WgmmaMmTactic(bm, WT.MIN_STAGES, split, persistent, ctas_per_sm=ctas, stream_k=sk)
                if WT.why_not(t, problem) is None:
                    out.append(t)
    return out


CASES = [("nvfp4", "bf16"), ("nvfp4", "fp16"), ("nvfp4", "fp4"), ("mxfp4", "bf16"), ("mxfp4", "fp4")]


@pytest.mark.parametrize("fmt_name,a_mode", CASES)
@pytest.mark.parametrize("m", [1, 33, 129, 4097])
def test_grid_exact_every_tile(fmt_name, a_mode, m):
    fmt = {"nvfp4": F.NVFP4, "mxfp4": F.MXFP4}[fmt_name]
    n, k = 328, 704          # N, K not multiples of the 128/256-row and 64-column tiles
    args, ahat, what = _operands(m, n, k, fmt, a_mode, True, seed=m)
    want = (ahat.double() @ what.double().T).float()
    ts = _tactics(args, fmt)
    assert len(ts) >= 10
    for t in ts:
        with t4.use_tactic(t):
            got = _call(args, fmt)
            # 16-bit outputs leave persistent launches by TMA tensor stores (N % 8 == 0 here), and
            # split-2 launches too, each rank storing half the tile's rows (rank 1's half holds one
            # row at M = 33 and 129, none at M = 1).
            tma = t.persistent or t.split_k == 2
            half = _call(args, fmt, torch.bfloat16, torch.tensor([0.5], device="cuda")) if tma else None
        assert torch.equal(got, want), (t.label(), (got - want).abs().max().item())
        if half is not None:
            assert torch.equal(half, (want * 0.5).to(torch.bfloat16)), t.label()


@pytest.mark.parametrize("fmt_name,a_mode", CASES)
def test_random_within_bound_and_deterministic(fmt_name, a_mode):
    fmt = {"nvfp4": F.NVFP4, "mxfp4": F.MXFP4}[fmt_name]
    for m, n, k in ((129, 392, 1056), (300, 1000, 2048)):
        args, ahat, what = _operands(m, n, k, fmt, a_mode, False, seed=k)
        alpha = torch.tensor([0.37], device="cuda")
        for t in _tactics(args, fmt)[::2]:
            with t4.use_tactic(t):
                out = _call(args, fmt, torch.float32, alpha)
                again = _call(args, fmt, torch.float32, alpha)
            T.assert_mm_within_bound(out, ahat, what, alpha)
            assert torch.equal(out, again), t.label()
        out = _call(args, fmt, torch.bfloat16, alpha)
        T.assert_mm_within_bound(out, ahat, what, alpha)


def test_default_is_wgmma_above_16_and_graph_replay():
    fmt = F.NVFP4
    args, ahat, what = _operands(200, 1000, 2048, fmt, "bf16", False, seed=3)
    a, b, a_scale, b_scale = args
    ts = t4.mm_fp4_tactics(a, b, a_scale, b_scale, backend="auto")
    assert isinstance(ts[0], WT.WgmmaMmTactic), ts[0]
    alpha = torch.tensor([1.5], device="cuda")
    eager = t4.mm_fp4(a, b, None, b_scale, alpha=alpha)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = t4.mm_fp4(a, b, None, b_scale, alpha=alpha)
    out.fill_(float("nan"))
    graph.replay()
    assert torch.equal(out, eager)
    alpha.fill_(3.0)
    graph.replay()
    assert torch.equal(out, t4.mm_fp4(a, b, None, b_scale, alpha=alpha))


def test_inf_nan_activations_propagate_like_the_reference():
    fmt = F.NVFP4
    args, ahat, what = _operands(130, 256, 512, fmt, "bf16", True, seed=9)
    a = args[0].clone()
    a[3, 7] = float("inf")
    a[70, 100] = float("nan")
    args = (a, *args[1:])
    got = _call(args, fmt)
    want = t4.mm_fp4(a.cpu(), args[1].cpu(), None, args[3].cpu(), out_dtype=torch.float32, backend="reference")
    assert torch.equal(got.isnan().cpu(), want.isnan()) and torch.equal(got.isinf().cpu(), want.isinf())


@pytest.mark.parametrize("n", [1000, 999, 1064])
def test_persistent_ctas_take_many_tiles(n):
    """More output tiles than SMs, so each persistent CTA runs the stage ring on across several
    tiles: exact, in every output dtype, and bit-identical to one tile per CTA. 16-bit outputs
    leave by TMA tensor stores when N % 8 == 0 (N = 1064: the last tile's second warpgroup lies
    wholly past N); an odd N takes the staged stores, with single outputs at the row ends. With
    stream-K the last waves' tiles are shared out by K steps (owners adding up to three partials).
    (Two K groups read "sm90" weights: tests/test_gpu_mm_sm90_layout.py.)"""
    fmt, k = F.NVFP4, 704
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for bm in WT.BLOCK_MS:
        m = 3 * sms * bm // -(-n // WT.ROWS) + 5        # about three tiles per SM, a partial last row tile
        args, ahat, what = _operands(m, n, k, fmt, "bf16", True, seed=bm)
        want = (ahat.double() @ what.double().T).float()
        for out_dtype in (torch.float32, torch.bfloat16, torch.float16):
            got = {}
            for persistent, ctas, sk in ((True, 1, False), (False, 1, False), (True, 2, False), (True, 1, True),
                                         (True, 2, True)):
                if ctas == 2 and bm > WT.TWO_CTA_MAX_BLOCK_M:
                    continue
                with t4.use_tactic(WT.WgmmaMmTactic(bm, WT.MIN_STAGES, 1, persistent, ctas, stream_k=sk)):
                    got[persistent, ctas, sk] = _call(args, fmt, out_dtype)
            assert torch.equal(got[True, 1, False], want.to(out_dtype)), (bm, out_dtype)
            for key, value in got.items():
                assert torch.equal(value, got[True, 1, False]), (bm, out_dtype, key)


@pytest.mark.parametrize("m,n", [(33, 2304), (100, 2304), (256, 2304), (256, 2176), (33, 2560), (256, 2560),
                                 (224, 5120), (288, 5120), (496, 6144)])
def test_stream_k_with_fewer_tiles_than_slots(m, n):
    """Stream-K where every tile is shared out (fewer tiles than CTA slots, long K: the heuristic
    for N <= ~5600 and K >= 8192, mm_wgmma_tactics._few_tiles, and for 80-96 tiles of 128-256 rows,
    stream_k_pays): each tile's K steps run on one to several CTAs whose partials its owner adds.
    The CTAs run in groups of four, two or one (as the CTA
    slots and the tiles divide: 20, 18 and 17 weight tiles on an even number of slots), the CTAs
    of a group on side-by-side tiles. Exact on grid-exact operands, every output dtype, and
    identical bits run to run; the heuristic picks it for these shapes."""
    fmt, k = F.NVFP4, 8192                      # 128 K steps
    args, ahat, what = _operands(m, n, k, fmt, "bf16", True, seed=m)
    want = (ahat.double() @ what.double().T).float()
    a, b, a_scale, b_scale = args
    problem = MmProblem.of(a, b, a_scale, b_scale, None, torch.float32, fmt, F.SfLayout.LAYOUT_128x4)
    auto = WT.default(problem)
    assert auto.persistent and auto.stream_k, auto
    bm = auto.block_m
    for t in (auto, WT.WgmmaMmTactic(bm, WT.MIN_STAGES, 1, True, stream_k=True)):
        with t4.use_tactic(t):
            for out_dtype in (torch.float32, torch.bfloat16):
                got = _call(args, fmt, out_dtype)
                assert torch.equal(got, want.to(out_dtype)), (t.label(), out_dtype)
                assert torch.equal(got, _call(args, fmt, out_dtype)), t.label()


@pytest.mark.parametrize("m,n,k,layout", [(96, 2048, 4096, "row"), (128, 3584, 3584, "sm90"), (192, 1536, 4096, "sm90"),
                                          (64, 512, 3584, "sm90"), (32, 4096, 4096, "row"), (256, 1024, 4096, "row"),
                                          (100, 2048, 3584, "sm90")])
def test_few_tiles_split_k_launches(m, n, k, layout):
    """Few weight tiles (mm_wgmma_tactics._few_tiles): the heuristic's split-K launch of 2 to 8
    CTAs per tile (clusters of one CTA per SM, block_m up to the one covering M), exact on
    grid-exact operands for fp32 and bf16 outputs, identical bits run to run, on row-major and
    "sm90" weights."""
    fmt = F.NVFP4
    (a, b, a_scale, b_scale), ahat, what = _operands(m, n, k, fmt, "bf16", True, seed=n + m)
    want = (ahat.double() @ what.double().T).float()
    wl = F.WeightLayout(layout)
    if wl is F.WeightLayout.SM90:
        b = t4.prepack_weight(b.T).T
    problem = MmProblem.of(a, b, a_scale, b_scale, None, torch.float32, fmt, F.SfLayout.LAYOUT_128x4, wl)
    auto = WT.default(problem)
    assert auto.split_k > 1 and not auto.persistent and auto.ctas_per_sm == 1, auto
    with t4.use_tactic(auto):
        for out_dtype in (torch.float32, torch.bfloat16):
            got = t4.mm_fp4(a, b, a_scale, b_scale, out_dtype=out_dtype, backend="cuda", weight_layout=layout)
            assert torch.equal(got, want.to(out_dtype)), (auto.label(), out_dtype)
            assert torch.equal(got, t4.mm_fp4(a, b, a_scale, b_scale, out_dtype=out_dtype, backend="cuda",
                                              weight_layout=layout)), auto.label()


def test_stream_k_under_cuda_graph_replay():
    """A stream-K launch allocates its workspace and clears its flags on the stream, so it captures:
    replays equal eager bit for bit, with the alpha and activations changed between replays."""
    fmt, n, k = F.NVFP4, 1000, 2048
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    m = 3 * sms * 64 // -(-n // WT.ROWS) + 5          # about three tiles per SM: a partial last wave
    args, _, _ = _operands(m, n, k, fmt, "bf16", False, seed=5)
    a, b, _, b_scale = args
    alpha = torch.tensor([0.75], device="cuda")
    with t4.use_tactic(WT.WgmmaMmTactic(64, 4, 1, True, stream_k=True)):
        eager = _call(args, fmt, torch.bfloat16, alpha)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = _call(args, fmt, torch.bfloat16, alpha)
    out.fill_(float("nan"))
    graph.replay()
    assert torch.equal(out, eager)
    a.mul_(-2.0)
    alpha.fill_(0.5)
    graph.replay()
    with t4.use_tactic(WT.WgmmaMmTactic(64, 4, 1, True, stream_k=True)):
        assert torch.equal(out, _call(args, fmt, torch.bfloat16, alpha))


def test_a_tactic_the_library_lacks_raises_naming_it():
    """The launcher trusts its tactic, but a kernel library with no kernel for it (capi.h's
    kNotCompiled) raises instead of leaving the output unwritten."""
    from torch_fp4.kernels.cuda import mm as cuda_mm

    args, _, _ = _operands(64, 256, 256, F.NVFP4, "bf16", True, 0)
    a, b, a_scale, b_scale = args
    bad = WT.WgmmaMmTactic(64, 2)                     # fewer stages than the kernel compiles
    assert WT.why_not(bad, MmProblem.of(a, b, a_scale, b_scale, None, torch.float32, F.NVFP4,
                                        F.SfLayout.LAYOUT_128x4)) is not None
    with pytest.raises(RuntimeError, match=r"wgmma0.*no kernel of this library matches"):
        cuda_mm.mm_fp4(a, b, a_scale, b_scale, None, torch.float32, F.NVFP4, F.SfLayout.LAYOUT_128x4,
                       tactic=bad)


@pytest.mark.parametrize("layout", ["row", "sm90"])
def test_a_stage_half_past_k_reads_zeros_not_an_earlier_tiles_data(layout):
    """K % 128 == 64: the last 128-K stage's second sub-tile lies wholly past K. Its activation box
    must land as zeros: the slot last held another tile's activations, and +inf there times the
    zero scales past K would turn that tile's rows into NaN. A persistent launch at block_m 32 and
    three stages with two tiles per CTA: tile c's first stage fills ring slot 0 with rows whose
    K 64..127 are +inf, and tile c + CTAs reuses that slot for its last stage."""
    fmt = F.NVFP4
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    n, k, bm = 128, 192, 32
    m = 2 * sms * bm
    g = torch.Generator().manual_seed(11)
    wd, ws, what = T.grid_exact_operand(n, k, fmt, "128x4", g, "cuda")
    ahat = torch.randint(-16, 17, (m, k), generator=g).float().div(8).cuda()
    ahat[: sms * bm, 64:128] = float("inf")  # the first wave's tiles
    a = ahat.to(torch.bfloat16)
    b = t4.prepack_weight(wd).T if layout == "sm90" else wd.T
    t = WT.WgmmaMmTactic(bm, WT.MIN_STAGES, 1, True)
    with t4.use_tactic(t):
        got = t4.mm_fp4(a, b, None, ws.T, out_dtype=torch.float32, backend="cuda", weight_layout=layout)
    want = (ahat[sms * bm:].double() @ what.double().T).float()
    assert torch.equal(got[sms * bm:], want), (got[sms * bm:] - want).abs().max().item()


@pytest.mark.parametrize("fmt_name", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("k", [672, 736, 768])
def test_grid_exact_every_k_tail_of_a_128_k_stage(fmt_name, k):
    """The last 128-K stage holding 32, 96 or 128 K elements (K % 128 = 32, 96, 0; 64: the tests
    above): the K blocks past K get zero scales, the sub-tile wholly past K zeros, for every block_m
    (256: stages of 64 K), one tile per CTA with and without split-K, and persistent."""
    fmt = {"nvfp4": F.NVFP4, "mxfp4": F.MXFP4}[fmt_name]
    args, ahat, what = _operands(200, 328, k, fmt, "bf16", True, seed=k)
    want = (ahat.double() @ what.double().T).float()
    for bm in WT.BLOCK_MS:
        for split, persistent in ((1, False), (2, False), (1, True)):
            t = WT.WgmmaMmTactic(bm, WT.MIN_STAGES, split, persistent)
            with t4.use_tactic(t):
                got = _call(args, fmt)
            assert torch.equal(got, want), (t.label(), (got - want).abs().max().item())
