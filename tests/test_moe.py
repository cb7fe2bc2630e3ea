"""CPU tests of torch_fp4.route, fused_moe and swap_gate_up against spec section 6.

The oracles are per-token Python implementations of the spec's formulas written here:
routing in fp64 Python floats, the expert MLP as an explicit per-(t, j) loop with exactly
rounded (math.fsum) dot products. Nothing is compared with a stored implementation result.
"""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import torch_fp4
from torch_fp4 import testing as T

BF16 = torch.bfloat16


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# =============================================================================================
# route
# =============================================================================================
def _sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z))


def _topk(scores: list[float], k: int, allowed=None) -> list[int]:
    """Indices of the k largest scores, largest first; ties go to the lower index."""
    idx = [i for i in range(len(scores)) if allowed is None or allowed[i]]
    return sorted(idx, key=lambda i: (-scores[i], i))[:k]


def route_oracle(logits: torch.Tensor, top_k: int, method: str, renormalize=False, bias=None,
                 n_group=None, topk_group=None, rsf=1.0):
    """Per-token routing from the spec's formulas, in fp64 Python floats."""
    all_ids, all_w = [], []
    bias_l = None if bias is None else [float(b) for b in bias.double()]
    for row in logits.double().tolist():
        e = len(row)
        if method == "softmax":
            mx = max(row)
            ex = [math.exp(v - mx) for v in row]
            tot = math.fsum(ex)
            p = [v / tot for v in ex]
            ids = _topk(p, top_k)
            w = [p[i] for i in ids]
            if renormalize:
                s = math.fsum(w)
                w = [v / s for v in w]
        elif method == "renormalize":
            ids = _topk(row, top_k)
            mx = max(row[i] for i in ids)
            ex = [math.exp(row[i] - mx) for i in ids]
            tot = math.fsum(ex)
            w = [v / tot for v in ex]
        elif method == "deepseek_v3":
            s = [_sigmoid(v) for v in row]
            b = [s[i] + bias_l[i] for i in range(e)]
            allowed = None
            if n_group is not None:
                g = e // n_group
                gscore = []
                for grp in range(n_group):
                    members = sorted((b[i] for i in range(grp * g, (grp + 1) * g)), reverse=True)
                    gscore.append(sum(members[:2]))
                keep = _topk(gscore, topk_group)
                allowed = [(i // g) in keep for i in range(e)]
            ids = _topk(b, top_k, allowed)
            tot = math.fsum(s[i] for i in ids)
            w = [s[i] / (tot + 1e-20) * rsf for i in ids]
        elif method == "llama4":
            ids = _topk(row, 1)
            w = [_sigmoid(row[ids[0]])]
        else:
            raise AssertionError(method)
        all_ids.append(ids)
        all_w.append(w)
    return torch.tensor(all_ids, dtype=torch.int32), torch.tensor(all_w, dtype=torch.float64)


def _distinct_logits(t: int, e: int, seed: int) -> torch.Tensor:
    """Logits whose values in every row differ by at least 0.02 (no near-ties): a random
    permutation of a spaced grid plus small jitter."""
    g = _gen(seed)
    rows = []
    for _ in range(t):
        base = torch.randperm(e, generator=g).double() * 0.05 - 0.025 * e
        rows.append(base + torch.rand(e, generator=g, dtype=torch.float64) * 0.02)
    return torch.stack(rows).float()


def _check_route(ids, w, logits, top_k, **kw):
    t = logits.shape[0]
    assert ids.dtype == torch.int32 and w.dtype == torch.float32
    assert ids.shape == (t, top_k) and w.shape == (t, top_k)
    ref_ids, ref_w = route_oracle(logits, top_k, **kw)
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(w.double(), ref_w, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("renormalize", [False, True])
@pytest.mark.parametrize("logit_dtype", [torch.float32, BF16], ids=str)
def test_route_softmax(renormalize, logit_dtype):
    logits = _distinct_logits(11, 16, 1).to(logit_dtype)
    ids, w = torch_fp4.route(logits, 4, "softmax", renormalize=renormalize)
    _check_route(ids, w, logits, 4, method="softmax", renormalize=renormalize)
    if renormalize:
        torch.testing.assert_close(w.sum(-1), torch.ones(11), rtol=1e-6, atol=0)
    else:
        assert (w.sum(-1) < 0.999).all()  # a top-4 of 16 softmax does not sum to 1


def test_route_renormalize():
    logits = _distinct_logits(9, 12, 2)
    ids, w = torch_fp4.route(logits, 3, "renormalize")
    _check_route(ids, w, logits, 3, method="renormalize")


@pytest.mark.parametrize("grouped", [True, False], ids=["groups", "no_groups"])
def test_route_deepseek_v3(grouped):
    t, e, k = 13, 32, 6
    g = _gen(3)
    for attempt in range(50):
        logits = torch.randn(t, e, generator=g)
        bias = torch.randn(e, generator=g) * 0.3
        # precondition: biased scores and group scores have no near-ties (else resample)
        s = torch.sigmoid(logits.double()) + bias.double()
        srt = s.sort(-1).values
        gs = s.view(t, 8, 4).sort(-1, descending=True).values[..., :2].sum(-1).sort(-1).values
        if (srt.diff(dim=-1).min() > 1e-4) and (gs.diff(dim=-1).min() > 1e-4):
            break
    else:
        raise AssertionError("could not draw tie-free data")
    kw = dict(n_group=8, topk_group=3) if grouped else {}
    ids, w = torch_fp4.route(logits, k, "deepseek_v3", bias=bias, routed_scaling_factor=2.5, **kw)
    _check_route(ids, w, logits, k, method="deepseek_v3", bias=bias, rsf=2.5, **kw)
    torch.testing.assert_close(w.sum(-1), torch.full((t,), 2.5), rtol=1e-6, atol=0)
    if grouped:  # selected experts come from at most topk_group groups
        for row in ids.tolist():
            assert len({i // 4 for i in row}) <= 3
        # and the grouping matters on this data (otherwise the test would not exercise it)
        flat_ids, _ = route_oracle(logits, k, "deepseek_v3", bias=bias, rsf=2.5)
        assert not torch.equal(flat_ids, ids)


def test_route_llama4():
    logits = _distinct_logits(10, 8, 4)
    ids, w = torch_fp4.route(logits, 1, "llama4")
    _check_route(ids, w, logits, 1, method="llama4")


def test_route_ties_lower_expert_first():
    # equal logits: every method picks the lower expert id first
    logits = torch.tensor([[0.0] * 8,
                           [1.0, 3.0, 3.0, 0.0, 3.0, -1.0, 3.0, 2.0],
                           [-2.0, 5.0, -2.0, 5.0, -2.0, -2.0, -2.0, -2.0]])
    expect = torch.tensor([[0, 1, 2], [1, 2, 4], [1, 3, 0]], dtype=torch.int32)
    for method, kw in (("softmax", {}), ("softmax", {"renormalize": True}), ("renormalize", {})):
        ids, w = torch_fp4.route(logits, 3, method, **kw)
        assert torch.equal(ids, expect), (method, kw)
        _check_route(ids, w, logits, 3, method=method, **kw)
    ids, _ = torch_fp4.route(logits, 1, "llama4")
    assert torch.equal(ids, expect[:, :1])
    # deepseek_v3: zero bias, equal scores -> lower groups, then lower ids
    ds = torch.zeros(2, 8)
    ids, w = torch_fp4.route(ds, 3, "deepseek_v3", bias=torch.zeros(8), n_group=4, topk_group=2)
    assert torch.equal(ids, torch.tensor([[0, 1, 2]] * 2, dtype=torch.int32))
    torch.testing.assert_close(w, torch.full((2, 3), 1 / 3))


@settings(max_examples=25, deadline=None)
@given(t=st.integers(1, 6), e=st.integers(2, 20), data=st.data(), seed=st.integers(0, 2**20),
       method=st.sampled_from(["softmax", "softmax-renorm", "renormalize"]))
def test_route_hypothesis(t, e, data, seed, method):
    k = data.draw(st.integers(1, e))
    kw = {"renormalize": True} if method == "softmax-renorm" else {}
    method = method.split("-")[0]
    logits = _distinct_logits(t, e, seed)
    ids, w = torch_fp4.route(logits, k, method, **kw)
    _check_route(ids, w, logits, k, method=method, **kw)


# =============================================================================================
# fused_moe
# =============================================================================================
def _quantize_experts(w: torch.Tensor):
    """[E, rows, K] bf16 -> (data, 128x4 scales, per-expert global scales [E])."""
    gs = torch.cat([torch_fp4.compute_global_scale(w[e]) for e in range(w.shape[0])])
    data, scale = torch_fp4.nvfp4_quantize(w, gs)
    return data, scale, gs


class Moe:
    """Random bf16 experts quantized per expert; w1 rows are [gate; up]."""

    def __init__(self, e=4, h=64, inter=32, seed=0):
        g = _gen(seed)
        self.e, self.h, self.inter = e, h, inter
        self.w1_bf16 = (torch.randn(e, 2 * inter, h, generator=g) * 0.1).to(BF16)
        self.w2_bf16 = (torch.randn(e, h, inter, generator=g) * 0.1).to(BF16)
        self.w1, self.w1_s, self.w1_gs = _quantize_experts(self.w1_bf16)
        self.w2, self.w2_s, self.w2_gs = _quantize_experts(self.w2_bf16)
        assert self.w1_gs.shape == (e,)

    def sliced(self, lo, hi):
        return (self.w1[lo:hi].contiguous(), self.w1_s[lo:hi].contiguous(), self.w1_gs[lo:hi].contiguous(),
                self.w2[lo:hi].contiguous(), self.w2_s[lo:hi].contiguous(), self.w2_gs[lo:hi].contiguous())

    def weights(self):
        return self.sliced(0, self.e)


def _routing(t, e, k, seed):
    g = _gen(seed)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).to(torch.int32)
    w = torch.rand(t, k, generator=g) + 0.05
    return ids, w.float()


def _deq(data, scale):
    return torch_fp4.fp4_dequantize(data, scale, None, block_size=16, out_dtype=torch.float32)


def _f32(v: float) -> torch.Tensor:
    return torch.tensor(v, dtype=torch.float64).float()


def _gemv(vec: torch.Tensor, mat: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """RN_bf16(RN32(RN32(exact dot) * alpha)): exactly rounded dot products (math.fsum)."""
    v = vec.double().tolist()
    sums = [math.fsum(a * b for a, b in zip(v, row)) for row in mat.double().tolist()]
    dot32 = torch.tensor(sums, dtype=torch.float64).float()
    return (dot32 * alpha.float().reshape(())).to(BF16)


def moe_oracle(x, weights, ids, tw, a1_gs=None, a2_gs=None, offset=0, out_dtype=None):
    """Spec section 6, literally, one (t, j) at a time. Returns (out, per-pair y as fp32)."""
    w1, w1_s, w1_gs, w2, w2_s, w2_gs = weights
    n_local = w1.shape[0]
    tokens, hidden = x.shape
    inter = w1.shape[1] // 2
    out_dtype = x.dtype if out_dtype is None else out_dtype
    w1_hat = [_deq(w1[e], w1_s[e]) for e in range(n_local)]
    w2_hat = [_deq(w2[e], w2_s[e]) for e in range(n_local)]
    out = torch.zeros(tokens, hidden, dtype=torch.float32)
    ys = torch.zeros(tokens, ids.shape[1], hidden, dtype=torch.float32)
    for t in range(tokens):
        if a1_gs is None:
            x_t = x[t].float()
        else:  # once per token
            xq, xs = torch_fp4.nvfp4_quantize(x[t:t + 1].contiguous(), a1_gs)
            x_t = _deq(xq, xs)[0]
        acc = torch.zeros(hidden, dtype=torch.float32)
        for j in range(ids.shape[1]):
            e = int(ids[t, j]) - offset
            if not 0 <= e < n_local:
                continue  # non-local expert: contributes zero
            alpha1 = torch_fp4.nvfp4_alpha(a1_gs, w1_gs[e:e + 1])
            h = _gemv(x_t, w1_hat[e], alpha1)
            gate, up = h[:inter].float(), h[inter:].float()
            a = (gate / (1.0 + torch.exp(-gate)) * up).to(BF16)
            if a1_gs is None:
                a_t = a.float()
                alpha2 = torch_fp4.nvfp4_alpha(None, w2_gs[e:e + 1])
            else:
                gs2 = a2_gs[:1] if a2_gs.numel() == 1 else a2_gs[e:e + 1]
                aq, as_ = torch_fp4.nvfp4_quantize(a.reshape(1, inter).contiguous(), gs2)
                a_t = _deq(aq, as_)[0]
                alpha2 = torch_fp4.nvfp4_alpha(gs2, w2_gs[e:e + 1])
            y = _gemv(a_t, w2_hat[e], alpha2).float()
            ys[t, j] = y
            acc = acc + tw[t, j].float() * y  # fp32, j order
        out[t] = acc
    return out.to(out_dtype), ys


def assert_moe_close(out, ref, ys, tw):
    """Tolerance: exact equality expected; allowed is one bf16 ulp of each term w[t,j] * y_j
    (a backend summing the fp32 dot products in another order may round h or y to the
    neighbouring bf16 value) plus one ulp of the output dtype. Also at most 2% of the elements
    may differ at all, so a systematic error cannot hide inside the tolerance."""
    assert out.shape == ref.shape and out.dtype == ref.dtype
    y_ulp = T.ulp(ys, BF16)                                     # [T, k, H]
    tol = (tw.double().abs().unsqueeze(-1) * y_ulp).sum(1) + T.ulp(ref.double(), out.dtype)
    err = (out.double() - ref.double()).abs()
    bad = ~(err <= tol)
    assert not bad.any(), (f"{int(bad.sum())} elements beyond tolerance; first at "
                           f"{bad.nonzero()[0].tolist()}: {out[tuple(bad.nonzero()[0])]} vs "
                           f"{ref[tuple(bad.nonzero()[0])]}")
    differ = (out.double() != ref.double()).sum().item()
    assert differ <= 0.02 * out.numel(), f"{differ} of {out.numel()} elements differ"


def _act_scales(x, moe, per_expert_a2: bool):
    a1 = torch_fp4.compute_global_scale(x)
    # a2: a plausible global scale for the bf16 intermediate activation (any positive value is
    # a valid encode scale; the oracle and the kernel use the same one)
    if per_expert_a2:
        a2 = torch.tensor([96.0, 150.0, 200.0, 310.0][:moe.e], dtype=torch.float32)
    else:
        a2 = torch.tensor([180.0], dtype=torch.float32)
    return a1, a2


@pytest.mark.parametrize("mode", ["w4a16", "w4a4", "w4a4_a2_per_expert"])
def test_fused_moe_matches_oracle(mode):
    moe = Moe(e=4, h=64, inter=32, seed=1)
    t, k = 7, 2
    x = torch.randn(t, moe.h, generator=_gen(2)).to(BF16)
    ids, tw = _routing(t, moe.e, k, 3)
    a1 = a2 = None
    if mode != "w4a16":
        a1, a2 = _act_scales(x, moe, mode.endswith("per_expert"))
    out = torch_fp4.fused_moe(x, *moe.weights(), ids, tw, a1_global_scale=a1, a2_global_scale=a2)
    ref, ys = moe_oracle(x, moe.weights(), ids, tw, a1, a2)
    assert out.dtype == BF16
    assert ref.abs().max() > 0.01  # a real signal
    assert_moe_close(out, ref, ys, tw)
    # sanity: the FP4 MoE approximates the bf16 MoE computed in fp64 (catches a wrong alpha that
    # the oracle might share, e.g. a global scale applied twice)
    full = torch.zeros(t, moe.h, dtype=torch.float64)
    for ti in range(t):
        for j in range(k):
            e = int(ids[ti, j])
            hh = moe.w1_bf16[e].double() @ x[ti].double()
            gate, up = hh[:moe.inter], hh[moe.inter:]
            full[ti] += tw[ti, j].double() * (moe.w2_bf16[e].double() @ (gate * torch.sigmoid(gate) * up))
    rel = torch.linalg.norm(out.double() - full) / torch.linalg.norm(full)
    assert rel < 0.3, rel


def test_fused_moe_oracle_detects_gate_up_swap():
    """The comparison is sharp enough to see [gate; up] vs [up; gate] (guards the oracle)."""
    moe = Moe(e=2, h=32, inter=16, seed=5)
    x = torch.randn(4, moe.h, generator=_gen(6)).to(BF16)
    ids, tw = _routing(4, 2, 2, 7)
    out = torch_fp4.fused_moe(x, *moe.weights(), ids, tw)
    w1s, s1s = torch_fp4.swap_gate_up(moe.w1, moe.w1_s)
    swapped = (w1s, s1s, moe.w1_gs, moe.w2, moe.w2_s, moe.w2_gs)
    ref_swapped, ys_swapped = moe_oracle(x, swapped, ids, tw)
    with pytest.raises(AssertionError):
        assert_moe_close(out, ref_swapped, ys_swapped, tw)
    # and with the swapped weights the kernel matches the swapped oracle
    assert_moe_close(torch_fp4.fused_moe(x, *swapped, ids, tw), ref_swapped, ys_swapped, tw)


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float16, BF16], ids=str)
@pytest.mark.parametrize("w4a4", [False, True], ids=["w4a16", "w4a4"])
def test_fused_moe_fp16_input_and_out_dtype(out_dtype, w4a4):
    moe = Moe(e=3, h=48, inter=16, seed=11)
    t, k = 5, 3
    x = torch.randn(t, moe.h, generator=_gen(12)).half()
    ids, tw = _routing(t, moe.e, k, 13)
    a1, a2 = _act_scales(x, moe, False) if w4a4 else (None, None)
    out = torch_fp4.fused_moe(x, *moe.weights(), ids, tw, a1_global_scale=a1, a2_global_scale=a2,
                              out_dtype=out_dtype)
    ref, ys = moe_oracle(x, moe.weights(), ids, tw, a1, a2, out_dtype=out_dtype)
    assert out.dtype == out_dtype
    assert_moe_close(out, ref, ys, tw)
    # default out dtype is x's dtype
    default = torch_fp4.fused_moe(x, *moe.weights(), ids, tw, a1_global_scale=a1, a2_global_scale=a2)
    assert default.dtype == torch.float16


def test_fused_moe_with_route():
    moe = Moe(e=8, h=32, inter=32, seed=21)
    t = 6
    x = torch.randn(t, moe.h, generator=_gen(22)).to(BF16)
    logits = _distinct_logits(t, moe.e, 23)
    ids, tw = torch_fp4.route(logits, 2, "renormalize")
    out = torch_fp4.fused_moe(x, *moe.weights(), ids, tw)
    ref, ys = moe_oracle(x, moe.weights(), ids, tw)
    assert_moe_close(out, ref, ys, tw)


@pytest.mark.parametrize("w4a4", [False, True], ids=["w4a16", "w4a4"])
def test_fused_moe_expert_parallel(w4a4):
    moe = Moe(e=6, h=32, inter=16, seed=31)
    t, k, lo, hi = 9, 2, 2, 4  # this rank holds experts 2 and 3
    x = torch.randn(t, moe.h, generator=_gen(32)).to(BF16)
    ids, tw = _routing(t, moe.e, k, 33)
    ids[0] = torch.tensor([0, 5], dtype=torch.int32)  # token 0: no local expert
    ids[1] = torch.tensor([2, 3], dtype=torch.int32)  # token 1: both local
    ids[2] = torch.tensor([1, 3], dtype=torch.int32)  # token 2: one local
    a1 = a2 = a2_local = None
    if w4a4:
        a1, a2 = _act_scales(x, moe, True)
        a2 = torch.tensor([96.0, 150.0, 200.0, 310.0, 64.0, 128.0])
        a2_local = a2[lo:hi].contiguous()
    local = moe.sliced(lo, hi)
    out = torch_fp4.fused_moe(x, *local, ids, tw, a1_global_scale=a1, a2_global_scale=a2_local,
                              local_expert_offset=lo, num_local_experts=hi - lo)
    # (1) the full-E result with non-local pairs masked to weight 0 (0 * y adds exactly 0)
    is_local = (ids >= lo) & (ids < hi)
    full_masked = torch_fp4.fused_moe(x, *moe.weights(), ids, tw * is_local, a1_global_scale=a1,
                                      a2_global_scale=a2)
    assert torch.equal(out, full_masked)
    # (2) the oracle, which skips non-local pairs
    ref, ys = moe_oracle(x, local, ids, tw, a1, a2_local, offset=lo)
    assert_moe_close(out, ref, ys, tw)
    # (3) tokens routed to no local expert give exact zeros; others do not
    none_local = ~is_local.any(1)
    assert none_local[0] and not none_local[1:3].any()
    assert (out[none_local] == 0).all()
    assert (out[~none_local].abs().amax(1) > 0).all()


@pytest.mark.parametrize("w4a4", [False, True], ids=["w4a16", "w4a4"])
def test_fused_moe_expert_parallel_rank0(w4a4):
    """Rank 0 of an expert-parallel group: local_expert_offset=0 with num_local_experts given."""
    moe = Moe(e=6, h=32, inter=16, seed=31)
    t, k = 9, 2
    x = torch.randn(t, moe.h, generator=_gen(32)).to(BF16)
    ids, tw = _routing(t, moe.e, k, 33)
    a1, _ = _act_scales(x, moe, True) if w4a4 else (None, None)
    a2 = torch.tensor([96.0, 150.0, 200.0, 310.0, 64.0, 128.0]) if w4a4 else None
    # the ranks' partial results sum to the full result (the caller's all-reduce)
    parts = []
    for r0, r1 in ((2, 4), (4, 6), (0, 2)):  # rank 0 last: the other ranks are checked first
        a2_r = None if a2 is None else a2[r0:r1].contiguous()
        part = torch_fp4.fused_moe(x, *moe.sliced(r0, r1), ids, tw, a1_global_scale=a1,
                                   a2_global_scale=a2_r, local_expert_offset=r0,
                                   num_local_experts=r1 - r0, out_dtype=torch.float32)
        ref, ys = moe_oracle(x, moe.sliced(r0, r1), ids, tw, a1, a2_r, offset=r0,
                             out_dtype=torch.float32)
        assert_moe_close(part, ref, ys, tw)
        parts.append(part)
    full = torch_fp4.fused_moe(x, *moe.weights(), ids, tw, a1_global_scale=a1, a2_global_scale=a2,
                               out_dtype=torch.float32)
    torch.testing.assert_close(sum(parts), full, rtol=1e-6, atol=1e-6)
    # without expert parallelism (neither offset nor num_local_experts), a token with an id
    # outside [0, E) gets NaN in every column; the other tokens equal rank 0's expert-parallel
    # result with the same two experts
    ids2 = ids.clone()
    ids2[0] = torch.tensor([1, 0], dtype=ids.dtype)
    ids2[1, 1] = -1
    a2_0 = None if a2 is None else a2[0:2].contiguous()
    got = torch_fp4.fused_moe(x, *moe.sliced(0, 2), ids2, tw, a1_global_scale=a1, a2_global_scale=a2_0,
                              out_dtype=torch.float32)
    ep = torch_fp4.fused_moe(x, *moe.sliced(0, 2), ids2, tw, a1_global_scale=a1, a2_global_scale=a2_0,
                             local_expert_offset=0, num_local_experts=2, out_dtype=torch.float32)
    stray = ((ids2 < 0) | (ids2 >= 2)).any(dim=1)
    assert stray[1] and not stray[0]
    assert got[stray].isnan().all() and not got[~stray].isnan().any()
    assert torch.equal(got[~stray], ep[~stray])


def test_fused_moe_deterministic():
    moe = Moe(e=4, h=64, inter=32, seed=41)
    x = torch.randn(8, moe.h, generator=_gen(42)).to(BF16)
    ids, tw = _routing(8, moe.e, 3, 43)
    a1, a2 = _act_scales(x, moe, False)
    for kw in ({}, {"a1_global_scale": a1, "a2_global_scale": a2}):
        first = torch_fp4.fused_moe(x, *moe.weights(), ids, tw, **kw)
        second = torch_fp4.fused_moe(x, *moe.weights(), ids, tw, **kw)
        assert torch.equal(first.view(torch.int16), second.view(torch.int16))


def test_fused_moe_uint8_views():
    moe = Moe(e=2, h=32, inter=16, seed=51)
    x = torch.randn(3, moe.h, generator=_gen(52)).to(BF16)
    ids, tw = _routing(3, 2, 2, 53)
    typed = torch_fp4.fused_moe(x, *moe.weights(), ids, tw)
    u8 = [t.view(torch.uint8) if t.element_size() == 1 else t for t in moe.weights()]
    assert torch.equal(typed.view(torch.int16), torch_fp4.fused_moe(x, *u8, ids, tw).view(torch.int16))


# =============================================================================================
# swap_gate_up
# =============================================================================================
def _unswizzle_128x4_by_formula(sf: torch.Tensor, rows: int, kb: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Spec section 4 offset formula, element by element: ([E, rows, kb] bytes, padding mask)."""
    e_n, mp, kp = sf.shape
    flat = sf.view(torch.uint8).reshape(e_n, -1)
    out = torch.zeros(e_n, rows, kb, dtype=torch.uint8)
    used = torch.zeros(mp * kp, dtype=torch.bool)
    for m in range(rows):
        for b in range(kb):
            off = ((m // 128) * (kp // 4) + b // 4) * 512 + (m % 32) * 16 + ((m % 128) // 32) * 4 + b % 4
            out[:, m, b] = flat[:, off]
            used[off] = True
    return out, flat[:, ~used]


@pytest.mark.parametrize("inter,hidden", [(48, 64), (64, 32), (16, 80)])
def test_swap_gate_up(inter, hidden):
    e = 3
    w = (torch.randn(e, 2 * inter, hidden, generator=_gen(inter + hidden)) * 0.1).to(BF16)
    data, scale, gs = _quantize_experts(w)
    assert scale.shape == (e, 128 * math.ceil(2 * inter / 128), 4 * math.ceil(hidden // 16 / 4))
    sw_data, sw_scale = torch_fp4.swap_gate_up(data, scale)
    assert sw_data.shape == data.shape and sw_scale.shape == scale.shape
    assert sw_data.dtype == data.dtype and sw_scale.dtype == scale.dtype
    # data rows swapped
    raw, sw_raw = data.view(torch.uint8), sw_data.view(torch.uint8)
    assert torch.equal(sw_raw[:, :inter], raw[:, inter:]) and torch.equal(sw_raw[:, inter:], raw[:, :inter])
    # scales: decoded with the spec's offset formula, rows swapped; padding bytes stay 0
    kb = hidden // 16
    sf, pad = _unswizzle_128x4_by_formula(scale, 2 * inter, kb)
    sw_sf, sw_pad = _unswizzle_128x4_by_formula(sw_scale, 2 * inter, kb)
    assert torch.equal(sw_sf, torch.cat((sf[:, inter:], sf[:, :inter]), 1))
    assert not torch.equal(sw_sf, sf)
    assert (pad == 0).all() and (sw_pad == 0).all()
    # dequantized: the swapped halves
    for ex in range(e):
        deq = _deq(data[ex], scale[ex])
        sw_deq = _deq(sw_data[ex], sw_scale[ex])
        assert torch.equal(sw_deq, torch.cat((deq[inter:], deq[:inter])))
    # involution: twice is the identity, data and swizzled scales, bit for bit
    back_data, back_scale = torch_fp4.swap_gate_up(sw_data, sw_scale)
    assert torch.equal(back_data.view(torch.uint8), raw)
    assert torch.equal(back_scale.view(torch.uint8), scale.view(torch.uint8))
    # data only
    only, none = torch_fp4.swap_gate_up(data)
    assert none is None and torch.equal(only.view(torch.uint8), sw_raw)
    # new tensors: the input is not modified
    assert not torch.equal(sw_raw, raw)


@pytest.mark.parametrize("layout", ["8x4", "linear"])
def test_swap_gate_up_other_layouts(layout):
    e, inter, hidden = 2, 24, 48
    w = (torch.randn(e, 2 * inter, hidden, generator=_gen(61)) * 0.1).to(BF16)
    gs = torch.cat([torch_fp4.compute_global_scale(w[i]) for i in range(e)])
    data, scale = torch_fp4.nvfp4_quantize(w, gs, sf_layout=layout)
    sw_data, sw_scale = torch_fp4.swap_gate_up(data, scale, sf_layout=layout)
    for ex in range(e):
        deq = torch_fp4.fp4_dequantize(data[ex], scale[ex], None, sf_layout=layout, out_dtype=torch.float32)
        sw = torch_fp4.fp4_dequantize(sw_data[ex], sw_scale[ex], None, sf_layout=layout,
                                      out_dtype=torch.float32)
        assert torch.equal(sw, torch.cat((deq[inter:], deq[:inter])))
    back_data, back_scale = torch_fp4.swap_gate_up(sw_data, sw_scale, sf_layout=layout)
    assert torch.equal(back_data.view(torch.uint8), data.view(torch.uint8))
    assert torch.equal(back_scale.view(torch.uint8), scale.view(torch.uint8))


def test_fused_moe_with_padded_intermediate():
    """I = 48 (2I = 96 rows, scales padded to 128 rows; w2 K = 48 -> 3 k-blocks padded to 4)."""
    moe = Moe(e=2, h=32, inter=48, seed=71)
    x = torch.randn(5, moe.h, generator=_gen(72)).to(BF16)
    ids, tw = _routing(5, 2, 2, 73)
    for a1, a2 in ((None, None), _act_scales(x, moe, False)):
        out = torch_fp4.fused_moe(x, *moe.weights(), ids, tw, a1_global_scale=a1, a2_global_scale=a2)
        ref, ys = moe_oracle(x, moe.weights(), ids, tw, a1, a2)
        assert_moe_close(out, ref, ys, tw)
