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


def _recorded_calls(monkeypatch) -> list:
    """(op, validate, args) of every run() of every public op on the CPU (eager path)."""
    seen = []
    real = _registry.run

    def recording(op, validate, args, build):
        seen.append((op, validate, args))
        return real(op, validate, args, build)

    for mod in ("gemm", "moe", "quantize"):
        monkeypatch.setattr(f"torch_fp4.ops.{mod}.run", recording)
    x = torch.randn(4, 64)
    gs = t4.compute_global_scale(x)
    d, s = t4.nvfp4_quantize(x, gs)
    t4.fp4_dequantize(d, s, gs)
    t4.mxfp4_quantize(x)
    t4.fp4_quantized_values(x, gs)
    t4.route(torch.randn(6, 4), 2)
    t4.fused_moe(**T.moe_problem())
    wq, ws, wgs = T.quantized_weight(128, 64)
    t4.mm_fp4(x.to(torch.bfloat16), wq.T, None, ws.T, b_global_scale=wgs, bias=torch.randn(128))
    return seen


def _variants(a):
    """Arguments that differ from a in one thing the key must see, and one it must not."""
    if isinstance(a, torch.Tensor):
        out = [torch.empty_like(a)]                                                # equal key
        out.append(torch.empty(a.shape, dtype=torch.float16 if a.dtype != torch.float16 else torch.float32))
        out.append(torch.empty((2 * a.shape[0], *a.shape[1:]) if a.dim() else (1,), dtype=a.dtype))  # shape
        if a.dim() == 2 and a.shape[0] > 1 and a.shape[1] > 1:
            out.append(torch.empty(a.shape[::-1], dtype=a.dtype).t())                # strides
        out.append(torch.empty(a.numel() + 1, dtype=a.dtype)[1:].view(a.shape))     # 16-byte alignment
        return out
    if a is None:
        return [torch.ones(1)]
    if isinstance(a, bool):
        return [not a, int(a)]
    if isinstance(a, int):
        return [a + 1, float(a), True]
    if isinstance(a, float):
        return [a + 1.0, int(a) if a == int(a) else a * 2]
    if isinstance(a, str):
        return [a + "x"]
    return [None]


def test_each_ops_key_function_tells_calls_apart_as_the_generic_key(monkeypatch):
    """run()'s per-op key (_registry.key_function, from the op's schema) puts two calls under one
    key exactly when _problem_key does: over every public op's recorded arguments and variants
    that change one argument's dtype, shape, strides, alignment, value or type (or only its
    identity). A tensor where the schema has none fails validation (so no plan is kept under a
    key holding one)."""
    calls = _recorded_calls(monkeypatch)
    assert {op for op, _, _ in calls} >= {"compute_global_scale", "nvfp4_quantize", "fp4_dequantize",
                                          "mxfp4_quantize", "fp4_quantized_values", "route", "fused_moe",
                                          "mm_fp4"}
    for op, validate, args in calls:
        spec = _registry._KEYS[op]
        schema = getattr(torch.ops.torch_fp4, op).default._schema
        assert len(schema.arguments) == len(args), op
        group = [args] + [args[:i] + (v,) + args[i + 1:] for i, a in enumerate(args) for v in _variants(a)]
        keys = []
        for g in group:
            try:
                keys.append((spec(validate, g), _registry._problem_key(validate, g)))
            except AttributeError:   # a non-tensor where the schema has a Tensor: no key, validated
                assert any(isinstance(arg.type, torch.TensorType) and not isinstance(v, torch.Tensor)
                           for arg, v in zip(schema.arguments, g)), op
        assert len(keys) >= len(group) // 2, op
        for s1, g1 in keys:
            for s2, g2 in keys:
                assert (s1 == s2) == (g1 == g2), op
        for i, arg in enumerate(schema.arguments):
            if "Tensor" not in str(arg.type):
                try:
                    validate(*args[:i], torch.tensor(1), *args[i + 1:])
                except (TypeError, ValueError, RuntimeError):
                    pass
                else:
                    raise AssertionError(f"{op}: a tensor for {arg.name} passed validation")
