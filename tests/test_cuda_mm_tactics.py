"""The cuda backend's mm_fp4 tactic spaces on the CPU (no GPU, no emulator): the small-M GEMM's
candidates, heuristic, refusals and cache key (kernels/cuda/mm_tactics.py), and which kernel the
cuda space (kernels/cuda/mm_space.py) puts first per M and weight layout."""
import dataclasses

import pytest
import torch

from torch_fp4 import formats as F
from torch_fp4.kernels.cuda import mm_tactics as MT
from torch_fp4.problems import MmProblem
from torch_fp4.testing import checked_candidates


def _args(m, n=8192, k=28672, a_dtype=torch.bfloat16, fmt=F.NVFP4, fp4=False, wlayout=F.WeightLayout.ROW):
    a = torch.empty(m, k // 2 if fp4 else k, dtype=torch.uint8 if fp4 else a_dtype)
    b = torch.empty(n, k // 2, dtype=torch.uint8).T
    return MmProblem.of(a, b, torch.empty(1, dtype=torch.uint8) if fp4 else None, torch.empty(1, dtype=torch.uint8),
                        None, torch.bfloat16, fmt, F.SfLayout.LAYOUT_128x4, wlayout)


def test_candidates_are_valid_compiled_and_default_first():
    offered = set()
    for m in (1, 8, 9, 16, 32, 33, 64):
        for n, k in ((8192, 28672), (28672, 8192), (200, 640), (1024, 4096)):
            for fmt in (F.NVFP4, F.MXFP4):
                cands = checked_candidates(MT, _args(m, n, k, fmt=fmt))
                offered |= {(MT.n_blocks(m), t.warps, t.tiles_per_warp, t.block_k) for t in cands}
    assert offered == {(nb, *s) for nb in (1, 2, 4, 8) for s in MT.TILE_SHAPES if MT.tile_compiled(nb, *s)}


def test_heuristic_splits_for_about_one_cta_per_sm():
    """The measured H100 choice: 4 stages and a split giving about one CTA per SM."""
    for m, shape in ((1, (4, 2, 256, 4)), (16, (8, 1, 256, 4)), (32, (8, 1, 256, 3)),
                     (64, (8, 1, 128, 4))):
        t = MT.default(_args(m))
        assert (t.warps, t.tiles_per_warp, t.block_k, t.stages) == shape
        assert t.split_k == 2  # 64 tiles of 128 rows x 2 <= 132 SMs
    assert MT.default(_args(16, n=28672, k=8192)).split_k == 1  # 224 tiles already fill the SMs
    assert MT.default(_args(1, n=1024, k=512)).split_k == 1  # two stages of 256 per split at least


def test_heuristic_for_sm90_weights():
    """'sm90' weights (H100 sweeps): 8 warps x 1 tile of K 256 from M = 1; at M <= 16 with more
    128-row tiles than SMs, 4 warps x 2 tiles of K 128."""
    sm90 = F.WeightLayout.SM90
    for m in (1, 8, 16):
        t = MT.default(_args(m, wlayout=sm90))
        assert (t.warps, t.tiles_per_warp, t.block_k, t.stages, t.split_k) == (8, 1, 256, 4, 2)
    t = MT.default(_args(16, n=28672, k=8192, wlayout=sm90))
    assert (t.warps, t.tiles_per_warp, t.block_k, t.stages, t.split_k) == (4, 2, 128, 4, 1)
    t = MT.default(_args(8, n=28672, k=8192, wlayout=sm90))
    assert (t.warps, t.tiles_per_warp, t.block_k) == (8, 1, 256)
    for m in (1, 16):
        args = _args(m, n=28672, k=8192, wlayout=sm90)
        assert MT.why_not(MT.default(args), args) is None


@pytest.mark.parametrize("change,msg", [
    (dict(block_k=48), "block_k=48 is not a multiple of the MXFP4 block (32)"),
    (dict(block_k=512), "block_k=512 must be 128 or 256"),
    (dict(warps=2), "is not compiled for M <= 16"),
    (dict(stages=7), "stages=7 must be one of"),
    (dict(split_k=16), "split_k=16 must be between 1 and 8"),
    (dict(split_k=8), "leaves an empty K slice"),
    (dict(stages=6, block_k=256), None),
])
def test_why_not_names_the_problem(change, msg):
    args = _args(16, k=1024, fmt=F.MXFP4)
    t = dataclasses.replace(MT.default(args), **change)
    reason = MT.why_not(t, args)
    assert (reason is None) if msg is None else (msg in reason), reason


def test_why_not_m_above_64_fp16_mxfp4_and_shared_memory(monkeypatch):
    """M and fp16 x MXFP4 are the small-M family's problem limits (problem_reason), which the cuda
    space checks before a tactic's own; shared memory is the tactic's."""
    from torch_fp4.kernels.cuda import mm_space

    for p, msg in ((_args(65), "for M <= 64 (decode); larger M uses triton"),
                   (_args(8, a_dtype=torch.float16, fmt=F.MXFP4), "fp16 activations with MXFP4")):
        assert msg in MT.problem_reason(p)
        assert msg in mm_space.MM_SPACE.why_not(MT.CudaMmTactic(), p)
    monkeypatch.setattr(MT, "SM90_SMEM_PER_BLOCK", 99 * 1024)  # an sm_120-sized GPU
    assert "KiB of shared memory" in MT.why_not(MT.CudaMmTactic(8, 1, 256, 4, 1), _args(16))


def test_key_buckets_m_by_n_blocks():
    assert MT.key(_args(9)) == MT.key(_args(16)) != MT.key(_args(17))
    assert MT.key(_args(16, fp4=True)) != MT.key(_args(16))


def test_sm90_weights_at_m_9_to_16_take_the_hopper_gemm_where_its_split_k_ranges_are_long():
    """M = 9-16 on "sm90" weights: the Hopper GEMM's heuristic tactic first where it is a split-K
    launch of at least mm_space.HOPPER_FIRST_K per split (8192 x 28672: split 2), the small-M kernel
    still a candidate; the small-M kernel first at M <= 8, on row-major weights, at shorter ranges
    (8192 x 8192) and where the Hopper GEMM would run persistent (28672 x 8192, 4096 x 14336)."""
    from torch_fp4.kernels.cuda import mm_space
    from torch_fp4.kernels.cuda import mm_wgmma_tactics as WT

    for m in (9, 12, 16):
        args = _args(m, wlayout=F.WeightLayout.SM90)
        t = mm_space.MM_SPACE.default(args)
        assert isinstance(t, WT.WgmmaMmTactic) and t == WT.default(args), t
        assert t.split_k == 2 and args.k // t.split_k >= mm_space.HOPPER_FIRST_K
        assert any(isinstance(c, MT.CudaMmTactic) for c in mm_space.MM_SPACE.candidates(args))
    for m, n, k, layout in ((8, 8192, 28672, F.WeightLayout.SM90), (16, 8192, 28672, F.WeightLayout.ROW),
                            (16, 8192, 8192, F.WeightLayout.SM90), (16, 28672, 8192, F.WeightLayout.SM90),
                            (16, 4096, 14336, F.WeightLayout.SM90)):
        args = _args(m, n, k, wlayout=layout)
        assert isinstance(mm_space.MM_SPACE.default(args), MT.CudaMmTactic), (m, n, k, layout)


def test_sm90_weights_take_the_small_m_kernel_up_to_m_32():
    """"sm90" weights: the small-M kernel up to PACKED_MAX_M (first in the cuda space's order, with
    the small-M heuristic's tile for those weights, up to mm_space.SMALL_M_MAX and, for weights of
    at most SMALL_WEIGHT elements, up to M = 32; a candidate to M = 32), the Hopper GEMM above; the
    refusal names the limit."""
    from torch_fp4.kernels.cuda import mm_space
    from torch_fp4.kernels.cuda import mm_wgmma_tactics as WT

    for m, k in ((1, 28672), (16, 8192)):   # (M = 9-16 at long K: the next test)
        args = _args(m, k=k, wlayout=F.WeightLayout.SM90)
        t = mm_space.MM_SPACE.default(args)
        assert isinstance(t, MT.CudaMmTactic) and t == MT.default(args)
        assert all(MT.why_not(c, args) is None for c in MT.candidates(args))
        assert MT.key(args) != MT.key(_args(m, k=k))
    args = _args(32, wlayout=F.WeightLayout.SM90)
    assert isinstance(mm_space.MM_SPACE.default(args), WT.WgmmaMmTactic)
    assert any(isinstance(c, MT.CudaMmTactic) for c in mm_space.MM_SPACE.candidates(args))
    for m in (17, 32):   # small "sm90" weights: the small-M kernel's 64-row CTAs, the only tile compiled there
        for n, k in ((4096, 4096), (1024, 4096)):
            args = _args(m, n, k, wlayout=F.WeightLayout.SM90)
            t = mm_space.MM_SPACE.default(args)
            assert isinstance(t, MT.CudaMmTactic) and (t.warps, t.tiles_per_warp) == (4, 1), t
            assert all((c.warps, c.tiles_per_warp) == (4, 1) for c in MT.candidates(args))
            assert "with sm90 weights" in MT.why_not(MT.CudaMmTactic(8, 1, 256, 3, 1), args)
        assert isinstance(mm_space.MM_SPACE.default(_args(m, 6144, 4096, wlayout=F.WeightLayout.SM90)),
                          WT.WgmmaMmTactic)
    args = _args(33, wlayout=F.WeightLayout.SM90)
    assert "reads 'sm90' weights for M <= 32" in MT.problem_reason(args)
    assert "reads 'sm90' weights for M <= 32" in mm_space.MM_SPACE.why_not(MT.CudaMmTactic(), args)
    assert MT.candidates(args) == []
    assert isinstance(mm_space.MM_SPACE.default(args), WT.WgmmaMmTactic)
    t = MT.CudaMmTactic(8, 1, 256, 4, 1)
    assert MT.smem_bytes(t, 2, 16, packed=True) < MT.smem_bytes(t, 2, 16)  # one pad per row, not per 8 units
