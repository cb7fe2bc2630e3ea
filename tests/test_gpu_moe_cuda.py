"""The cuda backend's fused_moe (grouped Hopper GEMMs, torch_fp4/kernels/cuda/moe.py) on an H100
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

from test_gpu_moe import (BF16, DEV, assert_close_moe, assert_same, exact_problem, pair_outputs,
                          random_problem, random_routing)

pytestmark = pytest.mark.gpu
QUICK = {
    "test_exact_every_tactic": {"w4a16", "w4a4"},
    "test_exact_token_counts": {"w4a16-300", "w4a4-64"},
    "test_random_model_shapes": {"w4a16-mixtral", "w4a4-qwen3"},
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
    from torch_fp4.kernels.cuda.moe_tactics import WgmmaMoeTactic as W
    return [W(256, 4, 1), W(128, 4, 1), W(128, 6, 1), W(64, 6, 1), W(64, 4, 2)]


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
def test_graph_replayed_with_new_routing_no_sync_same_bits(mode):
    tokens, experts = 160, 8
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


def test_auto_picks_cuda_from_the_measured_rows_per_expert():
    from torch_fp4.tuning import CUDA_MOE_MIN_ROWS
    experts, top_k = 8, 2
    for tokens, want in ((CUDA_MOE_MIN_ROWS * experts // top_k, "cuda"), (4, "triton")):
        p = exact_problem(experts, 64, 32, tokens, False, seed=1)
        ids, tw = random_routing(tokens, experts, top_k, seed=2)
        got = t4.supported_backends("fused_moe", p.x, *p.weights(), ids, tw)[0]
        assert got.label == want, (tokens, got)
