"""The problem objects (torch_fp4/problems.py): frozen, built once per problem by the op's
validation, holding the facts dispatch reads, and passed unchanged to the requirement functions,
the "auto" order and the tactic spaces; supported_backends / unsupported_reason take a problem or
the op's public arguments."""
import dataclasses

import pytest
import torch

import torch_fp4 as t4
from torch_fp4 import formats as F
from torch_fp4 import testing as T
from torch_fp4 import tuning
from torch_fp4.backends import Backend
from torch_fp4.ops import _registry
from torch_fp4.problems import (NO_GPU, DequantizeProblem, GlobalScaleProblem, MmProblem, MoeProblem,
                                QuantizeProblem, RouteProblem, alignment)


def _planned(op):
    """The problems of the plans cached for `op` (ops._registry.run)."""
    return [plan.problem for key, plan in _registry._PLANS.items() if key[0] is _registry._PROBLEMS[op][1]]


def test_problems_are_frozen_and_hashable():
    wq, ws, _ = T.quantized_weight(128, 64)
    p = MmProblem.of(torch.randn(2, 64, dtype=torch.bfloat16), wq.T, None, ws.T, None, torch.float32, F.NVFP4,
                     F.SfLayout.LAYOUT_128x4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.m = 3
    assert hash(p) == hash(dataclasses.replace(p)) and p == dataclasses.replace(p)
    assert p.on((9, 0)).capability == (9, 0) and p.capability == NO_GPU
    with pytest.raises(TypeError):   # keyword-only: no positional tuple again
        MmProblem(torch.device("cpu"), NO_GPU)


def test_mm_problem_holds_what_dispatch_reads():
    wq, ws, gs = T.quantized_weight(256, 128, F.MXFP4)
    x = torch.randn(5, 128, dtype=torch.float16)
    t4.mm_fp4(x, wq.T, None, ws.T, out_dtype=torch.float32, block_size=32)
    (p,) = _planned("mm_fp4")
    assert (p.m, p.n, p.k) == (5, 256, 128)
    assert p.fmt is F.MXFP4 and not p.w4a4 and p.a_dtype == torch.float16 and p.a_itemsize == 2
    assert p.sf_layout is F.SfLayout.LAYOUT_128x4 and p.weight_layout is F.WeightLayout.ROW and not p.packed
    assert p.out_dtype == torch.float32 and not p.has_alpha
    assert p.device == torch.device("cpu") and p.capability == NO_GPU and not p.is_cuda
    assert (p.a_align, p.b_align, p.b_scale_align) == (alignment(x), alignment(wq.T), alignment(ws.T))
    # W4A4: the activation scales' layout, as validated (a name becomes the enum)
    _registry.clear_decisions()
    a, a_scale = t4.nvfp4_quantize(torch.randn(3, 128), torch.ones(1), "8x4")
    wq, ws, _ = T.quantized_weight(256, 128)
    t4.mm_fp4(a, wq.T, a_scale, ws.T, sf_layout="8x4")
    (p,) = _planned("mm_fp4")
    assert p.w4a4 and p.fmt is F.NVFP4 and p.sf_layout is F.SfLayout.LAYOUT_8x4 and p.a_dtype == a.dtype
    assert p.out_dtype == torch.bfloat16


def test_alignment_of_a_view():
    buf = torch.zeros(64, dtype=torch.uint8)
    assert alignment(buf) == 16
    assert [alignment(buf[i:]) for i in (1, 2, 4, 8, 12)] == [1, 2, 4, 8, 4]


def test_alignment_of_tensors_without_memory():
    """Meta and fake tensors (tactic listings without memory): storage 16-byte aligned, views by
    their offset; a fake tensor's address is never read (deprecated: a warning, later an error)."""
    import warnings

    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        fake = torch.empty(64, dtype=torch.uint8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [alignment(fake[i:]) for i in (0, 1, 2, 4, 8, 12)] == [16, 1, 2, 4, 8, 4]
    meta = torch.empty(64, dtype=torch.uint8, device="meta")
    assert [alignment(meta[i:]) for i in (0, 1, 2, 4, 8, 12)] == [16, 1, 2, 4, 8, 4]


def test_quantize_family_problems():
    x = torch.randn(3, 8, 64)
    gs = torch.ones(3)
    t4.compute_global_scale(x)
    d, s = t4.nvfp4_quantize(x, gs, "linear")
    t4.mxfp4_quantize(x[0])
    t4.fp4_dequantize(d, s, gs, sf_layout="linear", out_dtype=torch.float16)
    (g,) = _planned("compute_global_scale")
    assert g == GlobalScaleProblem(device=x.device, capability=NO_GPU, numel=3 * 8 * 64, dtype=torch.float32)
    (q,) = _planned("nvfp4_quantize")
    assert q == QuantizeProblem(device=x.device, capability=NO_GPU, fmt=F.NVFP4, sf_layout=F.SfLayout.LINEAR,
                                batch=3, rows=8, k=64, x_dtype=torch.float32)
    assert q.numel == x.numel()
    (mx,) = _planned("mxfp4_quantize")
    assert mx.fmt is F.MXFP4 and mx.batch is None and (mx.rows, mx.k) == (8, 64)
    (dq,) = _planned("fp4_dequantize")
    assert dq == DequantizeProblem(device=x.device, capability=NO_GPU, fmt=F.NVFP4, sf_layout=F.SfLayout.LINEAR,
                                   batch=3, rows=8, k=64, has_global_scale=True, out_dtype=torch.float16)
    assert dq.numel == d.numel()   # the size band of "auto" reads the packed data's elements


def test_route_and_moe_problems():
    t4.route(torch.randn(6, 4), 2, "renormalize")
    (r,) = _planned("route")
    assert (r.tokens, r.experts, r.top_k, r.method, r.logits_dtype) == (6, 4, 2, "renormalize", torch.float32)
    kw = T.moe_problem(tokens=3, hidden=64, inter=128, experts=2, top_k=1)
    _registry.clear_decisions()
    t4.fused_moe(**kw)
    (m,) = _planned("fused_moe")
    assert isinstance(m, MoeProblem)
    assert (m.tokens, m.hidden, m.inter, m.experts, m.top_k) == (3, 64, 128, 2, 1)
    assert m.w4a4 == (kw["a1_global_scale"] is not None) and m.out_dtype == kw["x"].dtype
    assert m.strict_ids and m.local_expert_offset == 0
    ep = t4.ops.moe._moe_problem(*(kw[k] for k in ("x", "w1", "w1_scale", "w1_global_scale", "w2", "w2_scale",
                                                   "w2_global_scale", "topk_ids", "topk_weights")),
                                 None, None, 4, 2, None, 0)[0]
    assert not ep.strict_ids and ep.local_expert_offset == 4 and not ep.w4a4 and not ep.a2_per_expert


def test_a_repeated_call_builds_one_problem_and_passes_it_down(monkeypatch):
    """Validation builds the problem once per problem key; the requirement functions and the
    "auto" order get that same object."""
    built, seen = [], []
    real_of = MmProblem.of.__func__

    def counted_of(cls, *args):
        built.append(1)
        return real_of(cls, *args)

    wq, ws, _ = T.quantized_weight(128, 64)
    real_reason, real_order = _registry.requirement_reason, _registry.auto_order
    monkeypatch.setattr(MmProblem, "of", classmethod(counted_of))
    monkeypatch.setattr(_registry, "requirement_reason",
                        lambda op, b, p: seen.append(p) or real_reason(op, b, p))
    monkeypatch.setattr(_registry, "auto_order", lambda op, p: seen.append(p) or real_order(op, p))
    for _ in range(3):
        t4.mm_fp4(torch.randn(2, 64, dtype=torch.bfloat16), wq.T, None, ws.T)
    assert len(built) == 1
    (p,) = _planned("mm_fp4")
    assert seen and all(s is p for s in seen)
    t4.mm_fp4(torch.randn(7, 64, dtype=torch.bfloat16), wq.T, None, ws.T)     # a new problem
    assert len(built) == 2


def test_supported_backends_takes_a_problem_or_public_arguments():
    wq, ws, _ = T.quantized_weight(128, 64)
    x = torch.randn(2, 64, dtype=torch.bfloat16)
    by_args = t4.supported_backends("mm_fp4", x, wq.T, None, ws.T)
    p = MmProblem.of(x, wq.T, None, ws.T, None, torch.bfloat16, F.NVFP4, F.SfLayout.LAYOUT_128x4)
    assert by_args == t4.supported_backends("mm_fp4", p) == [Backend.REFERENCE]
    assert t4.unsupported_reason("mm_fp4", "cuda", p) == t4.unsupported_reason("mm_fp4", Backend.CUDA, x, wq.T,
                                                                                None, ws.T)
    assert "needs CUDA tensors" in t4.unsupported_reason("mm_fp4", "triton", x, wq.T, None, ws.T)
    assert t4.unsupported_reason("mxfp4_quantize", "reference", torch.randn(4, 64), sf_layout="linear") is None
    assert t4.supported_backends("route", torch.randn(6, 4), 2) == [Backend.REFERENCE]
    # public arguments are validated as the op validates them
    with pytest.raises(ValueError, match="mm_fp4: a: expected shape"):
        t4.supported_backends("mm_fp4", torch.randn(2, 65, dtype=torch.bfloat16), wq.T, None, ws.T)
    with pytest.raises(ValueError, match="mm_fp9: op: expected one of"):
        t4.supported_backends("mm_fp9", x)


def test_auto_order_reads_the_problem():
    wq, ws, _ = T.quantized_weight(128, 64)
    p = MmProblem.of(torch.randn(2, 64, dtype=torch.bfloat16), wq.T, None, ws.T, None, torch.bfloat16,
                     F.NVFP4, F.SfLayout.LAYOUT_128x4)
    assert tuning.auto_order("mm_fp4", p)[0] is Backend.CUDA
    big = dataclasses.replace(p, m=tuning.CUDA_MM_MAX_M + 1)
    assert Backend.CUDA not in tuning.auto_order("mm_fp4", big)
    hopper = dataclasses.replace(big, device=torch.device("cuda", 0), capability=tuning.HOPPER_MM)
    assert tuning.auto_order("mm_fp4", hopper)[0] is Backend.CUDA
    q = QuantizeProblem(device=torch.device("cuda", 0), capability=(9, 0), fmt=F.NVFP4,
                        sf_layout=F.SfLayout.LAYOUT_128x4, batch=None, rows=128, k=64, x_dtype=torch.bfloat16)
    assert tuning.auto_order("nvfp4_quantize", q)[0] is Backend.CUDA
    assert tuning.auto_order("route", RouteProblem(device=q.device, capability=(9, 0), tokens=1, experts=4,
                                                   top_k=1, method="softmax", logits_dtype=torch.float32)) == (
        Backend.TRITON, Backend.REFERENCE)
