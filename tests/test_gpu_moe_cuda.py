"""The cuda backend's fused_moe (grouped small-M GEMMs at decode sizes, grouped Hopper GEMMs from
16 routed rows per expert: torch_fp4/kernels/cuda/moe.py) on an H100
against the reference backend on the same device (spec section 6), with the data and tolerances
of tests/test_gpu_moe.py: grid-exact problems must be bit-identical to the reference (every
tactic, every token count's default tactic, N and K not multiples of the 128-row weight tile,
CUDA-graph replays with changed routing; expert parallelism, empty experts, one expert, T = 1,
top_k = E, fp16 input, every output dtype and out-of-range ids run in tests/test_gpu_moe.py for
both backends); random problems within that module's tolerance. Outputs are poisoned (NaN) at
allocation.
"""
from __future__ import annotations

import pytest
import torch

import torch_fp4 as t4
from torch_fp4.kernels import _common

from test_gpu_moe import (BF16, DEV, assert_close_moe, assert_same, exact_gpt_oss_problem, exact_problem,
                          pair_outputs, random_problem, random_routing)

pytestmark = pytest.mark.gpu
QUICK = {
    "test_exact_every_tactic": {"w4a16", "w4a4"},
    "test_exact_small_m_tactics": {"w4a16", "w4a4"},
    "test_graph_replayed_with_new_routing_no_sync_same_bits": {"160-w4a16", "4-w4a4"},
    "test_exact_token_counts": {"300-w4a16", "64-w4a4", "1-w4a4", "5-w4a16"},
    "test_random_model_shapes": {"mixtral-w4a16", "qwen3-w4a4"},
    "test_exact_gpt_oss_decode_tactics": {"bf16-fp32-clamped_swiglu", "fp32-bf16-swiglu"},
    "test_exact_mxfp4_activations_every_tactic": {"clamped_swiglu"},
    "test_sm90_experts_give_the_row_major_bits": {"w4a16", "gpt-oss"},
    "test_swiglu_rows_is_the_reference_activation": {"swiglu-bf16-nvfp4", "clamped_swiglu-fp32-bf16-bias-mxfp4",
                                                       "swiglu-fp32-fp32-bias-bf16"},
}
MODES = ["w4a16", "w4a4"]


def _hopper():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the grouped Hopper GEMMs need an sm_90 GPU")


@pytest.fixture(autouse=True)
def _poison():
    _hopper()
    _common.POISON_OUTPUTS = True
    yield
    _common.POISON_OUTPUTS = False


def _tactics():
    from torch_fp4.kernels.cuda import mm_wgmma_tactics as wg
    from torch_fp4.kernels.cuda.moe_tactics import WgmmaMoeTactic as W
    least, most = wg.MIN_STAGES, wg.max_stages(128, persistent=True, ctas_per_sm=1, packed=False)
    return [W(256, 4, 1), W(128, least, 1), W(128, most, 1), W(64, 6, 1), W(64, least, 2)]


def _launch(p, ids, tw, tactic, lo=0, hi=None, out_dtype=BF16):
    from torch_fp4.kernels.cuda import moe
    return moe.fused_moe(p.x, *p.weights(lo, hi), ids, tw, p.a1, p.a2_for(lo, hi), lo, out_dtype,
                         lo == 0 and hi is None, tactic=tactic)


@pytest.mark.parametrize("mode", MODES)
def test_exact_every_tactic(mode):
    """H = 320, I = 96: 2I = 192 and H leave a partial 128-row weight tile (whose rows past N are
    the next expert's, read and never stored); several blocks per expert."""
    p = exact_problem(8, 320, 96, 200, mode == "w4a4", seed=3)
    ids, tw = random_routing(200, 8, 3, seed=4)
    want = p.run(ids, tw, "reference")
    for t in _tactics():
        assert_same(_launch(p, ids, tw, t), want, f"{mode} {t.label()}")


def _small_m_tactics(hidden, inter):
    """Every block_m with each tile compiled for it, stages 2-4, splits up to 3 (each the largest
    that leaves no K slice empty)."""
    from torch_fp4.kernels._common import largest_split
    from torch_fp4.kernels.cuda import mm_tactics as sm
    from torch_fp4.kernels.cuda.moe_small_m_tactics import BLOCK_MS, SmallMMoeTactic as S
    out = []
    for i, bm in enumerate(BLOCK_MS):
        for j, (warps, tiles, bk) in enumerate(sm.TILE_SHAPES):
            if sm.tile_compiled(bm // 8, warps, tiles, bk):
                s1 = largest_split(1 + (i + j) % 3, -(-hidden // bk))
                s2 = largest_split(1 + (i + 2 * j) % 2, -(-inter // bk))
                out.append(S(bm, warps, tiles, bk, 2 + (i + j) % 3, s1, s2))
    return out


@pytest.mark.parametrize("mode", MODES)
def test_exact_small_m_tactics(mode):
    """The decode GEMMs with every block_m and tile: H = 320 leaves a partial FC2 weight tile and a
    partial K stage in FC1; I = 208 a partial SwiGLU tile of 32 or 64 columns in FC1 and, in FC2,
    K % 32 == 16 (8-byte weight copies); T = 40 on 8 experts gives experts more rows than a block
    of 8, 16 or 32 (several blocks of one expert); T = 1 and 7 leave experts empty."""
    from torch_fp4.kernels.cuda.moe_small_m_tactics import why_not
    from torch_fp4.problems import MoeProblem
    for tokens in (1, 7, 40):
        p = exact_problem(8, 320, 208, tokens, mode == "w4a4", seed=20 + tokens)
        ids, tw = random_routing(tokens, 8, 3, seed=21 + tokens)
        want = p.run(ids, tw, "reference")
        w1, s1, _, w2, s2, _ = p.weights()
        prob = MoeProblem.of(p.x, w1, s1, w2, s2, ids, p.a1, p.a2, 0, None, BF16)
        for t in _small_m_tactics(320, 208):
            assert why_not(t, prob) is None, (t, why_not(t, prob))
            assert_same(_launch(p, ids, tw, t), want, f"{mode} T={tokens} {t.label()}")


def test_strided_global_scales_give_the_contiguous_bits():
    """Global scales are any [E] / [1] fp32 views (the op does not ask for contiguity): every-other
    element views of w1/w2/a2 global scales give the bits of their contiguous copies, at decode
    (grouped small-M GEMMs, which read the scales themselves) and at T = 300."""
    for tokens in (4, 300):
        p = random_problem(8, 256, 128, tokens, True, seed=40 + tokens, a2_per_expert=True)
        ids, tw = random_routing(tokens, 8, 2, seed=41 + tokens)
        want = p.run(ids, tw, "cuda")

        def strided(gs):   # the same values, every other element of a buffer holding junk between
            return torch.stack([gs, torch.full_like(gs, 1e30)], dim=1)[:, 0]
        w1, s1, g1, w2, s2, g2 = p.weights()
        got = t4.fused_moe(p.x, w1, s1, strided(g1), w2, s2, strided(g2), ids, tw, a1_global_scale=p.a1,
                           a2_global_scale=strided(p.a2), backend="cuda")
        assert_same(got, want, f"T={tokens}")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("tokens", [1, 5, 64, 300])
def test_exact_token_counts(mode, tokens):
    p = exact_problem(8, 256, 128, tokens, mode == "w4a4", seed=tokens)
    ids, tw = random_routing(tokens, 8, 2, seed=tokens + 1)
    got = p.run(ids, tw, "cuda")
    assert_same(got, p.run(ids, tw, "reference"), f"{mode} T={tokens}")


@pytest.mark.parametrize("mode", MODES + ["w4a4-a2-per-expert"])
@pytest.mark.parametrize("shape,tokens", [(("mixtral-like", 8, 1024, 512, 2), 300),
                                          (("qwen3", 128, 2048, 768, 8), 200)],
                         ids=["mixtral", "qwen3"])
def test_random_model_shapes(mode, shape, tokens):
    name, experts, hidden, inter, top_k = shape
    p = random_problem(experts, hidden, inter, tokens, mode != "w4a16", seed=12,
                       a2_per_expert=mode.endswith("expert"))
    ids, tw = t4.route(torch.randn(tokens, experts, device=DEV), top_k, "softmax", renormalize=True)
    got, want = p.run(ids, tw, "cuda"), p.run(ids, tw, "reference")
    assert_close_moe(got, want, pair_outputs(p, ids), tw, mode != "w4a16", f"{mode} {name} T={tokens}")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("tokens", [160, 4])
def test_graph_replayed_with_new_routing_no_sync_same_bits(mode, tokens):
    """160 tokens run the grouped Hopper GEMMs, 4 the grouped small-M GEMMs."""
    experts = 8
    p = exact_problem(experts, 128, 64, tokens, mode == "w4a4", seed=13)
    logits = torch.randn(tokens, experts, device=DEV)

    def step():
        ids, tw = t4.route(logits, 2, "softmax", renormalize=True)
        return t4.fused_moe(p.x, *p.weights(), ids, tw, a1_global_scale=p.a1, a2_global_scale=p.a2,
                            local_expert_offset=0, num_local_experts=experts, backend="cuda")

    first = step()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        second = step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(second.view(torch.int16), first.view(torch.int16))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for seed in range(4):
        logits.copy_(torch.randn(tokens, experts, generator=torch.Generator().manual_seed(100 + seed)).to(DEV))
        if seed == 3:
            logits[:, 0] += 100.0            # every token on expert 0 first
        out.fill_(float("nan"))
        graph.replay()
        ids, tw = t4.route(logits, 2, "softmax", renormalize=True)
        assert_same(out, p.run(ids, tw, "reference"), f"{mode} graph replay {seed} vs reference")


def test_auto_picks_cuda_at_every_size():
    experts, top_k = 8, 2
    for tokens in (1, 4, 64, 300):
        p = exact_problem(experts, 64, 32, tokens, False, seed=1)
        ids, tw = random_routing(tokens, experts, top_k, seed=2)
        got = t4.supported_backends("fused_moe", p.x, *p.weights(), ids, tw)[0]
        assert got.label == "cuda", (tokens, got)


def _decode(x, w, ids, tw, tactic, a1=None, a2=None, lo=0, strict=True, out_dtype=BF16):
    """fused_moe's decode path (one C call) with `tactic` on weights w = (w1, w1_s, w1_gs, w2, w2_s,
    w2_gs), and the parts of its workspace (sorted_pairs, block_expert, expert_end, h, y)."""
    from torch_fp4.kernels.cuda import moe as CM
    from torch_fp4.problems import MoeProblem
    prob = MoeProblem.of(x, w[0], w[1], w[3], w[4], ids, a1, a2, lo, None if strict else w[0].shape[0], out_dtype)
    kept = []
    out = CM._small_m_moe(x, *w, ids, tw, a1, a2, out_dtype, prob, tactic, keep_workspace=kept)
    d, workspace = kept[0]
    return out, CM.workspace_views(d, workspace)


@pytest.mark.parametrize("experts,local,top_k,tokens,block_m", [
    (8, (0, 8), 3, 1, 8), (8, (0, 8), 3, 40, 16), (8, (2, 6), 2, 24, 8), (256, (0, 256), 8, 300, 8),
    (2048, (0, 2048), 6, 4, 8), (4, (0, 4), 1, 100, 64)])
def test_decode_grouping_is_the_triton_layout(experts, local, top_k, tokens, block_m):
    """The decode path's one-CTA grouping (csrc/moe_route.cuh) writes the layout of the Triton
    align with cleared padding, entry for entry: more pairs than one 256-pair step of its scatter
    warp (2400), 2048 experts, expert parallelism (ids outside the local slice dropped), 100
    pairs on one expert (ranks across steps); the outputs equal the reference's bits."""
    from torch_fp4.kernels.cuda.moe_small_m_tactics import _TILES, SmallMMoeTactic
    from torch_fp4.kernels.triton.moe_align import align
    lo, hi = local
    tactic = SmallMMoeTactic(block_m, *_TILES[block_m // 8])   # a tile compiled for block_m
    p = exact_problem(experts, 64, 32, tokens, False, seed=experts + tokens)
    ids, tw = random_routing(tokens, experts, top_k, seed=tokens)
    if top_k == 1:
        ids.fill_(2)
    strict = lo == 0 and hi == experts
    got, ws = _decode(p.x, p.weights(lo, hi), ids, tw, tactic, lo=lo, strict=strict)
    want = align(ids, hi - lo, lo, block_m, zero_padding=True)
    for name in ("sorted_pairs", "block_expert", "expert_end"):
        assert torch.equal(ws[name], getattr(want, name)), name
    assert_same(got, p.run(ids, tw, "reference", lo, None if strict else hi), f"E={experts} T={tokens} k={top_k}")


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float16, BF16], ids=str)
def test_decode_stray_ids_give_nan_rows(out_dtype):
    """Without expert parallelism a token with an id outside [0, E) is NaN in every column (the
    decode path's top-k sum); the other tokens keep the reference's bits."""
    from torch_fp4.kernels.cuda.moe_small_m_tactics import SmallMMoeTactic
    p = exact_problem(8, 64, 32, 6, False, seed=31)
    ids, tw = random_routing(6, 8, 2, seed=32)
    bad = ids.clone()
    bad[1, 0], bad[4, 1] = 8, -1
    got, _ = _decode(p.x, p.weights(), bad, tw, SmallMMoeTactic(8), out_dtype=out_dtype)
    want = p.run(ids, tw, "reference", out_dtype=out_dtype)
    rows = torch.tensor([1, 4], device=DEV)
    assert got[rows].isnan().all()
    keep = torch.tensor([0, 2, 3, 5], device=DEV)
    assert_same(got[keep], want[keep], f"{out_dtype} other rows")


@pytest.mark.parametrize("mode", MODES)
def test_decode_graph_launches_are_the_direct_launches(mode):
    """Eager decode calls enqueue their four launches as one launch of the plan's CUDA graph
    (csrc/graph_launch.cuh): the graph is built by the first call of a problem and every later
    call's inputs, routing, output and workspace reach its kernel nodes: bits equal to the direct
    launches (EAGER_GRAPHS off) and to the reference, on the current stream and on another one,
    with no host synchronization; a call inside a caller's capture launches directly."""
    from torch_fp4.kernels.cuda import moe as CM
    from torch_fp4.kernels.cuda.moe_small_m_tactics import SmallMMoeTactic
    from torch_fp4.problems import MoeProblem
    experts, tokens = 8, 5
    p = exact_problem(experts, 128, 64, tokens, mode == "w4a4", seed=61)
    t = SmallMMoeTactic(8)
    w = p.weights()
    ids, tw = random_routing(tokens, experts, 2, seed=70)
    prob = MoeProblem.of(p.x, w[0], w[1], w[3], w[4], ids, p.a1, p.a2, 0, None, BF16)

    def call(x, ids, tw):   # the same problem object on every call, as the dispatch passes it
        return CM._small_m_moe(x, *w, ids, tw, p.a1, p.a2, BF16, prob, t)
    for seed in range(4):
        ids, tw = random_routing(tokens, experts, 2, seed=70 + seed)
        x = p.x.roll(seed, 0).contiguous()
        want = p.run(ids, tw, "reference", x=x)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error" if seed else "default")
        try:
            if seed == 2:
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    got = call(x, ids, tw)
                torch.cuda.current_stream().wait_stream(side)
            else:
                got = call(x, ids, tw)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        CM.EAGER_GRAPHS = False
        try:
            direct = call(x, ids, tw)
        finally:
            CM.EAGER_GRAPHS = True
        assert torch.equal(got.view(torch.int16), direct.view(torch.int16)), f"call {seed}: graph vs direct"
        assert_same(got, want, f"{mode} call {seed} through the graph vs reference")
        assert CM._decode(prob, t, w[1], w[4]).graph.state() == "built"
    graph = torch.cuda.CUDAGraph()
    ids, tw = random_routing(tokens, experts, 2, seed=80)
    with torch.cuda.graph(graph):
        out = call(p.x, ids, tw)
    out.fill_(float("nan"))
    graph.replay()
    assert_same(out, p.run(ids, tw, "reference"), f"{mode} captured call replayed")


def test_decode_plans_freed_inside_a_caller_capture():
    """The decode path's plan cache filling up inside a caller's CUDA-graph capture (calls of new
    problem objects) frees the earlier plans' built graphs while the stream is captured: the
    capture stays valid (csrc/graph_launch.cuh frees them in relaxed capture mode) and its replay
    gives the reference's bits."""
    from torch_fp4.kernels.cuda import moe as CM
    from torch_fp4.kernels.cuda.moe_small_m_tactics import SmallMMoeTactic
    from torch_fp4.problems import MoeProblem
    experts, tokens = 8, 5
    p = exact_problem(experts, 128, 64, tokens, False, seed=62)
    t = SmallMMoeTactic(8)
    w = p.weights()
    ids, tw = random_routing(tokens, experts, 2, seed=71)

    def call():   # a new problem object per call: a new plan (the cache is by identity)
        q = MoeProblem.of(p.x, w[0], w[1], w[3], w[4], ids, p.a1, p.a2, 0, None, BF16)
        return CM._small_m_moe(p.x, *w, ids, tw, p.a1, p.a2, BF16, q, t)
    limit = CM._MAX_DECODES
    CM._DECODES.clear()
    CM._MAX_DECODES = 3
    try:
        for _ in range(2):
            call()
        torch.cuda.synchronize()
        assert [d.graph.state() for d in CM._DECODES.values()] == ["built", "built"]
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):   # the second call clears the cache: two built graphs freed
            outs = [call() for _ in range(3)]
        assert len(CM._DECODES) == 2
    finally:
        CM._MAX_DECODES = limit
        CM._DECODES.clear()
    for out in outs:
        out.fill_(float("nan"))
    graph.replay()
    want = p.run(ids, tw, "reference")
    for i, out in enumerate(outs):
        assert_same(out, want, f"captured call {i} replayed")


def test_decode_repeated_experts_and_tokens_without_local_pairs():
    """A token routed twice to one expert (two rows of one token in one block); a token with no
    pair on a local expert: zero with expert parallelism, NaN without (all its ids out of range);
    each case run twice (the second call's workspace is the first's freed memory)."""
    from torch_fp4.kernels.cuda.moe_small_m_tactics import SmallMMoeTactic
    p = exact_problem(8, 64, 32, 6, False, seed=51)
    ids, tw = random_routing(6, 8, 3, seed=52)
    ids[2] = torch.tensor([5, 5, 1], dtype=torch.int32)
    ids[3] = torch.tensor([6, 7, 7], dtype=torch.int32)
    bad = ids.clone()
    bad[3] = torch.tensor([8, 9, -1], dtype=torch.int32)
    t = SmallMMoeTactic(8)
    cases = [(ids, (0, 8), True), (ids, (0, 6), False), (bad, (0, 8), True)]
    for routed, (lo, hi), strict in cases:
        _decode(p.x, p.weights(lo, hi), routed, tw, t, lo=lo, strict=strict)
        got, _ = _decode(p.x, p.weights(lo, hi), routed, tw, t, lo=lo, strict=strict)
        if routed is bad:
            assert got[3].isnan().all()
            keep = torch.tensor([0, 1, 2, 4, 5], device=DEV)
            assert_same(got[keep], p.run(ids, tw, "reference")[keep], "other rows")
        else:
            assert_same(got, p.run(routed, tw, "reference", lo, None if strict else hi), f"experts {lo}..{hi}")
            if not strict:
                assert torch.equal(got[3], torch.zeros_like(got[3]))


@pytest.mark.parametrize("qdq", [False, True], ids=["bf16", "nvfp4-intermediate"])
def test_small_m_fc1_swiglu_bits_over_a_range_of_gates(qdq):
    """FC1 of the decode path (its output h, read from the call's workspace), on data whose gate
    and up sums are exact in any order (x and the weights in {0, +-0.5, +-1}, block scales 1) and
    whose gates span about [-20, 20], so that its SwiGLU (expf, the division) and, with an NVFP4
    intermediate, its quantization (block amax across four lanes) must equal the reference's bit
    for bit."""
    from torch_fp4.kernels.cuda.moe_small_m_tactics import SmallMMoeTactic
    from torch_fp4.reference.moe import silu_mul
    from test_gpu_moe import _gen, _pack
    experts, hidden, inter, tokens, top_k = 4, 256, 96, 5, 2
    g = _gen(7)
    x = (torch.randint(-2, 3, (tokens, hidden), generator=g).float() * 0.5).to(BF16).to(DEV)
    codes = torch.randint(0, 3, (experts, 2 * inter, hidden), generator=g).to(torch.uint8)
    codes |= torch.randint(0, 2, codes.shape, generator=g).to(torch.uint8) << 3
    w1, w1_s = _pack(codes, torch.ones(experts, 2 * inter, hidden // 16))
    w2, w2_s = _pack(torch.zeros(experts, hidden, inter, dtype=torch.uint8), torch.ones(experts, hidden, inter // 16))
    w_gs = torch.ones(experts, device=DEV)   # alpha 1
    gs = torch.tensor([37.5], device=DEV) if qdq else None   # bf16 x, NVFP4 intermediate
    ids, tw = random_routing(tokens, experts, top_k, seed=8)
    for t in (SmallMMoeTactic(8, 8, 1, 256, 4), SmallMMoeTactic(8, 4, 2, 128, 3, 2, 1)):
        _, ws = _decode(x, (w1, w1_s, w_gs, w2, w2_s, w_gs.clone()), ids, tw, t, a2=gs)
        h = ws["h"]
        pairs, ends = ws["sorted_pairs"].tolist(), ws["expert_end"].tolist()
        gates = []
        for b, e in enumerate(ws["block_expert"].tolist()):
            if e < 0:
                continue
            rows = list(range(b * t.block_m, min((b + 1) * t.block_m, ends[e])))
            w_hat = t4.fp4_dequantize(w1[e], w1_s[e], None, out_dtype=torch.float32)
            pre = (x[[pairs[r] // top_k for r in rows]].double() @ w_hat.double().T).to(BF16)
            gates.append(pre[:, :inter].float())
            want = silu_mul(pre)
            if qdq:
                q, s = t4.nvfp4_quantize(want, gs, sf_layout="linear")
                want = t4.fp4_dequantize(q, s, None, out_dtype=BF16, sf_layout="linear")
            assert torch.equal(h[rows].view(torch.int16), want.view(torch.int16)), (t.label(), b, e)
        gates = torch.cat(gates)
        assert gates.min() < -8 and gates.max() > 8, (gates.min(), gates.max())


@pytest.mark.parametrize("exact", [0, 16, 32], ids=["bf16", "nvfp4", "mxfp4"])
@pytest.mark.parametrize("h_kind", ["bf16", "fp32-bf16-bias", "fp32-fp32-bias"])
@pytest.mark.parametrize("activation", ["swiglu", "clamped_swiglu"])
def test_swiglu_rows_is_the_reference_activation(exact, h_kind, activation):
    """The grouped path's activation kernel (csrc/moe_swiglu.cu) on random h (gates over about
    [-24, 24], NaN and +-Inf entries): every used row bit for bit the reference's activation (the
    bias added in fp32 and rounded to bf16 first), then, in W4A4, its NVFP4 (global scale of the
    row's expert) or MXFP4 quantization dequantized without the global scale; rows of unused blocks
    zeros; a misaligned bias is copied, not misread."""
    from torch_fp4 import formats as F
    from torch_fp4.kernels.cuda import moe as CM
    from torch_fp4.kernels.triton.moe_gemm import GptOss
    from torch_fp4.kernels.triton.moe_grouped import ActQuant
    from torch_fp4.reference.moe import clamped_swiglu, silu_mul
    g = torch.Generator(device=DEV).manual_seed(exact + len(h_kind) + len(activation))
    experts, block_m, inter = 3, 16, 96
    block_expert = torch.tensor([2, -1, 0, 1, -1, 2], dtype=torch.int32, device=DEV)
    rows = block_expert.numel() * block_m
    h = torch.randn(rows, 2 * inter, device=DEV, generator=g) * 8
    h[3, 5], h[4, inter + 7], h[20, 1] = float("nan"), float("inf"), -float("inf")
    bias = None
    if h_kind != "bf16":
        dtype = torch.float32 if h_kind.endswith("fp32-bias") else BF16
        raw = torch.randn(experts * 2 * inter + 1, device=DEV, generator=g).to(dtype)
        bias = raw[1:].view(experts, 2 * inter)     # 2 or 4 bytes past an aligned start
    else:
        h = h.to(BF16)
    gs = torch.tensor([40.0, 900.0, 3.5], device=DEV) if exact == 16 else None
    go = GptOss(w1_bias=bias, clamped=activation == "clamped_swiglu")
    act = ActQuant(F.NVFP4 if exact == 16 else F.MXFP4, gs) if exact else None
    got = CM.swiglu_rows(h, block_expert, block_m, go, act)
    for b, e in enumerate(block_expert.tolist()):
        r = slice(b * block_m, (b + 1) * block_m)
        if e < 0:
            assert (got[r] == 0).all()
            continue
        hb = h[r].float() + (bias[e].float() if bias is not None else 0)
        hb = hb.to(BF16)
        want = silu_mul(hb) if activation == "swiglu" else clamped_swiglu(hb, 1.702, 7.0)
        if exact == 16:
            q, sc = t4.nvfp4_quantize(want, gs[e:e + 1], sf_layout="linear", backend="reference")
            want = t4.fp4_dequantize(q, sc, None, out_dtype=BF16, sf_layout="linear", backend="reference")
        elif exact == 32:
            q, sc = t4.mxfp4_quantize(want, sf_layout="linear", backend="reference")
            want = t4.fp4_dequantize(q, sc, None, 32, out_dtype=BF16, sf_layout="linear", backend="reference")
        same = (got[r].view(torch.int16) == want.view(torch.int16)) | (got[r].isnan() & want.isnan())
        assert same.all(), (b, e, int((~same).sum()))


@pytest.mark.parametrize("activation", ["clamped_swiglu", "swiglu"])
@pytest.mark.parametrize("b1_dtype,b2_dtype", [(BF16, torch.float32), (torch.float32, BF16), (BF16, BF16)],
                         ids=["bf16-fp32", "fp32-bf16", "bf16-bf16"])
def test_exact_gpt_oss_decode_tactics(activation, b1_dtype, b2_dtype):
    """gpt-oss's features on the cuda backend (MXFP4 experts, biases of either dtype on each GEMM,
    both activations; hidden 2880 = 90 MXFP4 blocks: padded 128x4 scales, a partial K stage): the
    decode path with every block_m and tile (T = 1, 5, 20: below 16 routed rows per expert), the
    grouped Hopper GEMMs with every tactic (T = 40), and the op (backend "cuda", and "auto", which
    takes cuda): bit-identical to the reference on grid-exact data."""
    from torch_fp4.kernels.cuda.moe_small_m_tactics import why_not
    from torch_fp4.problems import MoeProblem
    from torch_fp4 import formats as F
    hidden, inter = 2880, 64
    for tokens in (1, 5, 20):
        p, b1, b2 = exact_gpt_oss_problem(8, hidden, inter, tokens, seed=40 + tokens, bias_dtype=b1_dtype)
        b2 = b2.to(b2_dtype)
        ids, tw = random_routing(tokens, 8, 4, seed=41 + tokens)
        kw = dict(block_size=32, w1_bias=b1, w2_bias=b2, activation=activation)
        want = t4.fused_moe(p.x, *p.weights(), ids, tw, backend="reference", **kw)
        w1, s1, _, w2, s2, _ = p.weights()
        prob = MoeProblem.of(p.x, w1, s1, w2, s2, ids, None, None, 0, None, BF16, F.MXFP4, b1, b2, activation)
        from torch_fp4.kernels.cuda import moe
        for t in _small_m_tactics(hidden, inter):
            assert why_not(t, prob) is None, (t, why_not(t, prob))
            got = moe.fused_moe(p.x, *p.weights(), ids, tw, None, None, 0, BF16, True, F.MXFP4, b1, b2, activation,
                                1.702, 7.0, tactic=t)
            assert_same(got, want, f"{activation} T={tokens} {t.label()}")
        for backend in ("cuda", "auto"):
            assert_same(t4.fused_moe(p.x, *p.weights(), ids, tw, backend=backend, **kw), want,
                        f"{activation} T={tokens} through the op, backend={backend}")
        assert t4.supported_backends("fused_moe", p.x, *p.weights(), ids, tw, **kw)[0].label == "cuda"
    p, b1, b2 = exact_gpt_oss_problem(8, hidden, inter, 40, seed=49, bias_dtype=b1_dtype)
    b2 = b2.to(b2_dtype)
    ids, tw = random_routing(40, 8, 4, seed=50)
    kw = dict(block_size=32, w1_bias=b1, w2_bias=b2, activation=activation)
    want = t4.fused_moe(p.x, *p.weights(), ids, tw, backend="reference", **kw)
    for t in _tactics():
        got = moe.fused_moe(p.x, *p.weights(), ids, tw, None, None, 0, BF16, True, F.MXFP4, b1, b2, activation,
                            1.702, 7.0, tactic=t)
        assert_same(got, want, f"{activation} T=40 {t.label()}")
    assert_same(t4.fused_moe(p.x, *p.weights(), ids, tw, **kw), want, f"{activation} T=40 auto")
    assert t4.supported_backends("fused_moe", p.x, *p.weights(), ids, tw, **kw)[0].label == "cuda"


@pytest.mark.parametrize("activation", ["clamped_swiglu", "swiglu"])
def test_exact_mxfp4_activations_every_tactic(activation):
    """W4A4 with MXFP4 activations (activations="fp4"; the decode family refuses it, so every T runs
    the grouped Hopper GEMMs: x's rows gathered as their MXFP4 values, the intermediate's MXFP4
    values in the activation's launch), with gpt-oss's biases (bf16 on FC1, fp32 on FC2) and
    without: every tactic at T = 40, the op (cuda and auto) at T = 1, 5, 40, bit-identical to the
    reference on grid-exact data."""
    from torch_fp4 import formats as F
    from torch_fp4.kernels.cuda import moe
    hidden, inter = 2880, 64
    for tokens in (1, 5, 40):
        p, b1, b2 = exact_gpt_oss_problem(8, hidden, inter, tokens, seed=70 + tokens, bias_dtype=BF16)
        ids, tw = random_routing(tokens, 8, 4, seed=71 + tokens)
        for biases in ((b1, b2.float()), (None, None)):
            kw = dict(block_size=32, w1_bias=biases[0], w2_bias=biases[1], activation=activation, activations="fp4")
            want = t4.fused_moe(p.x, *p.weights(), ids, tw, backend="reference", **kw)
            w4a16 = t4.fused_moe(p.x, *p.weights(), ids, tw, backend="reference", **{**kw, "activations": None})
            assert not torch.equal(want, w4a16), "the activations' quantization changed nothing: a weak test"
            if tokens == 40:
                for t in _tactics():
                    got = moe.fused_moe(p.x, *p.weights(), ids, tw, None, None, 0, BF16, True, F.MXFP4, *biases,
                                        activation, 1.702, 7.0, True, tactic=t)
                    assert_same(got, want, f"{activation} T=40 {t.label()} biases={biases[0] is not None}")
            for backend in ("cuda", "auto"):
                assert_same(t4.fused_moe(p.x, *p.weights(), ids, tw, backend=backend, **kw), want,
                            f"{activation} T={tokens} backend={backend} biases={biases[0] is not None}")
            assert t4.supported_backends("fused_moe", p.x, *p.weights(), ids, tw, **kw)[0].label == "cuda"


@pytest.mark.parametrize("activation", ["clamped_swiglu", "swiglu"])
def test_decode_path_mxfp4_activations_bits(activation):
    """The decode path's MXFP4-activation mode (plan.act_mx: x's MXFP4 exact values, FC1's epilogue
    quantizing the intermediate over eight lanes per 32-column block), launched directly on every
    decode tactic (the family still refuses W4A4 with gpt-oss's features until this passes on a
    GPU): bit-identical to the reference on grid-exact data, with and without biases, T = 1, 5, 20
    (hidden 2880: a partial K stage)."""
    from torch_fp4 import formats as F
    from torch_fp4.kernels.cuda import moe as CM
    from torch_fp4.problems import MoeProblem
    hidden, inter = 2880, 64
    for tokens in (1, 5, 20):
        p, b1, b2 = exact_gpt_oss_problem(8, hidden, inter, tokens, seed=80 + tokens, bias_dtype=BF16)
        ids, tw = random_routing(tokens, 8, 4, seed=81 + tokens)
        w1, s1, _, w2, s2, _ = p.weights()
        for biases in ((b1, b2.float()), (None, None)):
            kw = dict(block_size=32, w1_bias=biases[0], w2_bias=biases[1], activation=activation, activations="fp4")
            want = t4.fused_moe(p.x, *p.weights(), ids, tw, backend="reference", **kw)
            prob = MoeProblem.of(p.x, w1, s1, w2, s2, ids, None, None, 0, None, BF16, F.MXFP4, *biases, activation,
                                 activations="fp4")
            for t in _small_m_tactics(hidden, inter):
                got = CM._small_m_moe(p.x, *p.weights(), ids, tw, None, None, BF16, prob, t, w1_bias=biases[0],
                                      w2_bias=biases[1])
                assert_same(got, want, f"{activation} T={tokens} {t.label()} biases={biases[0] is not None}")


def test_random_gpt_oss_decode_against_the_reference():
    """A random gpt-oss-shaped problem (MXFP4 experts quantized from random bf16, bf16 biases, the
    clamped SwiGLU, hidden 2880) on the decode path and the grouped Hopper GEMMs: within the
    random-data bound of tests/test_gpu_moe.py."""
    from torch_fp4 import testing as T
    torch.manual_seed(11)
    for tokens in (1, 6, 64):   # 64: 32 routed rows per expert, the grouped Hopper GEMMs
        g = T.gpt_oss_moe_problem(tokens=tokens, hidden=2880, inter=256, experts=8, top_k=4, device=DEV)
        got = t4.fused_moe(**g, backend="cuda").float()
        want = t4.fused_moe(**g, backend="reference").float()
        assert not got.isnan().any()
        err = torch.linalg.norm(got - want) / torch.linalg.norm(want)
        per_token = torch.linalg.norm(got - want, dim=1) / torch.linalg.norm(want, dim=1).clamp_min(1e-30)
        assert err < 0.01 and per_token.max() < 0.02, (tokens, float(err), float(per_token.max()))


def _sm90(w1, w2):
    return t4.prepack_weight(w1), t4.prepack_weight(w2)


@pytest.mark.parametrize("mode", ["w4a16", "w4a4", "gpt-oss", "mxfp4-fp4"])
def test_sm90_experts_give_the_row_major_bits(mode):
    """Experts prepacked ("sm90", weight_layout="sm90") through the decode path (every block_m <= 16
    and tile) and the grouped Hopper GEMMs (every tactic): bit-identical to the same tactic on
    row-major experts, on random data (the same products in the same order) and to the reference
    on grid-exact data; through the op with backend "cuda" and "auto" (which takes cuda)."""
    from torch_fp4 import formats as F
    from torch_fp4.kernels.cuda import moe
    from torch_fp4.kernels.cuda.moe_small_m_tactics import why_not
    from torch_fp4.problems import MoeProblem
    hidden, inter, experts = 256, 128, 8
    sm90 = F.WeightLayout.SM90
    for tokens in (1, 5, 40, 300):
        ids, tw = random_routing(tokens, experts, 3, seed=60 + tokens)
        kw, fmt, extra = {}, F.NVFP4, ()
        if mode in ("gpt-oss", "mxfp4-fp4"):
            p, b1, b2 = exact_gpt_oss_problem(experts, hidden, inter, tokens, seed=61 + tokens, bias_dtype=BF16)
            fmt = F.MXFP4
            kw = dict(block_size=32, activation="clamped_swiglu")
            if mode == "gpt-oss":
                kw.update(w1_bias=b1, w2_bias=b2.float())
            else:
                kw.update(activations="fp4")
            extra = (fmt, kw.get("w1_bias"), kw.get("w2_bias"), "clamped_swiglu", 1.702, 7.0, mode == "mxfp4-fp4")
        else:
            p = exact_problem(experts, hidden, inter, tokens, mode == "w4a4", seed=61 + tokens)
            extra = (fmt, None, None, "swiglu", 1.702, 7.0, False)
            kw = dict(a1_global_scale=p.a1, a2_global_scale=p.a2)
        w1, s1, g1, w2, s2, g2 = p.weights()
        pw1, pw2 = _sm90(w1, w2)
        want = t4.fused_moe(p.x, w1, s1, g1, w2, s2, g2, ids, tw, backend="reference", **kw)
        prob = MoeProblem.of(p.x, pw1, s1, pw2, s2, ids, p.a1, p.a2, 0, None, BF16, fmt, kw.get("w1_bias"),
                             kw.get("w2_bias"), extra[3], 1.702, 7.0, kw.get("activations"), sm90)
        small = [t for t in _small_m_tactics(hidden, inter) if why_not(t, prob) is None]
        if tokens < 40 and mode != "mxfp4-fp4":   # the decode path (MXFP4 activations: grouped GEMMs only)
            assert {t.block_m for t in small} == {8, 16}, small
        for t in (small if tokens < 40 else []) + _tactics():
            args = (p.x, w1, s1, g1, w2, s2, g2, ids, tw, p.a1, p.a2, 0, BF16, True, *extra)
            row = moe.fused_moe(*args, tactic=t)
            args = (p.x, pw1, s1, g1, pw2, s2, g2, ids, tw, p.a1, p.a2, 0, BF16, True, *extra)
            got = moe.fused_moe(*args, weight_layout=sm90, tactic=t)
            assert_same(got, row, f"{mode} T={tokens} {t.label()} sm90 against row-major")
            assert_same(got, want, f"{mode} T={tokens} {t.label()} sm90 against the reference")
        for backend in ("cuda", "auto"):
            got = t4.fused_moe(p.x, pw1, s1, g1, pw2, s2, g2, ids, tw, backend=backend, weight_layout="sm90", **kw)
            assert_same(got, want, f"{mode} T={tokens} through the op, backend={backend}")
        names = [b.label for b in t4.supported_backends("fused_moe", p.x, pw1, s1, g1, pw2, s2, g2, ids, tw,
                                                        weight_layout="sm90", **kw)]
        assert names == ["cuda", "reference"], names


@pytest.mark.parametrize("tokens", [2, 300])
def test_sm90_experts_random_data_same_bits(tokens):
    """Random data (Qwen3-30B-A3B's expert shape, W4A16 and W4A4), the heuristic tactic of either
    layout: at T = 300 (the grouped Hopper GEMMs) "sm90" experts give the row-major experts' bits;
    at T = 2 (the decode path, whose small-M GEMMs group K differently per MMA step in the two
    layouts: docs/NUMERICS.md 4b) both within the module's tolerance of the reference."""
    for w4a4 in (False, True):
        p = random_problem(128, 2048, 768, tokens, w4a4, seed=70 + tokens)
        ids, tw = random_routing(tokens, 128, 8, seed=71 + tokens)
        w1, s1, g1, w2, s2, g2 = p.weights()
        pw1, pw2 = _sm90(w1, w2)
        kw = dict(a1_global_scale=p.a1, a2_global_scale=p.a2, backend="cuda")
        row = t4.fused_moe(p.x, w1, s1, g1, w2, s2, g2, ids, tw, **kw)
        got = t4.fused_moe(p.x, pw1, s1, g1, pw2, s2, g2, ids, tw, weight_layout="sm90", **kw)
        if tokens >= 16:
            assert_same(got, row, f"T={tokens} w4a4={w4a4}")
        else:
            want, ys = p.run(ids, tw, "reference"), pair_outputs(p, ids)
            for name, out in (("sm90", got), ("row", row)):
                assert_close_moe(out, want, ys, tw, w4a4, f"T={tokens} w4a4={w4a4} {name}")
