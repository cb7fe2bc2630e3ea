"""mm_fp4's bias on the GPU backends (spec section 5): out = RN_out(RN_fp32(v + bias)) with v the
same tactic's fp32 output, bit for bit, for every epilogue of the cuda GEMMs (small-M; the Hopper
GEMM's one-tile, split-K, persistent staged and TMA-store, stream-K, two-CTA and two-K-group
paths), every bias dtype and 16-bit output, and for the triton backend's fp32-then-add path;
N not a multiple of 4 or 8 (the last columns' bias); outputs NaN-poisoned at allocation; a
CUDA graph reads the bias when it replays; FP4Linear's forward is that one call.
"""
import pytest
import torch

import torch_fp4 as t4
from torch_fp4 import formats as F
from torch_fp4 import testing as T
from torch_fp4.kernels.cuda import mm_space
from torch_fp4.kernels.cuda import mm_tactics as MT
from torch_fp4.kernels.cuda import mm_wgmma_tactics as WT
from torch_fp4.problems import MmProblem

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poisoned_fresh_tactics")]
BIAS_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def _operands(m, n, k, fmt, sm90=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    wd, ws, gs = T.quantized_weight(n, k, fmt, "cuda")
    a = (torch.randn(m, k, generator=g) * 2).to(torch.bfloat16).cuda()
    w = t4.prepack_weight(wd) if sm90 else wd
    return a, w, ws, (gs if fmt is F.NVFP4 else None)


def _check(a, w, ws, gs, fmt, layout, out_dtypes=(torch.bfloat16, torch.float16, torch.float32), **kw):
    """Every bias dtype and output dtype: the bias call equals the composition of the fp32 call."""
    n = w.shape[0]
    for bias_dtype in BIAS_DTYPES:
        bias = (torch.randn(n, device="cuda") * 3).to(bias_dtype)
        v = t4.mm_fp4(a, w.T, None, ws.T, None, torch.float32, fmt.block_size, weight_layout=layout,
                      b_global_scale=gs, **kw)
        for out_dtype in out_dtypes:
            if out_dtype == torch.float16 and fmt is F.MXFP4:
                continue
            got = t4.mm_fp4(a, w.T, None, ws.T, None, out_dtype, fmt.block_size, weight_layout=layout,
                            b_global_scale=gs, bias=bias, **kw)
            want = (v + bias.float()).to(out_dtype)
            assert torch.equal(got, want), (bias_dtype, out_dtype, (got.float() - want.float()).abs().max().item())


def _wgmma_tactics(sm90: bool):
    """One tactic per epilogue path of the Hopper GEMM."""
    out = [WT.WgmmaMmTactic(64, 4, 1, False),                 # one tile per CTA
           WT.WgmmaMmTactic(128, 4, 3, False),                # split-K through the cluster
           WT.WgmmaMmTactic(256, 4, 2, False),                # split 2: each rank stores half the rows
           WT.WgmmaMmTactic(192, 4, 2, False),                # the same at block_m 192 (rounds of 4 words)
           WT.WgmmaMmTactic(192, 4, 1, True),
           WT.WgmmaMmTactic(160, 4, 2, False),                # unequal shares (96 + 64 rows, 128 + 96)
           WT.WgmmaMmTactic(224, 4, 2, False),
           WT.WgmmaMmTactic(160, 4, 1, True),
           WT.WgmmaMmTactic(64, 4, 1, True),                  # persistent: TMA stores or staged
           WT.WgmmaMmTactic(64, 4, 1, True, stream_k=True),   # stream-K
           WT.WgmmaMmTactic(32, 4, 1, True, ctas_per_sm=2),   # two CTAs per SM (96 registers)
           WT.WgmmaMmTactic(256, 4, 1, True)]
    if sm90:
        out += [WT.WgmmaMmTactic(64, 6, 2, False, k_groups=2), WT.WgmmaMmTactic(64, 6, 1, True, k_groups=2)]
    return out


@pytest.mark.parametrize("fmt_name", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("sm90", [False, True], ids=["row", "sm90"])
def test_wgmma_every_epilogue(fmt_name, sm90):
    if not _hopper():
        pytest.skip("the wgmma GEMM runs on sm_90 only")
    fmt = {"nvfp4": F.NVFP4, "mxfp4": F.MXFP4}[fmt_name]
    # row: N = 1003 (odd: the staged stores, a partial last weight tile); sm90: N % 128 == 0
    n, k = (1024, 704) if sm90 else (1003, 704)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for m in (33, 3 * sms * 64 // -(-n // WT.ROWS) + 5):   # one wave; about three tiles per SM
        a, w, ws, gs = _operands(m, n, k, fmt, sm90, seed=m)
        for t in _wgmma_tactics(sm90):
            with t4.use_tactic(t):
                _check(a, w, ws, gs, fmt, "sm90" if sm90 else "row", backend="cuda")


@pytest.mark.parametrize("fmt_name", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("sm90", [False, True], ids=["row", "sm90"])
def test_small_m_every_tile(fmt_name, sm90):
    fmt = {"nvfp4": F.NVFP4, "mxfp4": F.MXFP4}[fmt_name]
    n, k = (512, 768) if sm90 else (330, 768)
    for m in (1, 5, 16):
        a, w, ws, gs = _operands(m, n, k, fmt, sm90, seed=m)
        ran = 0
        for warps, tiles, bk in MT.TILE_SHAPES:
            for split in (1, 3):
                t = MT.CudaMmTactic(warps, tiles, bk, 2, split)
                problem = MmProblem.of(a, w.T, None, ws.T, None, torch.bfloat16, fmt, F.SfLayout.LAYOUT_128x4,
                                       F.WeightLayout.SM90 if sm90 else F.WeightLayout.ROW)
                if mm_space.why_not(t, problem) is not None:
                    continue
                with t4.use_tactic(t):
                    _check(a, w, ws, gs, fmt, "sm90" if sm90 else "row", backend="cuda")
                ran += 1
        assert ran >= 2, (m, sm90)


def test_triton_and_auto():
    """The triton backend adds the bias to its fp32 result with torch ops: the same bits."""
    fmt = F.NVFP4
    for m in (1, 40, 300):
        a, w, ws, gs = _operands(m, 250, 512, fmt, seed=m)
        _check(a, w, ws, gs, fmt, "row", backend="triton")
        _check(a, w, ws, gs, fmt, "row")


def test_quantize_a_and_graph_replay_reads_the_bias():
    fmt = F.NVFP4
    a, w, ws, gs = _operands(20, 512, 1024, fmt, sm90=_hopper(), seed=4)
    layout = "sm90" if _hopper() else "row"
    gs_a = t4.compute_global_scale(a)
    _check(a, w, ws, gs, fmt, layout, quantize_a=True, a_global_scale=gs_a)
    bias = torch.randn(512, device="cuda", dtype=torch.bfloat16)
    call = lambda: t4.mm_fp4(a, w.T, None, ws.T, b_global_scale=gs, weight_layout=layout, bias=bias)  # noqa: E731
    eager = call()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    out.fill_(float("nan"))
    graph.replay()
    assert torch.equal(out, eager)
    bias.mul_(-3.0)
    graph.replay()
    assert torch.equal(out, call())
    assert not torch.equal(out, eager)


def test_fp4linear_forward_is_the_fused_bias():
    lin = torch.nn.Linear(256, 200, bias=True).to("cuda", torch.bfloat16)
    mod = t4.nn.FP4Linear.from_linear(lin)
    x = torch.randn(7, 256, device="cuda", dtype=torch.bfloat16)
    w = mod.weight
    v = t4.mm_fp4(x, w.T, None, mod.weight_scale.T, None, torch.float32, weight_layout=mod.weight_layout,
                  b_global_scale=mod.weight_global_scale)
    assert torch.equal(mod(x), (v + mod.bias.float()).to(torch.bfloat16))
