"""CPU tests of torch_fp4.mm_fp4 against the numerics contract (spec section 5).

Oracles are fp64 products of the dequantized operands computed here (or the spec's bound in
torch_fp4.testing); no expected value is taken from the implementation.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import torch_fp4
from torch_fp4 import formats as F
from torch_fp4 import testing as T

FMTS = {"nvfp4": F.NVFP4, "mxfp4": F.MXFP4}
LAYOUTS = ("128x4", "8x4", "linear")
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------
def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _quantize(x: torch.Tensor, fmt: F.Fp4Format, gs: torch.Tensor | None = None,
              layout: str = "128x4"):
    """(data, scale, hat): hat is dequantized to fp32 *without* the global scale."""
    if fmt is F.NVFP4:
        if gs is None:
            gs = torch.ones(1)
        data, scale = torch_fp4.nvfp4_quantize(x, gs, sf_layout=layout)
    else:
        data, scale = torch_fp4.mxfp4_quantize(x, sf_layout=layout)
    hat = torch_fp4.fp4_dequantize(data, scale, None, block_size=fmt.block_size, sf_layout=layout,
                                   out_dtype=torch.float32)
    return data, scale, hat


def _randn(rows: int, k: int, seed: int, dtype=torch.bfloat16) -> torch.Tensor:
    return torch.randn(rows, k, generator=_gen(seed)).to(dtype)


def _mm(a, w, a_scale, w_scale, fmt, alpha=None, out_dtype=torch.float32, layout="128x4"):
    """The documented calling convention: the weight and its 128x4 scales passed transposed."""
    return torch_fp4.mm_fp4(a, w.T, a_scale, w_scale.T, alpha=alpha, out_dtype=out_dtype,
                            block_size=fmt.block_size, sf_layout=layout)


def _ref64(a_hat: torch.Tensor, b_hat: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    """alpha * A @ B^T with every product and sum in fp64 (explicit loop over k)."""
    a64, b64 = a_hat.double(), b_hat.double()
    acc = torch.zeros(a64.shape[0], b64.shape[0], dtype=torch.float64)
    for k in range(a64.shape[1]):
        acc += a64[:, k:k + 1] * b64[:, k].unsqueeze(0)
    return acc * alpha


def _assert_fp32_exact(ref: torch.Tensor) -> None:
    """Precondition of the exactness tests: the fp64 product is representable in fp32."""
    assert torch.equal(ref.float().double(), ref), "test data is not grid-exact"


def _assert_exact(out: torch.Tensor, ref: torch.Tensor) -> None:
    """out must equal RN_out(ref) bit for bit (ref exact in fp32, so .float() does not round)."""
    _assert_fp32_exact(ref)
    expected = ref.float().to(out.dtype)
    assert out.dtype == expected.dtype and out.shape == expected.shape
    bad = out.view(torch.int16 if out.element_size() == 2 else torch.int32) != \
        expected.view(torch.int16 if out.element_size() == 2 else torch.int32)
    assert not bad.any(), (f"{int(bad.sum())} of {out.numel()} elements differ; first at "
                           f"{bad.nonzero()[0].tolist()}")


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


# ---------------------------------------------------------------------------------------------
# W4A4 on random data: within the spec's bound
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
@pytest.mark.parametrize("with_alpha", [True, False], ids=["alpha", "no_alpha"])
@pytest.mark.parametrize("fmt_name", FMTS)
def test_w4a4_random_within_bound(fmt_name, with_alpha, out_dtype):
    fmt = FMTS[fmt_name]
    m, n, k = 37, 80, 128
    a = _randn(m, k, 1)
    w = _randn(n, k, 2)
    if fmt is F.NVFP4 and with_alpha:
        gs_a, gs_w = torch_fp4.compute_global_scale(a), torch_fp4.compute_global_scale(w)
        alpha = torch_fp4.nvfp4_alpha(gs_a, gs_w)
        assert alpha.dtype == torch.float32 and alpha.numel() == 1
    else:
        # NVFP4 without alpha: global scale 1 keeps the unscaled product in fp16 range.
        gs_a = gs_w = None
        alpha = torch.tensor([0.37]) if with_alpha else None
    aq, as_, a_hat = _quantize(a, fmt, gs_a)
    wq, ws, w_hat = _quantize(w, fmt, gs_w)
    out = _mm(aq, wq, as_, ws, fmt, alpha, out_dtype)
    assert out.shape == (m, n) and out.dtype == out_dtype
    T.assert_mm_within_bound(out, a_hat, w_hat, 1.0 if alpha is None else alpha)
    # The bound is tight enough to catch a wrong alpha or a transposed operand.
    ref, _ = T.mm_reference(a_hat, w_hat, 1.0 if alpha is None else alpha)
    assert (out.double() - ref).abs().max() <= 0.02 * ref.abs().max()


# ---------------------------------------------------------------------------------------------
# W4A4 exactness on grid-exact operands, every A scale layout
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("alpha", [None, 0.25])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("fmt_name", FMTS)
def test_w4a4_grid_exact(fmt_name, layout, alpha):
    fmt = FMTS[fmt_name]
    m, n, k = 19, 136, 8 * fmt.block_size
    g = _gen(7)
    aq, as_, a_hat = T.grid_exact_operand(m, k, fmt, layout, generator=g)
    wq, ws, w_hat = T.grid_exact_operand(n, k, fmt, "128x4", generator=g)
    ref = _ref64(a_hat, w_hat, 1.0 if alpha is None else alpha)
    assert ref.abs().max() > 64  # not a degenerate (all-small) product
    alpha_t = None if alpha is None else torch.tensor([alpha], dtype=torch.float32)
    for out_dtype in (torch.float32, torch.bfloat16):
        out = _mm(aq, wq, as_, ws, fmt, alpha_t, out_dtype, layout)
        _assert_exact(out, ref)


@pytest.mark.parametrize("fmt_name", FMTS)
def test_grid_exact_operand_matches_fp4_dequantize(fmt_name):
    """The dequantized values the exactness tests use are the library's dequantization too."""
    fmt = FMTS[fmt_name]
    for layout in LAYOUTS:
        data, scale, hat = T.grid_exact_operand(13, 4 * fmt.block_size, fmt, layout, generator=_gen(3))
        deq = torch_fp4.fp4_dequantize(data, scale, None, block_size=fmt.block_size,
                                       sf_layout=layout, out_dtype=torch.float32)
        assert torch.equal(deq, hat)


# ---------------------------------------------------------------------------------------------
# W4A16
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
@pytest.mark.parametrize("a_dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("fmt_name", FMTS)
def test_w4a16_random_within_bound(fmt_name, a_dtype, out_dtype):
    fmt = FMTS[fmt_name]
    m, n, k = 21, 72, 96
    a = _randn(m, k, 11, a_dtype)
    w = _randn(n, k, 12)
    if fmt is F.NVFP4:
        gs_w = torch_fp4.compute_global_scale(w)
        alpha = torch_fp4.nvfp4_alpha(None, gs_w)
        torch.testing.assert_close(alpha, 1.0 / gs_w, rtol=0, atol=0)
    else:
        gs_w, alpha = None, None
    wq, ws, w_hat = _quantize(w, fmt, gs_w)
    out = _mm(a, wq, None, ws, fmt, alpha, out_dtype)
    assert out.shape == (m, n) and out.dtype == out_dtype
    T.assert_mm_within_bound(out, a.float(), w_hat, 1.0 if alpha is None else alpha)
    # Sanity: with the global scale folded back in, W4A16 approximates the bf16 product.
    exact = a.double() @ w.double().T
    err = torch.linalg.norm(out.double() - exact) / torch.linalg.norm(exact)
    assert err < 0.2


@pytest.mark.parametrize("a_dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("fmt_name", FMTS)
def test_w4a16_grid_exact(fmt_name, a_dtype):
    fmt = FMTS[fmt_name]
    m, n, k = 9, 130, 6 * fmt.block_size
    g = _gen(21)
    a = torch.randint(-8, 9, (m, k), generator=g).to(a_dtype)  # small integers: exact
    wq, ws, w_hat = T.grid_exact_operand(n, k, fmt, "128x4", generator=g)
    ref = _ref64(a.float(), w_hat)
    for out_dtype in (torch.float32, torch.bfloat16):
        _assert_exact(_mm(a, wq, None, ws, fmt, None, out_dtype), ref)


# ---------------------------------------------------------------------------------------------
# Odd shapes
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("m,n,kblocks", [(1, 72, 1), (129, 72, 1), (1, 1, 3), (129, 200, 5),
                                         (8, 128, 4), (130, 129, 2)])
@pytest.mark.parametrize("fmt_name", FMTS)
def test_odd_shapes_exact_all_layouts(fmt_name, m, n, kblocks):
    fmt = FMTS[fmt_name]
    k = kblocks * fmt.block_size  # K = block size is the minimum
    g = _gen(m * 1000 + n * 10 + kblocks)
    wq, ws, w_hat = T.grid_exact_operand(n, k, fmt, "128x4", generator=g)
    for layout in LAYOUTS:
        aq, as_, a_hat = T.grid_exact_operand(m, k, fmt, layout, generator=g)
        out = _mm(aq, wq, as_, ws, fmt, None, torch.float32, layout)
        assert out.shape == (m, n)
        _assert_exact(out, _ref64(a_hat, w_hat))


@pytest.mark.parametrize("m,n", [(1, 72), (129, 72), (3, 257)])
@pytest.mark.parametrize("fmt_name", FMTS)
def test_odd_shapes_random_within_bound(fmt_name, m, n):
    fmt = FMTS[fmt_name]
    k = fmt.block_size
    aq, as_, a_hat = _quantize(_randn(m, k, 31), fmt)
    wq, ws, w_hat = _quantize(_randn(n, k, 32), fmt)
    for out_dtype in OUT_DTYPES:
        T.assert_mm_within_bound(_mm(aq, wq, as_, ws, fmt, None, out_dtype), a_hat, w_hat)
    a16 = _randn(m, k, 33)
    T.assert_mm_within_bound(_mm(a16, wq, None, ws, fmt), a16.float(), w_hat)


@settings(max_examples=25, deadline=None)
@given(m=st.integers(1, 150), n=st.integers(1, 150), kblocks=st.integers(1, 6),
       fmt_name=st.sampled_from(sorted(FMTS)), layout=st.sampled_from(LAYOUTS),
       seed=st.integers(0, 2**31 - 1))
def test_hypothesis_shapes_exact(m, n, kblocks, fmt_name, layout, seed):
    fmt = FMTS[fmt_name]
    k = kblocks * fmt.block_size
    g = _gen(seed)
    aq, as_, a_hat = T.grid_exact_operand(m, k, fmt, layout, generator=g)
    wq, ws, w_hat = T.grid_exact_operand(n, k, fmt, "128x4", generator=g)
    _assert_exact(_mm(aq, wq, as_, ws, fmt, None, torch.float32, layout), _ref64(a_hat, w_hat))


@settings(max_examples=25, deadline=None)
@given(m=st.integers(1, 150), n=st.integers(1, 150), kblocks=st.integers(1, 6),
       fmt_name=st.sampled_from(sorted(FMTS)), layout=st.sampled_from(LAYOUTS),
       out_dtype=st.sampled_from(OUT_DTYPES), w4a16=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_hypothesis_shapes_random_within_bound(m, n, kblocks, fmt_name, layout, out_dtype, w4a16, seed):
    fmt = FMTS[fmt_name]
    k = kblocks * fmt.block_size
    wq, ws, w_hat = _quantize(_randn(n, k, seed), fmt)
    a = _randn(m, k, seed + 1)
    if w4a16:
        out = _mm(a, wq, None, ws, fmt, None, out_dtype)
        a_hat = a.float()
    else:
        aq, as_, a_hat = _quantize(a, fmt, layout=layout)
        out = _mm(aq, wq, as_, ws, fmt, None, out_dtype, layout)
    assert out.shape == (m, n) and out.dtype == out_dtype
    T.assert_mm_within_bound(out, a_hat, w_hat)


# ---------------------------------------------------------------------------------------------
# uint8 views, determinism, end-to-end sanity
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("fmt_name", FMTS)
def test_uint8_views_equal_typed_call(fmt_name, layout):
    fmt = FMTS[fmt_name]
    m, n, k = 17, 40, 4 * fmt.block_size
    aq, as_, _ = _quantize(_randn(m, k, 41), fmt, layout=layout)
    wq, ws, _ = _quantize(_randn(n, k, 42), fmt)
    assert aq.dtype == torch.float4_e2m1fn_x2 and as_.dtype == fmt.scale_dtype
    typed = _mm(aq, wq, as_, ws, fmt, None, torch.bfloat16, layout)
    u8 = lambda t: t.view(torch.uint8)  # noqa: E731
    viewed = _mm(u8(aq), u8(wq), u8(as_), u8(ws), fmt, None, torch.bfloat16, layout)
    assert torch.equal(_bits(typed), _bits(viewed))
    mixed = _mm(aq, u8(wq), u8(as_), ws, fmt, None, torch.bfloat16, layout)
    assert torch.equal(_bits(typed), _bits(mixed))
    # W4A16 with uint8 weight views
    a16 = _randn(m, k, 43)
    assert torch.equal(_bits(_mm(a16, wq, None, ws, fmt)), _bits(_mm(a16, u8(wq), None, u8(ws), fmt)))


@pytest.mark.parametrize("fmt_name", FMTS)
def test_deterministic(fmt_name):
    fmt = FMTS[fmt_name]
    m, n, k = 33, 96, 8 * fmt.block_size
    a, w = _randn(m, k, 51), _randn(n, k, 52)
    gs_a = torch_fp4.compute_global_scale(a) if fmt is F.NVFP4 else None
    gs_w = torch_fp4.compute_global_scale(w) if fmt is F.NVFP4 else None
    alpha = torch_fp4.nvfp4_alpha(gs_a, gs_w) if fmt is F.NVFP4 else None
    aq, as_, _ = _quantize(a, fmt, gs_a)
    wq, ws, _ = _quantize(w, fmt, gs_w)
    for out_dtype in OUT_DTYPES:
        first = _mm(aq, wq, as_, ws, fmt, alpha, out_dtype)
        second = _mm(aq, wq, as_, ws, fmt, alpha, out_dtype)
        assert torch.equal(_bits(first), _bits(second))
        assert torch.isfinite(first).all()
    first = _mm(a, wq, None, ws, fmt)
    assert torch.equal(_bits(first), _bits(_mm(a, wq, None, ws, fmt)))


@pytest.mark.parametrize("fmt_name", FMTS)
def test_end_to_end_approximates_bf16_matmul(fmt_name):
    fmt = FMTS[fmt_name]
    m, n, k = 64, 96, 256
    a, w = _randn(m, k, 61) * 3, _randn(n, k, 62) * 0.02
    if fmt is F.NVFP4:
        gs_a, gs_w = torch_fp4.compute_global_scale(a), torch_fp4.compute_global_scale(w)
        alpha = torch_fp4.nvfp4_alpha(gs_a, gs_w)
    else:
        gs_a = gs_w = alpha = None
    aq, as_, _ = _quantize(a, fmt, gs_a)
    wq, ws, _ = _quantize(w, fmt, gs_w)
    out = _mm(aq, wq, as_, ws, fmt, alpha, torch.bfloat16)
    exact = a.double() @ w.double().T
    err = float(torch.linalg.norm(out.double() - exact) / torch.linalg.norm(exact))
    assert err < 0.2
    # and the FP4 error is real (quantization happened): not bit-equal to the bf16 product
    assert err > 1e-3


# ---------------------------------------------------------------------------------------------
# W4A4 from 16-bit activations: quantize_a
# ---------------------------------------------------------------------------------------------
@settings(max_examples=25, deadline=None)
@given(m=st.integers(1, 70), n=st.integers(1, 90), kblocks=st.integers(1, 4), fmt_name=st.sampled_from(list(FMTS)),
       a_dtype=st.sampled_from([torch.bfloat16, torch.float16]),
       out_dtype=st.sampled_from(OUT_DTYPES), seed=st.integers(0, 2**16), special=st.booleans())
def test_quantize_a_is_mm_of_quantized_values_and_of_codes(m, n, kblocks, fmt_name, a_dtype, out_dtype, seed,
                                                          special):
    """mm_fp4(a, quantize_a=True) is mm_fp4 on fp4_quantized_values(a) and W4A4 on a's codes, bit for
    bit (reference), with Inf/NaN/huge activations among them when `special`."""
    fmt = FMTS[fmt_name]
    k = 32 * kblocks
    a = _randn(m, k, seed, torch.float32) * 3
    if special:
        a[0, 0], a[-1, -1] = float("inf"), float("nan")
        a[m // 2, k // 2] = 60000.0 if a_dtype == torch.float16 else 1e30
    a = a.to(a_dtype)
    wq, ws, wgs = T.quantized_weight(n, k, fmt)
    gs = torch_fp4.compute_global_scale(a[a.isfinite()].reshape(1, -1) if special else a) if fmt is F.NVFP4 else None
    alpha = F.nvfp4_alpha(gs, wgs) if fmt is F.NVFP4 else None
    fused = torch_fp4.mm_fp4(a, wq.T, None, ws.T, alpha, out_dtype, fmt.block_size, quantize_a=True,
                             a_global_scale=gs)
    values = torch_fp4.fp4_quantized_values(a, gs, fmt.block_size)
    via_values = torch_fp4.mm_fp4(values, wq.T, None, ws.T, alpha, out_dtype, fmt.block_size)
    assert torch.equal(_bits(fused), _bits(via_values))
    codes = (torch_fp4.nvfp4_quantize(a, gs) if fmt is F.NVFP4 else torch_fp4.mxfp4_quantize(a))
    via_codes = torch_fp4.mm_fp4(codes[0], wq.T, codes[1], ws.T, alpha, out_dtype, fmt.block_size)
    assert T.same_bits_up_to_nan_payload(fused, via_codes)   # a NaN block's NaNs form differently


def _error_operands():
    """bf16 a [4, 64], NVFP4 and MXFP4 weights [32, 64], a global scale and a's NVFP4 codes."""
    a = torch.randn(4, 64, dtype=torch.bfloat16)
    wq, ws, wgs = T.quantized_weight(32, 64)
    mq, ms, _ = T.quantized_weight(32, 64, F.MXFP4)
    gs = torch.ones(1)
    d, s = torch_fp4.nvfp4_quantize(a, gs)
    return a, wq, ws, wgs, mq, ms, gs, d, s


def test_quantize_a_errors_name_the_argument():
    a, wq, ws, wgs, mq, ms, gs, d, s = _error_operands()
    with pytest.raises(ValueError, match=r"mm_fp4: a_global_scale: expected None unless quantize_a=True"):
        torch_fp4.mm_fp4(a, wq.T, None, ws.T, a_global_scale=gs)
    with pytest.raises(TypeError, match=r"mm_fp4: a_global_scale: expected an fp32 tensor \[1\] with quantize_a"):
        torch_fp4.mm_fp4(a, wq.T, None, ws.T, quantize_a=True)
    with pytest.raises(ValueError, match=r"mm_fp4: a_global_scale: expected shape \[1\]"):
        torch_fp4.mm_fp4(a, wq.T, None, ws.T, quantize_a=True, a_global_scale=torch.ones(2))
    with pytest.raises(ValueError, match=r"mm_fp4: a_global_scale: expected None for MXFP4"):
        torch_fp4.mm_fp4(a, mq.T, None, ms.T, block_size=32, quantize_a=True, a_global_scale=gs)
    with pytest.raises(ValueError, match=r"mm_fp4: a_scale: expected None with quantize_a=True"):
        torch_fp4.mm_fp4(d, wq.T, s, ws.T, quantize_a=True, a_global_scale=gs)
    with pytest.raises(TypeError, match=r"mm_fp4: quantize_a: expected a bool, got 1"):
        torch_fp4.mm_fp4(a, wq.T, None, ws.T, quantize_a=1, a_global_scale=gs)
    with pytest.raises(TypeError, match=r"mm_fp4: a: expected dtype"):
        torch_fp4.mm_fp4(a.float(), wq.T, None, ws.T, quantize_a=True, a_global_scale=gs)


# ---------------------------------------------------------------------------------------------
# alpha formed from the global scales: b_global_scale
# ---------------------------------------------------------------------------------------------
@settings(max_examples=25, deadline=None)
@given(m=st.integers(1, 40), n=st.integers(1, 70), kblocks=st.integers(1, 4),
       mode=st.sampled_from(["w4a16", "quantize_a", "codes"]), out_dtype=st.sampled_from(OUT_DTYPES),
       seed=st.integers(0, 2**16), gs_exp=st.integers(-30, 30))
def test_b_global_scale_is_alpha_from_the_global_scales(m, n, kblocks, mode, out_dtype, seed, gs_exp):
    """mm_fp4(..., b_global_scale=gs_w) equals mm_fp4 with alpha = nvfp4_alpha(gs_a, gs_w) bit for
    bit: 16-bit a (RN(1 / gs_w)), quantize_a and FP4 a (RN(1 / RN(gs_a * gs_w))); global scales
    over a wide exponent range, so that the product gs_a * gs_w rounds."""
    k = 32 * kblocks
    a = (_randn(m, k, seed, torch.float32) * 3).to(torch.bfloat16)
    wq, ws, _ = T.quantized_weight(n, k, F.NVFP4)
    g = torch.Generator().manual_seed(seed)
    gs_w = (torch.rand(1, generator=g) + 0.5) * 2.0 ** gs_exp
    gs_a = (torch.rand(1, generator=g) + 0.5) * 2.0 ** -gs_exp * 3
    args, kw = (a, wq.T, None, ws.T), {}
    if mode == "quantize_a":
        kw = dict(quantize_a=True, a_global_scale=gs_a)
    elif mode == "codes":
        d, s = torch_fp4.nvfp4_quantize(a, gs_a)
        args, kw = (d, wq.T, s, ws.T), dict(a_global_scale=gs_a)
    formed = torch_fp4.mm_fp4(*args, None, out_dtype, b_global_scale=gs_w, **kw)
    alpha = F.nvfp4_alpha(None if mode == "w4a16" else gs_a, gs_w)
    kw.pop("a_global_scale") if mode == "codes" else None
    given = torch_fp4.mm_fp4(*args, alpha, out_dtype, **kw)
    assert torch.equal(_bits(formed), _bits(given))


def test_b_global_scale_errors_name_the_argument():
    a, wq, ws, wgs, mq, ms, gs, d, s = _error_operands()
    with pytest.raises(ValueError, match=r"mm_fp4: b_global_scale: expected None for MXFP4"):
        torch_fp4.mm_fp4(a, mq.T, None, ms.T, block_size=32, b_global_scale=gs)
    with pytest.raises(ValueError, match=r"mm_fp4: alpha: expected None when b_global_scale is given"):
        torch_fp4.mm_fp4(a, wq.T, None, ws.T, gs, b_global_scale=wgs)
    with pytest.raises(ValueError, match=r"mm_fp4: b_global_scale: expected shape \[1\]"):
        torch_fp4.mm_fp4(a, wq.T, None, ws.T, b_global_scale=torch.ones(2))
    with pytest.raises(TypeError, match=r"mm_fp4: b_global_scale: expected dtype"):
        torch_fp4.mm_fp4(a, wq.T, None, ws.T, b_global_scale=torch.ones(1, dtype=torch.float16))
    with pytest.raises(TypeError, match=r"mm_fp4: a_global_scale: expected the global scale a's FP4 codes"):
        torch_fp4.mm_fp4(d, wq.T, s, ws.T, b_global_scale=wgs)
    with pytest.raises(ValueError, match=r"mm_fp4: a_global_scale: expected None unless quantize_a=True, or a is FP4"):
        torch_fp4.mm_fp4(a, wq.T, None, ws.T, a_global_scale=gs, b_global_scale=wgs)
    with pytest.raises(ValueError, match=r"mm_fp4: a_global_scale: expected None unless"):
        torch_fp4.mm_fp4(d, wq.T, s, ws.T, a_global_scale=gs)
    with pytest.raises(ValueError, match=r"mm_fp4: a_global_scale: expected shape \[1\]"):
        torch_fp4.mm_fp4(d, wq.T, s, ws.T, a_global_scale=torch.ones(3), b_global_scale=wgs)


# ---------------------------------------------------------------------------------------------
# bias: added in fp32 before the one rounding
# ---------------------------------------------------------------------------------------------
@settings(max_examples=30, deadline=None)
@given(m=st.integers(1, 40), n=st.integers(1, 70), kblocks=st.integers(1, 4),
       mode=st.sampled_from(["w4a16", "quantize_a", "codes", "mxfp4"]), out_dtype=st.sampled_from(OUT_DTYPES),
       bias_dtype=st.sampled_from(OUT_DTYPES), alpha=st.booleans(), seed=st.integers(0, 2**16))
def test_bias_is_added_in_fp32_before_the_rounding(m, n, kblocks, mode, out_dtype, bias_dtype, alpha, seed):
    """mm_fp4(..., bias=b) is RN_out(RN_fp32(v + b)) with v = RN_fp32(alpha * acc), mm_fp4's fp32
    output without the bias (spec section 5): one rounding to out_dtype, not a separate add after
    it; every bias dtype, with alpha, b_global_scale or neither."""
    k = 32 * kblocks
    fmt = F.MXFP4 if mode == "mxfp4" else F.NVFP4
    a = (_randn(m, k, seed, torch.float32) * 3).to(torch.bfloat16)
    wq, ws, wgs = T.quantized_weight(n, k, fmt)
    bias = (_randn(1, n, seed + 1, torch.float32).reshape(n) * 4).to(bias_dtype)
    args, kw = (a, wq.T, None, ws.T), dict(block_size=fmt.block_size)
    if mode == "quantize_a":
        kw.update(quantize_a=True, a_global_scale=torch_fp4.compute_global_scale(a))
    elif mode == "codes":
        gs = torch_fp4.compute_global_scale(a)
        d, s = torch_fp4.nvfp4_quantize(a, gs)
        args = (d, wq.T, s, ws.T)
        if alpha:   # codes' alpha from the global scales; without: alpha None
            kw.update(a_global_scale=gs)
    if fmt is F.NVFP4 and alpha:
        kw.update(b_global_scale=wgs)
    elif alpha:
        args = args + (torch.tensor([0.37]),)
    v = torch_fp4.mm_fp4(*args, out_dtype=torch.float32, **kw)
    got = torch_fp4.mm_fp4(*args, out_dtype=out_dtype, bias=bias, **kw)
    want = (v + bias.float()).to(out_dtype)
    assert torch.equal(_bits(got), _bits(want))


def test_bias_rounds_once():
    """Where a separate add (round, add, round again) and mm_fp4's bias differ: v = 6 + 6 * 2^-9
    (exact in fp32) rounds to 6 in bf16, and 6 + 2^-6 (the bias, half an ulp) then ties to even at
    6; RN(v + 2^-6) = 6 + 2^-5."""
    a = torch.zeros(1, 32, dtype=torch.bfloat16)
    a[0, 0], a[0, 1] = 1.0, 2.0 ** -9
    w = torch.zeros(1, 32)
    w[0, :2] = 6.0            # block scale 1, codes 6: the weights are exact
    wq, ws = torch_fp4.nvfp4_quantize(w, torch.ones(1))
    bias = torch.tensor([2.0 ** -6])
    assert torch_fp4.mm_fp4(a, wq.T, None, ws.T, out_dtype=torch.float32).item() == 6.0 + 6 * 2.0 ** -9
    assert torch_fp4.mm_fp4(a, wq.T, None, ws.T, bias=bias).item() == 6.0 + 2.0 ** -5
    assert (torch_fp4.mm_fp4(a, wq.T, None, ws.T) + bias.to(torch.bfloat16)).item() == 6.0


def test_bias_errors_name_the_argument():
    a, wq, ws, wgs, mq, ms, gs, d, s = _error_operands()
    n = wq.shape[0]
    with pytest.raises(ValueError, match=rf"mm_fp4: bias: expected shape \({n},\)"):
        torch_fp4.mm_fp4(a, wq.T, None, ws.T, bias=torch.zeros(n + 1))
    with pytest.raises(ValueError, match=rf"mm_fp4: bias: expected shape \({n},\)"):
        torch_fp4.mm_fp4(a, wq.T, None, ws.T, bias=torch.zeros(1, n))
    with pytest.raises(TypeError, match=r"mm_fp4: bias: expected dtype"):
        torch_fp4.mm_fp4(a, wq.T, None, ws.T, bias=torch.zeros(n, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"mm_fp4: bias: expected a contiguous"):
        torch_fp4.mm_fp4(a, wq.T, None, ws.T, bias=torch.zeros(2 * n)[::2])
    with pytest.raises(TypeError, match=r"mm_fp4: bias"):
        torch_fp4.mm_fp4(a, wq.T, None, ws.T, bias=[0.0] * n)
    with pytest.raises(ValueError, match=r"mm_fp4: .*bias.*meta|mm_fp4: expected .*same device"):
        torch_fp4.mm_fp4(a, wq.T, None, ws.T, bias=torch.zeros(n, device="meta"))
