"""The Hopper wgmma GEMM's tactic space (kernels/cuda/mm_wgmma_tactics.py) and the cuda backend's
joined space (kernels/cuda/mm_space.py), on the CPU: the heuristic, the candidates, why a tactic
cannot run, the cache key and the shared-memory mirror of csrc/mm_wgmma.cu."""
import dataclasses
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import torch

from torch_fp4 import formats as F
from torch_fp4.kernels.cuda import mm_space as S
from torch_fp4.kernels.cuda import mm_tactics as SM
from torch_fp4.kernels.cuda import mm_wgmma_tactics as WT
from torch_fp4.problems import MmProblem
from torch_fp4.testing import checked_candidates


def _args(m, n=8192, k=28672, a_dtype=torch.bfloat16, fmt=F.NVFP4, layout=F.WeightLayout.ROW):
    a = torch.empty(m, k, dtype=a_dtype)
    b = torch.empty(n, k // 2, dtype=torch.uint8).T
    bs = torch.empty((-(-n // 128) * 128, -(-k // fmt.block_size // 4) * 4), dtype=torch.uint8).T
    return MmProblem.of(a, b, None, bs, None, torch.bfloat16, fmt, F.SfLayout.LAYOUT_128x4, layout)


@pytest.mark.parametrize("m,n,want", [(17, 8192, 2), (64, 8192, 2), (65, 8192, 1), (64, 28672, 1),
                                      (32, 28672, 1), (256, 8192, 1)])
def test_two_k_groups_for_sm90_split_k_at_block_m_64(m, n, want):
    """Two K groups where the heuristic takes split-K at block_m <= 64 on "sm90" weights (the
    two-CTA persistent launches keep one), never on row-major weights, which they refuse."""
    sm90 = _args(m, n, layout=F.WeightLayout.SM90)
    t = WT.default(sm90)
    assert t.k_groups == want, t
    assert t.k_groups == 1 or (t.split_k > 1 and t.ctas_per_sm == 1 and t.stages >= WT.K_GROUPS_MIN_STAGES)
    assert WT.why_not(t, sm90) is None
    row = _args(m, n)
    assert WT.default(row).k_groups == 1
    assert all(c.k_groups == 1 for c in WT.candidates(row))
    assert any(c.k_groups == 2 for c in WT.candidates(sm90))   # block_m 32 and 64 are always candidates
    two = WT.WgmmaMmTactic(64, 6, 2, False, 1, False, 2)
    assert WT.why_not(two, sm90) is None
    assert "k_groups=2 reads 'sm90' weights only" in WT.why_not(two, row)


@pytest.mark.parametrize("m,n,want", [(17, 8192, (32, 2)), (32, 8192, (32, 2)), (33, 8192, (64, 2)),
                                      (64, 8192, (64, 2)), (128, 8192, (128, 2)), (256, 8192, (256, 2)),
                                      (1024, 8192, (256, 1)), (4096, 8192, (256, 1)), (64, 28672, (64, 1)),
                                      (32, 28672, (32, 1)), (128, 28672, (128, 1)), (64, 12288, (64, 1)),
                                      (65, 8192, (96, 2)), (96, 8192, (96, 2)), (97, 8192, (128, 2)),
                                      (80, 28672, (96, 1)),
                                      (129, 8192, (160, 2)), (192, 8192, (192, 2)), (193, 8192, (224, 2)),
                                      (257, 8192, (160, 1)), (320, 8192, (160, 1)), (384, 8192, (192, 1)),
                                      (385, 8192, (224, 1)), (448, 8192, (224, 1))])
def test_heuristic_from_h100_sweeps(m, n, want):
    """Smallest block_m covering M up to 256; above, the block_m of least padding and wave waste
    (_launch_cost: two tiles of 160 at M = 257-320, of 224 at M = 385-448), split-K up to about
    one CTA per SM, persistent without split-K, two CTAs per SM at block_m 32 once the tiles
    outnumber the SMs, most stages."""
    t = WT.default(_args(m, n))
    assert (t.block_m, t.split_k) == want
    assert t.persistent == (t.split_k == 1)
    tiles = -(-m // t.block_m) * -(-n // WT.ROWS)
    assert t.ctas_per_sm == (2 if t.block_m <= WT.TWO_CTA_AUTO_MAX_BLOCK_M and tiles >= WT.TWO_CTA_AUTO_FILL * 264
                             else 1)
    limit = WT.SM90_SMEM_PER_BLOCK if t.ctas_per_sm == 1 else (WT.SM90_SMEM_PER_SM - 2048) // 2
    assert t.stages == WT.max_stages(t.block_m, limit, t.persistent, ctas_per_sm=t.ctas_per_sm, packed=False)
    assert WT.why_not(t, _args(m, n)) is None


@pytest.mark.parametrize("m,n,k,want", [
    (320, 8192, 8192, (160, False)), (448, 28672, 8192, (224, True)), (576, 8192, 8192, (192, True)),
    (640, 8192, 8192, (160, False)), (704, 8192, 8192, (192, False)), (2000, 8192, 8192, (256, False)),
    (576, 8192, 28672, (192, True)), (640, 8192, 28672, (160, False)), (1024, 8192, 28672, (256, False))])
def test_block_m_by_launch_cost_where_a_sweep_measured_it_fastest(m, n, k, want):
    """Above M = 128, the block_m (and stream-K) of least padding and wave waste (_launch_cost), at
    points where scripts/sweep_block_m.py measured that tactic fastest or within 2.5% of it (H200,
    docs/benchmarks/mm_block_m_sweep_h200.txt); stream-K spans the activations of up to 36 MB of
    m-tiles (576 x 28672: three 192-row tiles, 33 MB)."""
    t = WT.default(_args(m, n, k, layout=F.WeightLayout.SM90))
    assert (t.block_m, t.stream_k) == want, t
    assert t.persistent and t.split_k == 1


@pytest.mark.parametrize("m,n,k,layout,want", [
    (64, 4096, 4096, "sm90", (32, 2, 1, False)), (128, 4096, 4096, "sm90", (64, 2, 1, False)),
    (256, 4096, 4096, "sm90", (128, 2, 1, False)), (32, 4096, 4096, "sm90", (32, 3, 1, False)),
    (32, 4096, 14336, "sm90", (32, 1, 1, True)), (128, 4096, 14336, "sm90", (128, 1, 1, True)),
    (256, 4096, 14336, "sm90", (128, 2, 1, False)), (256, 2304, 14336, "sm90", (256, 1, 1, True)),
    (160, 4096, 14336, "sm90", (128, 2, 1, False)), (160, 2304, 14336, "sm90", (160, 1, 1, True)),
    (128, 3584, 3584, "sm90", (64, 2, 1, False)), (96, 2048, 4096, "sm90", (32, 2, 1, False)),
    (192, 1536, 4096, "sm90", (96, 4, 1, False)), (64, 512, 3584, "sm90", (32, 7, 1, False)),
    (128, 8192, 8192, "sm90", (128, 2, 1, False)),
    (128, 3584, 3584, "row", (64, 2, 1, False)), (96, 2048, 4096, "row", (96, 5, 1, False)),
    (64, 2048, 4096, "row", (64, 5, 1, False)), (128, 1024, 4096, "row", (128, 8, 1, False))])
def test_few_tiles_take_the_split_k_launch_of_least_time_per_sm(m, n, k, layout, want):
    """Where split 2 cannot fill the SMs (mm_wgmma_tactics._few_tiles): block_m 128 at split 2 in
    place of 256 where it fills them, then stream-K over every slot for long K (each tile over at
    most SK_MAX_PARTS CTAs), else the one-CTA-per-SM split-K launch of the fewest K steps per CTA
    times (block_m + FEW_TILES_FIXED_ROWS) among those whose clusters all run at once; the sweep
    (H200, scripts/sweep_few_tiles.py, every split-K launch timed) had each of these within 5% of
    the fastest, e.g. 3584 x 3584 M = 128: 14.7 us (fastest 14.4; the rule before, block_m 32 at
    split 2, 24.1), 2048 x 4096 M = 96: 13.3 (12.8; before: block_m 96 at split 8, 16 clusters of 8
    that do not all fit at once, 22.1); (block_m, split_k, ctas_per_sm, stream_k)."""
    p = _args(m, n, k, layout=F.WeightLayout(layout))
    t = WT.default(p)
    assert (t.block_m, t.split_k, t.ctas_per_sm, t.stream_k) == want, t
    assert t.persistent == (t.split_k == 1) and WT.why_not(t, p) is None
    assert t.k_groups == _want_k_groups(t, layout == "sm90")


def _want_k_groups(t, sm90: bool) -> int:
    """The heuristic's K groups: two on "sm90" weights at one CTA per SM, for split-K at block_m <= 64
    and for persistent launches at block_m 32."""
    return 2 if sm90 and t.ctas_per_sm == 1 and (t.block_m <= WT.K_GROUPS_PERSISTENT_MAX_BLOCK_M or
                                                 (t.split_k > 1 and t.block_m <= 64)) else 1


@settings(max_examples=300, deadline=None)
@given(m=st.integers(17, 256), n_tiles=st.integers(1, 44), k_steps=st.integers(8, 256),
       layout=st.sampled_from(["sm90", "row"]), sms=st.sampled_from([114, 132]))
def test_split_k_clusters_all_run_at_once(m, n_tiles, k_steps, layout, sms):
    """No split-K launch of the heuristic has more clusters of one-CTA-per-SM CTAs than run at once
    (clusters_at_once: beyond it a second wave doubles the time), on 132 SMs or fewer."""
    p = _args(m, 128 * n_tiles, 64 * k_steps, layout=F.WeightLayout(layout))
    with mock.patch.object(WT, "problem_sm_count", lambda problem, default=132: sms):
        t = WT.default(p)
    assert WT.why_not(t, p) is None
    if t.split_k > 1:
        clusters = -(-m // t.block_m) * n_tiles
        assert clusters <= (WT.clusters_at_once(t.split_k, sms) * t.ctas_per_sm if t.split_k > 2 else sms * t.ctas_per_sm), t
        assert t.split_k <= 2 or t.ctas_per_sm == 1, t


@pytest.mark.parametrize("m,n,k,want", [
    (8, 4096, 4096, (4, 1, 256, 2, 8)), (16, 4096, 4096, (4, 1, 256, 4, 2)), (1, 2048, 8192, (4, 1, 256, 2, 8)),
    (16, 2048, 14336, (4, 1, 256, 4, 4)), (16, 1024, 4096, (4, 1, 256, 4, 8)),
    (1, 4096, 14336, (4, 2, 128, 4, 7)), (16, 4096, 14336, (4, 2, 128, 4, 7)), (8, 3072, 8192, (4, 2, 128, 4, 8)),
    (16, 3584, 18944, (4, 2, 128, 4, 8)), (1, 4096, 28672, (4, 2, 128, 4, 7)),
    (1, 8192, 28672, (8, 1, 256, 4, 2)), (16, 8192, 8192, (8, 1, 256, 4, 2)),
    (1, 9216, 4096, (4, 2, 128, 4, 3)), (16, 14336, 4096, (4, 2, 128, 4, 2)), (8, 5120, 8192, (4, 2, 128, 4, 5)),
    (1, 16384, 4096, (4, 2, 128, 4, 2)), (16, 6144, 4096, (4, 2, 128, 4, 4)), (1, 5120, 5120, (4, 2, 128, 4, 5)),
    (16, 10240, 8192, (4, 2, 128, 4, 2)), (1, 16384, 8192, (8, 1, 256, 4, 1)), (1, 28672, 8192, (8, 1, 256, 4, 1)),
    (16, 28672, 8192, (4, 2, 128, 4, 1))])
def test_small_m_sm90_weights_heuristic(m, n, k, want):
    """"sm90" weights with at most SMs / 4 tiles of 128 rows (N <= ~4200) take 64-row CTAs with
    split-K over the resident slots (M <= 8) or about one wave (M <= 16); at K >= 8192 with at least
    SMs / 6 of those tiles (N >= ~2900), and from SMs / 4 up to SMs tiles unless the 8-warp CTAs of
    one 128-row tile fill 95% of the SMs at K >= 8192 (N = 8192, 16384), 128-row CTAs of 4 warps x
    2 tiles, 4 stages of K = 128, split-K up to 1.75 x SMs CTAs and at least 2
    (mm_tactics._two_tile_ctas); more tiles than SMs keep their heuristic;
    (warps, tiles_per_warp, block_k, stages, split_k)."""
    p = _args(m, n, k, layout=F.WeightLayout.SM90)
    t = S.default(p)
    assert isinstance(t, SM.CudaMmTactic)
    assert (t.warps, t.tiles_per_warp, t.block_k, t.stages, t.split_k) == want, t
    assert S.why_not(t, p) is None


@pytest.mark.parametrize("m,n,k,want", [
    (1, 9216, 4096, (4, 2, 256, 2, 3)), (16, 14336, 4096, (4, 2, 256, 2, 2)), (8, 5120, 27648, (4, 2, 256, 2, 5)),
    (16, 10240, 8192, (4, 2, 256, 2, 2)), (1, 6144, 4096, (4, 2, 256, 2, 4)),
    (1, 8192, 8192, (4, 2, 256, 4, 2)), (16, 8192, 28672, (8, 1, 256, 4, 2)), (1, 4096, 14336, (4, 2, 256, 2, 7)),
    (16, 3584, 18944, (4, 2, 256, 2, 8)), (8, 3072, 8192, (4, 2, 256, 2, 8)),
    (16, 4096, 4096, (4, 2, 256, 2, 6)), (1, 2048, 8192, (4, 2, 256, 2, 8)), (16, 2048, 4096, (4, 2, 256, 2, 8)),
    (1, 1024, 8192, (4, 2, 256, 4, 8)), (16, 1024, 4096, (8, 1, 256, 4, 8)), (1, 28672, 8192, (4, 2, 256, 4, 1))])
def test_small_m_row_major_weights_two_tile_ctas(m, n, k, want):
    """Row-major weights take 4 warps x 2 tiles with 2 stages of K = 256 at _two_tile_ctas' split
    from SMs / 9 tiles of 128 rows (SMs / 6 at K >= 8192) up to SMs / 4, and from there up to SMs
    where the CTAs of one tile leave SMs idle or K < 8192; fewer tiles (N = 1024), more, and
    N = 8192 at long K keep their heuristic."""
    t = S.default(_args(m, n, k))
    assert isinstance(t, SM.CudaMmTactic)
    assert (t.warps, t.tiles_per_warp, t.block_k, t.stages, t.split_k) == want, t
    assert S.why_not(t, _args(m, n, k)) is None


def test_candidates_valid_unique_default_first():
    for m in (17, 33, 64, 129, 300, 4097):
        for n, k in ((8192, 28672), (28672, 8192), (200, 704)):
            for fmt in (F.NVFP4, F.MXFP4):
                checked_candidates(WT, _args(m, n, k, fmt=fmt))


@pytest.mark.parametrize("change,msg", [
    (dict(block_m=80), "block_m=80 must be one of"),
    (dict(stages=2), "stages=2 must be between 3 and 12"),
    (dict(split_k=9, persistent=False), "split_k=9 must be between 1 and 8"),
    (dict(split_k=8, persistent=False), "leaves an empty K slice"),
    (dict(block_m=256, stages=7), "KiB of shared memory"),
    (dict(split_k=2, persistent=True), "persistent=True needs split_k=1"),
    (dict(split_k=2, persistent=False, stream_k=True), "stream_k=True needs persistent=True"),
    (dict(block_m=256, stages=6, split_k=1, persistent=True), "KiB of shared memory"),
    (dict(block_m=128, ctas_per_sm=2), "ctas_per_sm=2 must be 1, or 2 with block_m <= 64"),
    (dict(block_m=64, stages=12, ctas_per_sm=2), "KiB of shared memory"),
    (dict(block_m=128, stages=6, k_groups=2), "k_groups=2 must be 1, or 2 with ctas_per_sm=1 and block_m <= 64"),
    (dict(block_m=64, stages=6, ctas_per_sm=2, k_groups=2), "k_groups=2 must be 1, or 2 with ctas_per_sm=1"),
    (dict(block_m=64, stages=4, k_groups=3), "k_groups=3 must be 1, or 2"),
    (dict(block_m=64, stages=5, split_k=1, persistent=True, k_groups=2), "k_groups=2 needs stages >= 6"),
])
def test_why_not_names_the_problem(change, msg):
    args = _args(300, k=384)
    t = dataclasses.replace(WT.default(args), **change)
    assert msg in WT.why_not(t, args)


@pytest.mark.parametrize("n,k,layout,want", [
    (28672, 8192, "sm90", (2, 1, False)), (28672, 4096, "sm90", (2, 1, False)),
    (20480, 8192, "sm90", (1, 2, True)), (20480, 4096, "sm90", (1, 2, True)), (24576, 8192, "sm90", (1, 2, True)),
    (12288, 8192, "sm90", (1, 2, False)), (14336, 4096, "sm90", (1, 2, False)),
    (20480, 8192, "row", (1, 1, True)), (28672, 8192, "row", (2, 1, False))])
def test_block_m_32_takes_two_ctas_per_sm_only_where_its_tiles_fill_them(n, k, layout, want):
    """At block_m 32 two CTAs per SM where the tiles fill TWO_CTA_AUTO_FILL of the 264 two-CTA slots
    (224 tiles at N = 28672); with fewer, one CTA per SM, persistent, two K groups on "sm90" weights,
    stream-K where stream_k_pays (H200, M = 32, 160 tiles at N = 20480, K = 8192: "sm90" 54.5 -> 41.6
    us, row-major 73.8 -> 56.8; docs/benchmarks/mm_two_ctas_and_stream_k_cost_h200.txt);
    (ctas_per_sm, k_groups, stream_k)."""
    p = _args(32, n, k, layout=F.WeightLayout(layout))
    t = WT.default(p)
    assert (t.block_m, t.split_k) == (32, 1) and t.persistent, t
    assert (t.ctas_per_sm, t.k_groups, t.stream_k) == want, t
    assert WT.why_not(t, p) is None


@pytest.mark.parametrize("m,n,k,want", [(256, 28672, 8192, True), (512, 28672, 8192, True),
                                        (128, 28672, 8192, True), (64, 28672, 8192, True),
                                        (32, 28672, 8192, False),
                                        (1024, 28672, 8192, False), (1024, 8192, 8192, False),
                                        (1024, 8192, 28672, False), (256, 8192, 28672, False),
                                        (4096, 8192, 8192, False)])
def test_stream_k_where_the_last_wave_idles(m, n, k, want):
    """Stream-K on persistent launches whose last wave leaves >= 10% of the 132 CTA slots idle and
    whose stream-K tiles' activations fit half the L2; never without persistent."""
    t = WT.default(_args(m, n, k))
    assert t.stream_k == want, t
    assert not t.stream_k or t.persistent
    assert not WT.stream_k_pays(4 * 132, 132, 64, 256, 8192)          # whole waves
    assert not WT.stream_k_pays(224, 132, 8, 256, 28672)              # 59 MB of activations at once
    # Less than one wave: at long K, tiles of 128 rows or more, more than SK_WAVE_COST of the slots idle.
    assert WT.stream_k_pays(100, 132, 64, 256, 8192) and WT.stream_k_pays(112, 132, 28, 224, 18944)
    assert not WT.stream_k_pays(100, 132, 64, 256, 4096)              # short K
    assert not WT.stream_k_pays(100, 132, 64, 64, 8192)               # 64-row tiles
    assert not WT.stream_k_pays(120, 132, 40, 128, 8192)              # 9% of the slots idle


@pytest.mark.parametrize("m,n,k,want", [(64, 28672, 4096, (64, False)), (128, 28672, 4096, (128, False)),
                                        (256, 28672, 4096, (256, False)), (64, 28672, 2048, (64, False)),
                                        (256, 28672, 2048, (256, False)), (64, 20480, 4096, (64, True)),
                                        (128, 20480, 4096, (128, True)), (64, 28672, 8192, (64, True)),
                                        (512, 28672, 2048, (256, True)), (1024, 14336, 2048, (256, True))])
def test_stream_k_at_short_k_where_the_idle_slots_outweigh_its_cost(m, n, k, want):
    """Where the tiles fill less than two waves, stream-K also needs more idle slots than its own cost,
    about SK_COST_STEPS 64-K steps of a slot (sk_waves): 224 tiles on 132 slots (0.30 of a wave idle)
    take it at K = 8192 but not at K = 4096 or 2048; 160 tiles (0.79 idle) take it at K = 4096 (H200,
    "sm90" 28672 x 4096 M = 64 39.9 -> 38.2 us, 28672 x 2048 M = 64 25.7 -> 22.2); from two waves on,
    the rule before (448 tiles at K = 2048 ran faster with it). block_m is chosen as at long K
    (_launch_cost: 256 at 256 x 28672 x 4096, not 128 with stream-K: 94.2 against 102.8 us);
    (block_m, stream_k)."""
    for layout in (F.WeightLayout.SM90, F.WeightLayout.ROW):
        t = WT.default(_args(m, n, k, layout=layout))
        assert (t.block_m, t.stream_k) == want, (layout, t)
    # At K >= 8192 the cost is below SK_MIN_IDLE of two waves, so the rule before decides alone.
    assert WT.sk_waves(8192) < 2 * WT.SK_MIN_IDLE and WT.sk_waves(4096) > 0.30 and WT.sk_waves(2048) > 0.6


@pytest.mark.parametrize("m,n,k,want", [
    (224, 5120, 8192, (128, 1, True)), (288, 5120, 8192, (160, 1, True)), (576, 3584, 18944, (192, 1, True)),
    (144, 12288, 8192, (160, 1, True)), (304, 6144, 16384, (160, 1, True)), (496, 6144, 8192, (256, 1, True)),
    (449, 4096, 14336, (256, 2, False)), (640, 4096, 14336, (160, 1, False)), (784, 2048, 8192, (224, 2, False)),
    (160, 14336, 4096, (160, 1, False))])
def test_stream_k_below_one_wave(m, n, k, want):
    """Tiles of 128 rows or more filling less than one wave, at long K, share their K steps over every
    slot where that costs less than the alternatives (_launch_cost: SK_WAVE_COST past half a wave),
    at points where scripts/ab_stream_k_one_wave.py measured it faster (H200: 5120 x 8192 M = 224
    59.1 -> 42.6 us, 3584 x 18944 M = 576 135.5 -> 109.4); split 2 and whole waves of smaller tiles
    stay where they measured faster (4096 x 14336 M = 449 79.1 against 88.9, M = 640 102.1 against
    110.6, 2048 x 8192 M = 784 44.9 against 48.9); never at K = 4096 (14336 x 4096 M = 160, 112
    tiles: 31.3 against 37.0); (block_m, split_k, stream_k)."""
    t = WT.default(_args(m, n, k, layout=F.WeightLayout.SM90))
    assert (t.block_m, t.split_k, t.stream_k) == want, t


def test_problem_limits():
    assert "K % 32 == 0" in WT.problem_reason(_args(64, k=400))
    assert "fp16 activations with MXFP4" in WT.problem_reason(_args(64, a_dtype=torch.float16, fmt=F.MXFP4))
    assert WT.problem_reason(_args(64, a_dtype=torch.float16)) is None
    assert WT.candidates(_args(64, k=400)) == []


def test_smem_mirror_of_the_kernel():
    """smem_bytes in mm_wgmma.cu: 3 KiB + max(stages x stage, epilogue tile); a stage is its 64-K
    sub-tiles' activations and weights, then a 1 KiB slot per sub-tile (the scale words, and with
    two sub-tiles then their multipliers)."""
    one = dict(ctas_per_sm=1, packed=True)
    assert WT.stage_bytes(256, **one) == 256 * 128 + 128 * 32 + 1024
    assert WT.stage_bytes(64, **one) == 2 * (64 * 128 + 128 * 32 + 1024)
    assert WT.stage_bytes(64, ctas_per_sm=1, packed=False) == WT.stage_bytes(64, **one)
    assert WT.smem_bytes(64, 3, **one) == 3 * 1024 + 3 * WT.stage_bytes(64, **one)
    assert WT.smem_bytes(256, 2, **one) == 3 * 1024 + 256 * 132 * 4  # the epilogue tile is larger
    # Persistent: the stages plus two warpgroups' staging areas [min(32, block_m)][68] fp32.
    assert (WT.smem_bytes(256, 2, persistent=True, **one)
            == 3 * 1024 + 2 * WT.stage_bytes(256, **one) + 2 * 32 * 68 * 4)
    # Two K groups: 16 KiB more for their exchange area (16 fp32 x 128 threads per 64-row group).
    assert WT.smem_bytes(64, 3, k_groups=2, **one) == WT.smem_bytes(64, 3, **one) + 2 * 16 * 128 * 4
    for bm in WT.BLOCK_MS:
        for persistent in (False, True):
            for kg in (1, 2):
                for packed in (False, True):
                    kw = dict(ctas_per_sm=1, packed=packed)
                    most = WT.max_stages(bm, persistent=persistent, k_groups=kg, **kw)
                    assert WT.smem_bytes(bm, most, persistent, kg, **kw) <= WT.SM90_SMEM_PER_BLOCK
                    assert (most == WT.MAX_STAGES
                            or WT.smem_bytes(bm, most + 1, persistent, kg, **kw) > WT.SM90_SMEM_PER_BLOCK)
                    assert most >= WT.MIN_STAGES


def test_stage_k_where_two_sub_tiles_measured_faster():
    """128-K stages (two 64-K sub-tiles per barrier pair) for either weight layout up to block_m
    128; 64-K stages from block_m 160 up and at block_m 64 with two CTAs per SM. Every launch kind
    keeps at least MIN_STAGES."""
    assert WT.BLOCK_MS == (32, 64, 96, 128, 160, 192, 224, 256)
    for packed in (True, False):
        assert [WT.stage_k(bm, 1, packed) for bm in WT.BLOCK_MS] == [128, 128, 128, 128, 64, 64, 64, 64]
        assert (WT.stage_k(32, 2, packed), WT.stage_k(64, 2, packed)) == (128, 64)
    two = (WT.SM90_SMEM_PER_SM - 2048) // 2
    for bm in (32, 64):
        for packed in (False, True):
            assert WT.max_stages(bm, two, True, ctas_per_sm=2, packed=packed) >= WT.MIN_STAGES
    # Split-K counts whole stages: K = 1408 is 11 stages of 128 K (the last one of 64) at block_m 64
    # and 22 of 64 K at block_m 256, so a split of 8 leaves a slice empty at block_m 64 only.
    for layout in (F.WeightLayout.SM90, F.WeightLayout.ROW):
        p = _args(64, k=1408, layout=layout)
        assert WT.why_not(WT.WgmmaMmTactic(64, 6, 6), p) is None
        assert "empty K slice" in WT.why_not(WT.WgmmaMmTactic(64, 6, 8), p)
        assert WT.why_not(WT.WgmmaMmTactic(256, 4, 8), _args(256, k=1408, layout=layout)) is None


def test_joined_space_picks_the_family_by_m():
    assert isinstance(S.default(_args(16)), SM.CudaMmTactic)
    assert isinstance(S.default(_args(17)), WT.WgmmaMmTactic)
    # K not a multiple of 32: the Hopper kernel cannot run, the small-M one takes M <= 64.
    assert isinstance(S.default(_args(40, k=400)), SM.CudaMmTactic)
    cands = S.candidates(_args(32))
    assert cands[0] == S.default(_args(32))
    assert {type(t) for t in cands} == {SM.CudaMmTactic, WT.WgmmaMmTactic}
    assert S.key(_args(64)) == SM.key(_args(64)) and S.key(_args(65)) == WT.key(_args(65))
    # From 65 to 1024, where the heuristic's block_m changes with M, buckets of 32 rows.
    assert WT.key(_args(65)) == WT.key(_args(96)) != WT.key(_args(97)) == WT.key(_args(128)) != WT.key(_args(129))
    assert WT.key(_args(129)) == WT.key(_args(160)) != WT.key(_args(161)) == WT.key(_args(192))
    assert WT.key(_args(993)) == WT.key(_args(1024)) != WT.key(_args(1025)) == WT.key(_args(2048))
