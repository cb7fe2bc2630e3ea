"""Weights in the "sm90" layout on the cuda GEMMs (csrc/mm_wgmma.cu at every M, csrc/mm_small_m.cu
at M <= 16), sm_90 only: every compiled tile of both gives the bits of the row-major weights
(exact on grid-exact operands), at M = 1, 16, 33, 129, 4097, NVFP4 and MXFP4, bf16, fp16 and FP4
activations; auto picks the small-M kernel up to M = 16 and the Hopper GEMM above; CUDA graph
replay; prepack_weight on the GPU writes the CPU's bytes; FP4Linear with "sm90" weights equals the
row-major module bit for bit. The Hopper GEMM's two K groups (which read "sm90" weights only) are
exact on grid-exact operands, in every output dtype, with split-K, persistent, stream-K and many
tiles per CTA, and give the bits of one K group's tactic where the sums are exact."""
import dataclasses

import pytest
import torch

import torch_fp4 as t4
from torch_fp4 import formats as F
from torch_fp4 import testing as T
from torch_fp4.problems import MmProblem
from torch_fp4.kernels.cuda import mm_space
from torch_fp4.kernels.cuda import mm_tactics as MT
from torch_fp4.kernels.cuda import mm_wgmma_tactics as WT

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poisoned_fresh_tactics")]
CASES = [("nvfp4", "bf16"), ("nvfp4", "fp16"), ("nvfp4", "fp4"), ("mxfp4", "bf16"), ("mxfp4", "fp4")]
# The quick GPU tier (conftest.py): each activation kind and format once, small-M and wgmma sizes;
# M = 1 with bf16/fp16 activations (every small-M tile, 15-21 s each on H100) runs with --full.
QUICK = {"test_every_tile_equals_row_major_and_is_exact": {
    "1-nvfp4-fp4", "16-nvfp4-bf16", "16-mxfp4-bf16", "33-nvfp4-fp16", "129-mxfp4-fp4", "4097-nvfp4-bf16"}}


@pytest.fixture(autouse=True)
def _hopper():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma GEMM runs on sm_90 only")


def _operands(m, n, k, fmt, a_mode, seed):
    g = torch.Generator().manual_seed(seed)
    wd, ws, what = T.grid_exact_operand(n, k, fmt, "128x4", g, "cuda")
    if a_mode == "fp4":
        ad, as_, ahat = T.grid_exact_operand(m, k, fmt, "128x4", g, "cuda")
    else:
        ahat = torch.randint(-16, 17, (m, k), generator=g).float().div(8).cuda()
        ad, as_ = ahat.to({"bf16": torch.bfloat16, "fp16": torch.float16}[a_mode]), None
    return ad, wd, as_, ws, ahat, what


def _mm(a, w, a_scale, ws, fmt, layout, out_dtype=torch.float32, alpha=None):
    return t4.mm_fp4(a, w.T, a_scale, ws.T, alpha, out_dtype, fmt.block_size, backend="cuda",
                     weight_layout=layout)


@pytest.mark.parametrize("fmt_name,a_mode", CASES)
@pytest.mark.parametrize("m", [1, 16, 32, 33, 129, 4097])
def test_every_tile_equals_row_major_and_is_exact(fmt_name, a_mode, m):
    fmt = {"nvfp4": F.NVFP4, "mxfp4": F.MXFP4}[fmt_name]
    n, k = 384, 704
    a, wd, as_, ws, ahat, what = _operands(m, n, k, fmt, a_mode, seed=m)
    packed = t4.prepack_weight(wd)
    assert torch.equal(packed.cpu(), t4.prepack_weight(wd.cpu()))
    want = (ahat.double() @ what.double().T).float()
    problem = MmProblem.of(a, packed.T, as_, ws.T, None, torch.float32, fmt, F.SfLayout.LAYOUT_128x4,
                           F.WeightLayout.SM90)
    tactics = [WT.WgmmaMmTactic(bm, stages, split, persistent) for bm in WT.BLOCK_MS
               for split, persistent in ((1, False), (1, True), (3, False))
               for stages in (WT.MIN_STAGES, WT.max_stages(bm, persistent=persistent, ctas_per_sm=1, packed=True))]
    two = [WT.WgmmaMmTactic(bm, stages, split, split == 1, stream_k=sk, k_groups=2)
           for bm in (32, 64) for split, sk in ((1, False), (1, True), (3, False))
           for stages in (WT.K_GROUPS_MIN_STAGES,
                          WT.max_stages(bm, persistent=split == 1, k_groups=2, ctas_per_sm=1, packed=True))]
    if m <= MT.PACKED_MAX_M:
        tactics += [MT.CudaMmTactic(w, r, bk, stages, split) for w, r, bk in MT.TILE_SHAPES
                    for stages, split in ((2, 1), (4, 3))]
    count = 0
    for t in tactics:
        if mm_space.why_not(t, problem) is not None:
            continue
        count += 1
        with t4.use_tactic(t):
            got = _mm(a, packed, as_, ws, fmt, "sm90")
            row = _mm(a, wd, as_, ws, fmt, "row")
        assert torch.equal(got, want), (t.label(), (got - want).abs().max().item())
        assert torch.equal(got, row), t.label()
    assert count >= 10
    for t in two:   # "sm90" weights only: exact (so equal to every one-K-group tactic above)
        assert mm_space.why_not(t, problem) is None, t.label()
        with t4.use_tactic(t):
            got = _mm(a, packed, as_, ws, fmt, "sm90")
            half = _mm(a, packed, as_, ws, fmt, "sm90", torch.bfloat16, torch.tensor([0.5], device="cuda"))
        assert torch.equal(got, want), (t.label(), (got - want).abs().max().item())
        assert torch.equal(half, (want * 0.5).to(torch.bfloat16)), t.label()


@pytest.mark.parametrize("n", [1024, 1408])
def test_two_k_groups_many_tiles_per_cta(n):
    """Persistent two-K-group launches with several tiles per CTA (K group 1 runs on into the next
    tile while K group 0 stores this one; the stage parity carries across tiles of odd and even
    step counts), with and without stream-K, every output dtype: exact, and equal to one K group.
    N = 1408 gives 11 weight tiles, so the tiles do not divide evenly over the CTAs ("sm90" weights
    need N % 128 == 0: a partial weight tile is row-major only)."""
    fmt = F.NVFP4
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for k in (704, 768):   # 11 and 12 K steps per tile
        for bm in (32, 64):
            m = 3 * sms * bm // -(-n // WT.ROWS) + 5
            a, wd, as_, ws, ahat, what = _operands(m, n, k, fmt, "bf16", seed=bm + k)
            packed = t4.prepack_weight(wd)
            want = (ahat.double() @ what.double().T).float()
            for out_dtype in (torch.float32, torch.bfloat16, torch.float16):
                with t4.use_tactic(WT.WgmmaMmTactic(bm, 4, 1, True)):
                    one = _mm(a, packed, as_, ws, fmt, "sm90", out_dtype)
                assert torch.equal(one, want.to(out_dtype)), (bm, k, out_dtype)
                for sk in (False, True):
                    t = WT.WgmmaMmTactic(bm, WT.K_GROUPS_MIN_STAGES, 1, True, stream_k=sk, k_groups=2)
                    with t4.use_tactic(t):
                        assert torch.equal(_mm(a, packed, as_, ws, fmt, "sm90", out_dtype), one), (t.label(), k,
                                                                                                  out_dtype)


def test_random_bits_equal_row_major_auto_picks_by_m_and_graph_replay():
    fmt = F.NVFP4
    wd, ws, gs = T.quantized_weight(1024, 2048, fmt, "cuda")
    packed = t4.prepack_weight(wd)
    alpha = torch.tensor([0.37], device="cuda")
    what = t4.fp4_dequantize(wd, ws, None, out_dtype=torch.float32)
    for m in (1, 16, 17, 64, 300):
        a = torch.randn(m, 2048, device="cuda", dtype=torch.bfloat16)
        ts = t4.mm_fp4_tactics(a, packed.T, None, ws.T, weight_layout="sm90")
        # 1024 x 2048: a small weight (mm_space.SMALL_WEIGHT), the small-M GEMM up to M = 32
        assert isinstance(ts[0], MT.CudaMmTactic if m <= MT.PACKED_MAX_M else WT.WgmmaMmTactic), (m, ts[0])
        # Row-major weights run one K group: the same tactic otherwise, the same bits (the Hopper
        # GEMM); the small-M GEMM groups K differently per MMA step in the two layouts (spec 4b):
        # each within the bound.
        one = dataclasses.replace(ts[0], k_groups=1) if isinstance(ts[0], WT.WgmmaMmTactic) else ts[0]
        with t4.use_tactic(one):
            row = t4.mm_fp4(a, wd.T, None, ws.T, alpha)
            same = t4.mm_fp4(a, packed.T, None, ws.T, alpha, weight_layout="sm90")
        if m <= MT.PACKED_MAX_M:
            T.assert_mm_within_bound(same, a.float(), what, alpha)
            T.assert_mm_within_bound(row, a.float(), what, alpha)
        else:
            assert torch.equal(same, row), m
        got = t4.mm_fp4(a, packed.T, None, ws.T, alpha, weight_layout="sm90")
        if one == ts[0]:
            assert torch.equal(got, same), m
        else:   # two K groups: the even and odd stages summed apart, within the bound
            T.assert_mm_within_bound(got, a.float(), what, alpha)
        assert torch.equal(got, t4.mm_fp4(a, packed.T, None, ws.T, alpha, weight_layout="sm90"))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = t4.mm_fp4(a, packed.T, None, ws.T, alpha, weight_layout="sm90")
    out.fill_(float("nan"))
    graph.replay()
    assert torch.equal(out, got)


@pytest.mark.parametrize("acts", ["bf16", "fp4"])
def test_fp4linear_sm90_equals_row(acts):
    torch.manual_seed(0)
    lin = torch.nn.Linear(512, 384, device="cuda", dtype=torch.bfloat16)
    row = t4.FP4Linear.from_linear(lin, "nvfp4", acts, weight_layout="row")
    sm90 = t4.FP4Linear.from_linear(lin, "nvfp4", acts, weight_layout="sm90")
    for m in (1, 16, 129, 300):
        x = torch.randn(m, 512, device="cuda", dtype=torch.bfloat16)
        y_row, y_sm90 = row(x), sm90(x)
        # The small-M GEMM groups K differently per MMA step in the two layouts (spec 4b), and the
        # Hopper GEMM's heuristic may split K differently (its K stages are 128 wide on "sm90"
        # weights): the fp32 sums differ in their last bits (at most about K * 2^-24 of the sum of
        # the products' magnitudes), and RN(v + bias) by one ulp more
        ulp = torch.exp2(torch.floor(torch.log2(torch.maximum(y_row.float().abs(), y_sm90.float().abs()))) - 7)
        sums = x.float().abs() @ lin.weight.float().abs().T
        assert ((y_row.float() - y_sm90.float()).abs() <= ulp + sums * 2.0**-12).all(), m
        if m > mm_space.SMALL_M_MAX:   # the Hopper GEMM with one tactic for both layouts: the same bits
            with t4.use_tactic(WT.WgmmaMmTactic(64, 4, 2)):
                assert torch.equal(row(x), sm90(x)), m
    assert torch.equal(sm90.state_dict()["weight"], row.weight)


def test_fp4linear_defaults_to_sm90_on_hopper_and_follows_moves():
    torch.manual_seed(1)
    lin = torch.nn.Linear(512, 384, device="cuda", dtype=torch.bfloat16)
    mod = t4.FP4Linear.from_linear(lin)
    assert mod.weight_layout == "sm90"
    xs = [torch.randn(m, 512, device="cuda", dtype=torch.bfloat16) for m in (1, 16, 64)]
    ys = [mod(x) for x in xs]
    mod.cpu()
    assert mod.weight_layout == "row"
    mod.cuda()
    assert mod.weight_layout == "sm90"
    assert all(torch.equal(mod(x), y) for x, y in zip(xs, ys))
