"""One dispatch path for every op (ops._registry.run): a repeated call on the same problem is
validated and decided once (no requirement, tactic-space or cache work after the first call), a new problem, a
forced tactic, autotuning or a changed tactic cache decide afresh. Counted, not timed."""
import torch

import torch_fp4 as t4
from torch_fp4 import tactics
from torch_fp4 import testing as T
from torch_fp4.ops import _registry


def _count(monkeypatch):
    calls = []
    real = _registry.requirement_reason

    def counted(op, backend, problem):
        calls.append(op)
        return real(op, backend, problem)

    monkeypatch.setattr(_registry, "requirement_reason", counted)
    return calls


def test_a_repeated_call_is_decided_once(monkeypatch):
    wq, ws, gs = T.quantized_weight(128, 64)
    x = torch.randn(2, 64, dtype=torch.bfloat16)
    calls = _count(monkeypatch)
    first = t4.mm_fp4(x, wq.T, None, ws.T)
    decided = len(calls)
    assert decided >= 1
    for _ in range(3):
        assert torch.equal(t4.mm_fp4(x, wq.T, None, ws.T), first)
        t4.mm_fp4(torch.randn(2, 64, dtype=torch.bfloat16), wq.T, None, ws.T)   # same problem, new values
    assert len(calls) == decided
    t4.mm_fp4(torch.randn(3, 64, dtype=torch.bfloat16), wq.T, None, ws.T)       # a new M
    assert len(calls) == 2 * decided
    tactics.forget()                                                            # the cache changed
    t4.mm_fp4(x, wq.T, None, ws.T)
    assert len(calls) == 3 * decided


def test_every_op_goes_through_the_decision_cache(monkeypatch):
    x = torch.randn(4, 64)
    kw = T.moe_problem()
    _registry.clear_decisions()   # moe_problem routed and quantized already
    calls = _count(monkeypatch)

    def every_op():
        gs = t4.compute_global_scale(x)
        d, s = t4.nvfp4_quantize(x, gs)
        t4.fp4_dequantize(d, s, gs)
        t4.mxfp4_quantize(x)
        t4.route(torch.randn(6, 4), 2)
        t4.fused_moe(**kw)

    every_op()
    first = list(calls)
    assert {"compute_global_scale", "nvfp4_quantize", "fp4_dequantize", "mxfp4_quantize", "route",
            "fused_moe"} <= set(first)
    every_op()
    assert calls == first, "the second round made decisions again"


def test_forced_tactics_are_checked_on_every_call():
    from torch_fp4.kernels.cuda.mm_tactics import CudaMmTactic

    wq, ws, _ = T.quantized_weight(128, 64)
    x = torch.randn(2, 64, dtype=torch.bfloat16)
    t4.mm_fp4(x, wq.T, None, ws.T)
    with t4.use_tactic(CudaMmTactic()):
        try:
            t4.mm_fp4(x, wq.T, None, ws.T)
        except (ValueError, RuntimeError) as exc:   # the cuda backend cannot run CPU tensors
            assert "cuda" in str(exc)
        else:
            raise AssertionError("a forced cuda tactic ran on CPU tensors")


def test_a_repeated_problem_is_validated_once(monkeypatch):
    """ops._registry.run: the op's validation runs once per (dtypes, devices, shapes, strides,
    alignment, other arguments); bad inputs still fail on every call; fakes validate afresh."""
    from torch_fp4.ops import gemm

    calls = []
    real = gemm._validate

    def counted(*args):
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(gemm, "_validate", counted)
    wq, ws, gs = T.quantized_weight(128, 64)
    for _ in range(3):
        t4.mm_fp4(torch.randn(2, 64, dtype=torch.bfloat16), wq.T, None, ws.T)
    assert len(calls) == 1
    t4.mm_fp4(torch.randn(5, 64, dtype=torch.bfloat16), wq.T, None, ws.T)        # a new M
    t4.mm_fp4(torch.randn(5, 64, dtype=torch.float16), wq.T, None, ws.T)         # a new dtype
    t4.mm_fp4(torch.randn(5, 64, dtype=torch.float16), wq.T, None, ws.T, out_dtype=torch.float32)
    assert len(calls) == 4
    bad = torch.randn(5, 65, dtype=torch.bfloat16)
    for _ in range(2):
        try:
            t4.mm_fp4(bad, wq.T, None, ws.T)
        except ValueError as exc:
            assert "mm_fp4: a: expected shape [M, 64]" in str(exc)
        else:
            raise AssertionError("a bad shape passed")
    assert len(calls) == 6
    with torch._subclasses.fake_tensor.FakeTensorMode():   # the fake implementation
        a = torch.empty(2, 64, dtype=torch.bfloat16)
        b, b_scale = torch.empty(128, 32, dtype=torch.uint8).T, torch.empty(128, 4, dtype=torch.uint8).T
        for _ in range(2):
            gemm.mm_fp4_op(a, b, None, b_scale, None, torch.bfloat16, 16, "128x4", 0, "row")
    assert len(calls) == 8
