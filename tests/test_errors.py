"""Bad input gets ValueError/TypeError naming the argument, what was expected and what was given."""
import pytest
import torch

import torch_fp4 as t4
from torch_fp4 import testing as T


def raises(exc, *fragments):
    """pytest.raises that also checks every fragment appears in the message."""
    class _Ctx:
        def __enter__(self):
            self.cm = pytest.raises(exc)
            self.info = self.cm.__enter__()
            return self.info

        def __exit__(self, *a):
            out = self.cm.__exit__(*a)
            msg = str(self.info.value)
            for frag in fragments:
                assert frag in msg, f"{frag!r} not in {msg!r}"
            return out
    return _Ctx()


X = torch.randn(4, 32, dtype=torch.bfloat16)
GS = torch.ones(1)


# --- quantize -----------------------------------------------------------------------------------
def test_quantize_wrong_dtype():
    with raises(TypeError, "nvfp4_quantize", "x", "expected dtype", "int32"):
        t4.nvfp4_quantize(torch.ones(4, 32, dtype=torch.int32), GS)


def test_quantize_k_not_multiple_of_block():
    with raises(ValueError, "x", "multiple of 16", "40"):
        t4.nvfp4_quantize(torch.randn(4, 40), GS)
    with raises(ValueError, "mxfp4_quantize", "multiple of 32", "48"):
        t4.mxfp4_quantize(torch.randn(4, 48))


@pytest.mark.parametrize("shape", [(32,), (2, 2, 2, 32)])
def test_quantize_rank(shape):
    with raises(ValueError, "x", "2-D [M, K] or 3-D [E, M, K]", str(tuple(shape))):
        t4.mxfp4_quantize(torch.randn(shape))


def test_quantize_non_contiguous():
    with raises(ValueError, "x", "contiguous", "strides"):
        t4.nvfp4_quantize(torch.randn(32, 64).T, GS)


def test_global_scale_dtype_and_shape():
    with raises(TypeError, "global_scale", "float32", "bfloat16"):
        t4.nvfp4_quantize(X, torch.ones(1, dtype=torch.bfloat16))
    with raises(ValueError, "global_scale", "shape [1]", "(2,)"):
        t4.nvfp4_quantize(X, torch.ones(2))
    with raises(ValueError, "global_scale", "[3]", "(2,)"):
        t4.nvfp4_quantize(torch.randn(3, 4, 32), torch.ones(2))


def test_global_scale_not_a_tensor():
    with raises(TypeError, "global_scale", "torch.Tensor", "float"):
        t4.nvfp4_quantize(X, 1.0)


def test_mixed_devices():
    with raises(ValueError, "global_scale", "cpu", "meta"):
        t4.nvfp4_quantize(X, torch.ones(1, device="meta"))


def test_unknown_layout_and_backend():
    with raises(ValueError, "sf_layout", "'128x4'", "'64x4'"):
        t4.nvfp4_quantize(X, GS, sf_layout="64x4")
    with raises(ValueError, "backend", "'reference'", "'fast'"):
        t4.mxfp4_quantize(X, backend="fast")


@pytest.mark.parametrize("backend", ["cuda", "triton", "cute-dsl"])
def test_gpu_backend_on_cpu_tensors_names_it(backend):
    with raises(ValueError, "backend", repr(backend)):
        t4.mxfp4_quantize(X, backend=backend)


# --- dequantize ---------------------------------------------------------------------------------
D, S = t4.nvfp4_quantize(X, GS)


def test_dequantize_scale_shape_mismatch():
    with raises(ValueError, "fp4_dequantize", "scale", "(128, 4)", "(128, 8)"):
        t4.fp4_dequantize(D, torch.zeros(128, 8, dtype=torch.float8_e4m3fn))
    with raises(ValueError, "scale", "(4, 2)", "(128, 4)"):
        t4.fp4_dequantize(D, S, sf_layout="linear")


def test_dequantize_scale_dtype_mismatch():
    with raises(TypeError, "scale", "float8_e4m3fn", "float8_e8m0fnu"):
        t4.fp4_dequantize(D, S.view(torch.float8_e8m0fnu))


def test_dequantize_block_size_and_global_scale_rules():
    with raises(ValueError, "block_size", "16 (NVFP4) or 32 (MXFP4)", "8"):
        t4.fp4_dequantize(D, S, block_size=8)
    dm, sm = t4.mxfp4_quantize(X)
    with raises(ValueError, "global_scale", "None for MXFP4"):
        t4.fp4_dequantize(dm, sm, GS, block_size=32)


def test_dequantize_data_dtype_and_out_dtype():
    with raises(TypeError, "data", "float4_e2m1fn_x2", "int8"):
        t4.fp4_dequantize(D.view(torch.int8), S)
    with raises(TypeError, "out_dtype", "bfloat16", "torch.int32"):
        t4.fp4_dequantize(D, S, out_dtype=torch.int32)


# --- mm_fp4 -------------------------------------------------------------------------------------
WQ, WS, WGS = T.quantized_weight(24, 32)


def test_mm_b_must_be_transposed_view():
    with raises(ValueError, "mm_fp4", "b", "transpose", "w.T"):
        t4.mm_fp4(D, WQ.T.contiguous(), S, WS.T)


def test_mm_b_scale_shape_and_layout():
    with raises(ValueError, "b_scale", "(4, 128)", "(128, 4)"):
        t4.mm_fp4(D, WQ.T, S, WS)
    with raises(ValueError, "b_scale", "transpose"):
        t4.mm_fp4(D, WQ.T, S, WS.T.contiguous())


def test_mm_k_mismatch():
    a = torch.randn(4, 64, dtype=torch.bfloat16)
    with raises(ValueError, "a", "[M, 32]", "(4, 64)"):
        t4.mm_fp4(a, WQ.T, None, WS.T)
    da, sa = t4.nvfp4_quantize(a, GS)
    with raises(ValueError, "a", "[M, 16]", "(4, 32)"):
        t4.mm_fp4(da, WQ.T, sa, WS.T)


def test_mm_missing_a_scale_and_bad_a_dtype():
    with raises(ValueError, "a_scale", "block scales", "None"):
        t4.mm_fp4(D, WQ.T, None, WS.T)
    with raises(TypeError, "a", "bfloat16", "float32"):
        t4.mm_fp4(X.float(), WQ.T, None, WS.T)


def test_mm_format_mismatch():
    with raises(TypeError, "a_scale", "float8_e8m0fnu", "float8_e4m3fn"):
        t4.mm_fp4(D, WQ.T, S, WS.T, block_size=32)


def test_mm_alpha_and_out_dtype():
    with raises(ValueError, "alpha", "one-element", "(2,)"):
        t4.mm_fp4(D, WQ.T, S, WS.T, alpha=torch.ones(2))
    with raises(TypeError, "alpha", "float32", "float64"):
        t4.mm_fp4(D, WQ.T, S, WS.T, alpha=torch.ones(1, dtype=torch.float64))
    with raises(TypeError, "out_dtype", "float16", "torch.int8"):
        t4.mm_fp4(D, WQ.T, S, WS.T, out_dtype=torch.int8)


def test_mm_mixed_devices():
    with raises(ValueError, "alpha", "cpu", "meta"):
        t4.mm_fp4(D, WQ.T, S, WS.T, alpha=torch.ones(1, device="meta"))


def test_mm_a_scale_layout_mismatch():
    with raises(ValueError, "a_scale", "(8, 4)", "(128, 4)"):
        t4.mm_fp4(D, WQ.T, S, WS.T, sf_layout="8x4")


# --- route --------------------------------------------------------------------------------------
L = torch.randn(5, 8)


def test_route_top_k_too_large():
    with raises(ValueError, "route", "top_k", "<= 8", "9"):
        t4.route(L, 9)


def test_route_unknown_method():
    with raises(ValueError, "method", "'softmax'", "'topk'"):
        t4.route(L, 2, method="topk")


def test_route_method_specific_arguments():
    with raises(ValueError, "top_k", "1 for method 'llama4'", "2"):
        t4.route(L, 2, method="llama4")
    with raises(ValueError, "bias", "deepseek_v3"):
        t4.route(L, 2, method="deepseek_v3")
    with raises(ValueError, "n_group", "divisor", "3"):
        t4.route(L, 2, method="deepseek_v3", bias=torch.zeros(8), n_group=3, topk_group=1)
    with raises(ValueError, "routed_scaling_factor", "only 'deepseek_v3'", "2.5"):
        t4.route(L, 2, routed_scaling_factor=2.5)
    with raises(ValueError, "renormalize", "'softmax' only"):
        t4.route(L, 2, method="deepseek_v3", bias=torch.zeros(8), renormalize=True)


def test_route_logits_rank_and_dtype():
    with raises(ValueError, "logits", "2-D", "(8,)"):
        t4.route(torch.randn(8), 2)
    with raises(TypeError, "logits", "float32", "int64"):
        t4.route(torch.ones(2, 8, dtype=torch.int64), 2)


# --- fused_moe ----------------------------------------------------------------------------------
MOE = T.moe_problem(w4a4=True)


def _moe(**changes):
    kw = dict(MOE)
    kw.update(changes)
    return t4.fused_moe(**kw)


def test_moe_ids_out_of_range_are_nan_rows():
    # Not an error (checking would read the ids back to the host): docs/NUMERICS.md section 6.
    ids = MOE["topk_ids"].clone()
    ids[0, 0] = 4
    out = _moe(topk_ids=ids)
    assert out[0].isnan().all() and not out[1:].isnan().any()


def test_moe_ids_dtype():
    with raises(TypeError, "topk_ids", "int32", "int64"):
        _moe(topk_ids=MOE["topk_ids"].long())


def test_moe_weight_shape_mismatch():
    with raises(ValueError, "w2", "(4, 64, 16)", "(4, 64, 8)"):
        _moe(w2=MOE["w2"][..., :8].contiguous())


def test_moe_scale_shape_mismatch():
    with raises(ValueError, "w1_scale", "(4, 128, 4)"):
        _moe(w1_scale=MOE["w1_scale"][:, :64].contiguous())


def test_moe_a2_required_for_w4a4():
    with raises(ValueError, "a2_global_scale", "W4A4"):
        _moe(a2_global_scale=None)
    with raises(ValueError, "a2_global_scale", "None when a1_global_scale is None"):
        _moe(a1_global_scale=None)


def test_moe_topk_weights_shape_and_local_experts():
    with raises(ValueError, "topk_weights", "(6, 2)", "(6, 1)"):
        _moe(topk_weights=MOE["topk_weights"][:, :1].contiguous())
    with raises(ValueError, "num_local_experts", "w1.shape[0] = 4", "8"):
        _moe(num_local_experts=8)


def test_moe_global_scale_shape():
    with raises(ValueError, "w1_global_scale", "(4,)", "(1,)"):
        _moe(w1_global_scale=torch.ones(1))


def test_swap_gate_up_rejects_odd_rows():
    with raises(ValueError, "w1", "even"):
        t4.swap_gate_up(torch.zeros(2, 3, 8, dtype=torch.uint8))


# --- every parse and scalar error names the op (eager and through torch.ops alike) --------------
@pytest.mark.parametrize("call,fragments", [
    (lambda: t4.nvfp4_quantize(X, GS, sf_layout="64x4"), ("nvfp4_quantize: sf_layout", "'64x4'")),
    (lambda: t4.mxfp4_quantize(X, backend="fast"), ("mxfp4_quantize: backend", "'fast'")),
    (lambda: t4.compute_global_scale(X, backend="fast"), ("compute_global_scale: backend",)),
    (lambda: t4.fp4_dequantize(D, S, sf_layout="x"), ("fp4_dequantize: sf_layout",)),
    (lambda: t4.fp4_dequantize(D, S, block_size=8), ("fp4_dequantize: block_size", "16 (NVFP4) or 32", "8")),
    (lambda: t4.mm_fp4(D, WQ.T, S, WS.T, block_size=64), ("mm_fp4: block_size", "64")),
    (lambda: t4.mm_fp4(D, WQ.T, S, WS.T, backend="fast"), ("mm_fp4: backend", "'fast'")),
    (lambda: t4.route(torch.randn(4, 8), 2, backend="fast"), ("route: backend",)),
])
def test_parse_errors_name_the_op(call, fragments):
    with raises(ValueError, *fragments):
        call()
    with torch.device("cpu"):        # the op path (a torch-function mode: no eager shortcut)
        with raises(ValueError, *fragments):
            call()


@pytest.mark.parametrize("factor", [float("nan"), float("inf"), -1.0, 0.0])
def test_route_scaling_factor_must_be_positive_and_finite(factor):
    logits = torch.randn(4, 8)
    with raises(ValueError, "route: routed_scaling_factor", "a positive finite number"):
        t4.route(logits, 2, "deepseek_v3", bias=torch.zeros(8), routed_scaling_factor=factor)


def test_mxfp4_weights_with_the_default_block_size_name_block_size():
    wq, ws, _ = T.quantized_weight(64, 64, t4.MXFP4)
    with raises(TypeError, "mm_fp4: b_scale", "block_size=32", "float8_e8m0fnu"):
        t4.mm_fp4(torch.randn(2, 64, dtype=torch.bfloat16), wq.T, None, ws.T)
    dm, sm = t4.mxfp4_quantize(X)
    with raises(TypeError, "fp4_dequantize: scale", "block_size=32"):
        t4.fp4_dequantize(dm, sm)


def test_moe_meta_topk_ids_is_a_device_error():
    kw = T.moe_problem(w4a4=False)
    kw["topk_ids"] = kw["topk_ids"].to("meta")
    with raises(ValueError, "fused_moe: topk_ids", "got meta"):
        t4.fused_moe(**kw)
