"""CPU checks of the cuda backend's fused_moe (torch_fp4/kernels/cuda/moe.py): its tactic space and
requirements, and the grouped-GEMM MoE launches it runs in (kernels/triton/moe_grouped.py) with its
GEMM contract emulated in PyTorch.

The emulated GEMM is the contract of `moe._grouped_gemm` (the Hopper wgmma GEMM run grouped, which
tests/test_gpu_moe_cuda.py checks on an H100): per block b of block_m rows with e = block_expert[b]
>= 0, h = RN_bf16(RN_fp32(alpha[e] * exact sum)) over A (bf16, or NVFP4 with linear scales
dequantized without their global scale) and w[e]; then `moe_grouped.silu_mul`, the real Triton
SwiGLU kernel, under Triton's interpreter. Everything else runs for real too (grouping, gather,
quantizations by the reference in the linear layout, alphas, inverse permutation, finalize), and the
whole launcher must equal torch_fp4.reference.fused_moe bit for bit for every block_m.
"""
import os
import subprocess
import sys

import pytest
import torch

from torch_fp4.problems import MoeProblem

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BF16 = torch.bfloat16


def _problem(tokens, experts, top_k, hidden=4096, inter=14336, **kw) -> MoeProblem:
    fields = dict(tokens=tokens, hidden=hidden, inter=inter, experts=experts, top_k=top_k, w4a4=False,
                  a2_per_expert=False, x_dtype=BF16, out_dtype=BF16, local_expert_offset=0, strict_ids=True,
                  device=torch.device("cpu"), capability=(0, 0))
    fields.update(kw)
    return MoeProblem(**fields)


def test_default_tactic_follows_rows_per_expert():
    from torch_fp4.kernels.cuda import moe_tactics as MT
    # (tokens, experts, top_k) -> block_m of the heuristic (BLOCK_M_FROM)
    for (t, e, k), bm in (((64, 8, 2), 64), ((256, 8, 2), 128), ((1024, 8, 2), 256), ((1024, 256, 8), 64),
                          ((4096, 256, 8), 128), ((4096, 128, 8), 256)):
        p = _problem(t, e, k)
        d = MT.default(p)
        assert d.block_m == bm, (t, e, k, d)
        assert MT.why_not(d, p) is None
        cands = MT.candidates(p)
        assert cands[0] == d and len(set(cands)) == len(cands)
        assert all(MT.why_not(c, p) is None for c in cands)


def test_problem_limits_named():
    from torch_fp4.kernels.cuda import moe_tactics as MT
    assert "K % 32" in MT.problem_reason(_problem(8, 4, 2, hidden=4096, inter=48))
    assert "16-byte aligned" in MT.problem_reason(_problem(8, 4, 2, weight_align=8))
    assert "32-bit TMA" in MT.problem_reason(_problem(8, 2**16, 2, inter=2**15))
    p = _problem(8, 4, 2)
    assert "block_m=32" in MT.why_not(MT.WgmmaMoeTactic(32, 4, 1), p)
    assert "ctas_per_sm=2" in MT.why_not(MT.WgmmaMoeTactic(128, 4, 2), p)
    assert "stages=2" in MT.why_not(MT.WgmmaMoeTactic(128, 2, 1), p)


def test_auto_order_takes_cuda_on_sm90_at_every_size():
    from torch_fp4.backends import Backend
    from torch_fp4.tuning import auto_order
    hopper = dict(device=torch.device("cuda", 0), capability=(9, 0))
    for tokens in (1, 16, 64, 4096):
        assert auto_order("fused_moe", _problem(tokens, 8, 2, **hopper))[0] is Backend.CUDA
    assert auto_order("fused_moe", _problem(4096, 8, 2, device=torch.device("cuda", 0),
                                            capability=(10, 0)))[0] is Backend.TRITON


def test_small_m_family_below_16_rows_per_expert():
    from torch_fp4.kernels.cuda import moe_tactics as MT
    from torch_fp4.kernels.cuda.moe_small_m_tactics import SmallMMoeTactic
    hopper = dict(capability=(9, 0))
    # (tokens, experts, top_k) -> block_m of the decode heuristic (rows_per_block), or the wgmma family
    for (t, e, k), bm in (((1, 8, 2), 8), ((16, 8, 2), 8), ((63, 8, 2), 32), ((64, 8, 2), None),
                          ((64, 128, 8), 8), ((256, 256, 8), 16), ((255, 128, 8), 32), ((1024, 256, 8), None)):
        p = _problem(t, e, k, **hopper)
        d = MT.default(p)
        assert isinstance(d, SmallMMoeTactic) == (bm is not None), (t, e, k, d)
        if bm is not None:
            assert d.block_m == bm, (t, e, k, d)
            assert any(isinstance(c, MT.WgmmaMoeTactic) for c in MT.candidates(p))
        assert MT.why_not(d, p) is None
        cands = MT.candidates(p)
        assert cands[0] == d and len(set(cands)) == len(cands)
        assert all(MT.why_not(c, p) is None for c in cands)


def test_small_m_tile_of_sm90_experts():
    """"sm90" experts take their own decode tile (4 warps of two tiles, 4 stages of K = 128) at
    block_m <= 16, except where few weight tiles take the few-tiles one, as row-major experts do."""
    from torch_fp4 import formats as F
    from torch_fp4.kernels.cuda import moe_tactics as MT
    for (t, e, k), tile in (((16, 128, 8), (4, 2, 128, 4)), ((4, 8, 2), (4, 2, 128, 4)), ((64, 256, 8), (4, 2, 128, 4)),
                            ((1, 8, 2), (8, 1, 256, 4)), ((256, 256, 8), (4, 2, 128, 4))):
        p = _problem(t, e, k, capability=(9, 0), weight_layout=F.WeightLayout.SM90)
        row = MT.default(_problem(t, e, k, capability=(9, 0)))
        d = MT.default(p)
        assert (d.warps, d.tiles_per_warp, d.block_k, d.stages) == tile, (t, e, k, d)
        assert d.block_m == min(row.block_m, 16) and MT.why_not(d, p) is None, (t, e, k, d, row)
        assert all(MT.why_not(c, p) is None for c in MT.candidates(p))


def test_gpt_oss_limits_named():
    """gpt-oss's features run W4A16 on both cuda families (MXFP4 experts on bf16 activations), and
    W4A4 (NVFP4 or MXFP4 activations) on the grouped Hopper GEMMs only."""
    from torch_fp4 import formats as F
    from torch_fp4.kernels.cuda import moe_tactics as MT
    from torch_fp4.kernels.cuda.moe_small_m_tactics import SmallMMoeTactic as S
    for t, tokens in ((S(8), 4), (MT.WgmmaMoeTactic(128, 4, 1), 256)):
        ok = _problem(tokens, 8, 2, hidden=2880, inter=2880, fmt=F.MXFP4, bias_dtypes=(BF16, torch.float32),
                      activation="clamped_swiglu", capability=(9, 0))
        assert MT.why_not(t, ok) is None, (t, MT.why_not(t, ok))
        plain = _problem(tokens, 8, 2, hidden=2880, inter=2880, capability=(9, 0))
        assert MT.key(ok) != MT.key(plain)   # tuned tactics are cached per format and features
        assert "bf16 activations only" in MT.why_not(t, _problem(tokens, 8, 2, hidden=2880, inter=2880, fmt=F.MXFP4,
                                                                   x_dtype=torch.float16, capability=(9, 0)))
        for w4a4 in (_problem(tokens, 8, 2, w4a4=True, bias_dtypes=(BF16, None), capability=(9, 0)),
                     _problem(tokens, 8, 2, hidden=2880, inter=2880, fmt=F.MXFP4, w4a4=True,
                              x_dtype=torch.float16, capability=(9, 0))):
            if isinstance(t, S):
                assert "W4A16 only (W4A4: the grouped Hopper GEMMs)" in MT.why_not(t, w4a4)
            else:
                assert MT.why_not(t, w4a4) is None, (t, MT.why_not(t, w4a4))


def test_small_m_limits_named():
    from torch_fp4.kernels.cuda import moe_tactics as MT
    from torch_fp4.kernels.cuda.moe_small_m_tactics import SmallMMoeTactic as S
    p = _problem(4, 8, 2, capability=(9, 0))
    assert "block_m=24" in MT.why_not(S(24), p)
    assert "not compiled for block_m=64" in MT.why_not(S(64, 4, 2, 256), p)
    assert "stages=7" in MT.why_not(S(8, 8, 1, 256, 7), p)
    assert "FC2: split 9" in MT.why_not(S(8, fc2_split=9), p)
    assert "empty K slice" in MT.why_not(S(8, fc1_split=8), _problem(4, 8, 2, hidden=512, capability=(9, 0)))
    assert "capability 9.0" in MT.why_not(S(8), _problem(4, 8, 2, device=torch.device("cuda", 0), capability=(8, 9)))
    assert "at most 2048 local experts, got 2049" in MT.why_not(S(8), _problem(4, 2049, 2, capability=(9, 0)))
    # the decode family runs where the Hopper GEMM cannot (K % 32 == 16): the cuda backend takes it
    small_k = _problem(4, 8, 2, hidden=4096, inter=48, capability=(9, 0))
    assert MT.problem_reason(small_k) is not None
    assert MT.why_not(MT.default(small_k), small_k) is None


# ---------------------------------------------------------------------------------------------
# The launches around the GEMM, under Triton's interpreter (a subprocess)
# ---------------------------------------------------------------------------------------------
def emulated_gemm(a, a_scale, w, w_scale, alpha, block_expert, swiglu, block_m, out_dtype=BF16, mx=False):
    """out_dtype fp32: RN_fp32(alpha[e] * sum), unrounded to bf16 (the biases follow); mx: MXFP4
    experts."""
    from torch_fp4 import formats as F
    from torch_fp4.kernels.triton import moe_grouped
    from torch_fp4.reference.quantize import dequantize_fp32
    rows = a.shape[0]
    assert rows == block_expert.numel() * block_m and alpha.dtype == torch.float32
    if a_scale is None:
        a_hat = a.float()
    else:
        a_hat = dequantize_fp32(a, a_scale, None, F.NVFP4, F.SfLayout.LINEAR)
    out = torch.full((rows, w.shape[1]), float("nan"), dtype=out_dtype)   # unused blocks: not written
    for b, e in enumerate(block_expert.tolist()):
        if e < 0:
            continue
        r = slice(b * block_m, (b + 1) * block_m)
        w_hat = dequantize_fp32(w[e], w_scale[e], None, F.MXFP4 if mx else F.NVFP4, F.SfLayout.LAYOUT_128x4)
        out[r] = ((a_hat[r].double() @ w_hat.double().T).float() * alpha[e]).to(out_dtype)
    return moe_grouped.silu_mul(out, block_expert, block_m) if swiglu else out


def reference_exact_values(x, gs, fmt=None, src_pairs=None, top_k=1):
    """The contract of quantize.exact_values: x's rows src_pairs // top_k quantized (NVFP4 with
    gs, or MXFP4) and dequantized without gs."""
    from torch_fp4 import formats as F
    from torch_fp4.reference.quantize import dequantize_fp32, mxfp4_quantize, nvfp4_quantize
    fmt = fmt or F.NVFP4
    if src_pairs is not None:
        x = x.index_select(0, src_pairs.long() // top_k)
    q, s = (nvfp4_quantize(x, gs, F.SfLayout.LINEAR) if fmt is F.NVFP4 else mxfp4_quantize(x, F.SfLayout.LINEAR))
    return dequantize_fp32(q, s, None, fmt, F.SfLayout.LINEAR).to(BF16)


def check_expert_parallel(same, moe, x, ids, tw, block_m):
    """Experts 2..5 local, token 0 routed to none of them: its row is zeros."""
    ie = ids.clone()
    ie[0] = torch.tensor([0, 6, 1], dtype=torch.int32)
    out = same(moe, x, ie, tw, None, None, block_m, lo=2, weights=moe.sliced(2, 6), what="EP")
    assert (out[0] == 0).all()


def check_silu_mul_skips_unused_blocks():
    """silu_mul with the blocks' experts: used blocks equal the reference SwiGLU bit for bit; rows of
    unused blocks (NaN here: the GEMM leaves them unwritten) come out as zeros."""
    from torch_fp4.kernels.triton import moe_grouped as MG
    from torch_fp4.reference.moe import silu_mul
    block_m, inter = 16, 40
    block_expert = torch.tensor([2, -1, 0, -1], dtype=torch.int32)
    h = (torch.randn(4 * block_m, 2 * inter, generator=torch.Generator().manual_seed(3)) * 4).to(BF16)
    unused = torch.repeat_interleave(block_expert < 0, block_m)
    h[unused] = float("nan")
    got = MG.silu_mul(h, block_expert, block_m)
    assert (got[unused] == 0).all()
    assert torch.equal(got[~unused], silu_mul(h[~unused]))
    assert torch.equal(MG.silu_mul(h[~unused]), silu_mul(h[~unused]))


def check_glue_interpreted():
    import torch_fp4
    from tests.interpreted_exp import use_torch_exp
    from tests.test_moe import Moe, _gen, _routing
    from torch_fp4 import formats as F
    from torch_fp4 import reference
    from torch_fp4.kernels import _common
    from torch_fp4.kernels.triton import moe_grouped as MG
    from torch_fp4.reference.quantize import nvfp4_quantize
    _common.POISON_OUTPUTS = True
    use_torch_exp()
    check_silu_mul_skips_unused_blocks()

    def same(moe, x, ids, tw, a1, a2, block_m, lo=0, weights=None, what=""):
        weights = weights if weights is not None else moe.weights()
        want = reference.fused_moe(x, *weights, ids, tw, a1, a2, lo, BF16, lo == 0)
        assert want.abs().max() > 0.01, f"{what}: no signal"
        # W4A4 as codes and scales (the cute-dsl backend) and as exact 16-bit values (cuda)
        for exact in (None, reference_exact_values) if a1 is not None else (None,):
            g = MG.GroupedGemm(gemm=lambda *args, **kw: emulated_gemm(*args, block_m, **kw), block_m=block_m,
                               quantize=nvfp4_quantize, sf_layout=F.SfLayout.LINEAR, exact=exact)
            got = MG.fused_moe(x, *weights, ids, tw, a1, a2, lo, BF16, lo == 0, g)
            d = (got.float() - want.float()).abs()
            assert torch.equal(got, want), \
                f"{what} exact={exact is not None}: {int((d > 0).sum())} of {d.numel()} differ, max {d.max()}"
        return got

    moe = Moe(e=8, h=64, inter=128, seed=1)
    x = torch.randn(40, moe.h, generator=_gen(2)).to(BF16)
    ids, tw = _routing(40, moe.e, 3, 3)
    a1 = torch_fp4.compute_global_scale(x)
    a2_one = torch.tensor([180.0])
    a2_each = torch.tensor([96.0, 150.0, 200.0, 310.0, 120.0, 260.0, 90.0, 175.0])
    for bm in (64, 128, 256):
        same(moe, x, ids, tw, None, None, bm, what=f"W4A16 block_m {bm}")
    same(moe, x, ids, tw, a1, a2_one, 64, what="W4A4 a2[1]")
    same(moe, x, ids, tw, a1, a2_each, 64, what="W4A4 a2[E]")
    check_expert_parallel(same, moe, x, ids, tw, 64)
    check_gpt_oss_glue(moe, x, ids, tw)


def check_gpt_oss_glue(moe, x, ids, tw):
    """gpt-oss's features through the shared launches (moe_grouped.fused_moe's gpt_oss: the GEMM's
    MXFP4 variant and fp32 results, silu_mul's bias and clamp, add_bias_rows): bit for bit the
    reference, for MXFP4 experts and NVFP4 experts, each bias alone, both, fp32 and bf16, both
    activations, every block_m."""
    from torch_fp4 import formats as F
    from torch_fp4 import reference
    from torch_fp4 import testing as T
    from torch_fp4.kernels.triton import moe_grouped as MG
    from torch_fp4.kernels.triton.moe_gemm import GptOss
    from torch_fp4.reference.quantize import nvfp4_quantize
    torch.manual_seed(5)
    g = T.gpt_oss_moe_problem(tokens=9, hidden=96, inter=64, experts=4, top_k=2)
    mx_w = (g["w1"], g["w1_scale"], None, g["w2"], g["w2_scale"], None)
    b1, b2 = g["w1_bias"] * 4, g["w2_bias"]
    cases = [("MXFP4", mx_w, g["x"], g["topk_ids"], g["topk_weights"], 4)]
    cases.append(("NVFP4", moe.weights(), x, ids, tw, moe.e))
    for name, weights, xx, ii, ww, experts in cases:
        fmt = F.MXFP4 if name == "MXFP4" else F.NVFP4
        two_i, hidden = weights[0].shape[1], xx.shape[1]
        gen = torch.Generator().manual_seed(7)
        bias1 = torch.randn(experts, two_i, generator=gen) * 4
        bias2 = torch.randn(experts, hidden, generator=gen)
        combos = [(bias1.to(BF16), bias2.to(BF16), "clamped_swiglu"), (bias1, None, "swiglu"),
                  (None, bias2, "clamped_swiglu"), (None, None, "clamped_swiglu"), (bias1, bias2.to(BF16), "swiglu")]
        if name == "MXFP4":
            combos.append((None, None, "swiglu"))
            combos[0] = (b1, b2, "clamped_swiglu")
        for w1b, w2b, act in combos:
            want = reference.fused_moe(xx, *weights, ii, ww, None, None, 0, BF16, True, fmt, w1b, w2b, act, 1.702, 7.0)
            go = GptOss(fmt is F.MXFP4, w1b, w2b, act == "clamped_swiglu", 1.702, 7.0)
            for bm in (64, 128):
                gg = MG.GroupedGemm(gemm=lambda *args, **kw: emulated_gemm(*args, bm, **kw), block_m=bm,
                                    quantize=nvfp4_quantize, sf_layout=F.SfLayout.LINEAR)
                got = MG.fused_moe(xx, *weights, ii, ww, None, None, 0, BF16, True, gg, go)
                what = (f"{name} block_m {bm} w1_bias {None if w1b is None else w1b.dtype} "
                        f"w2_bias {None if w2b is None else w2b.dtype} {act}")
                d = (got.float() - want.float()).abs()
                assert torch.equal(got, want), f"{what}: {int((d > 0).sum())} of {d.numel()} differ, max {d.max()}"


def test_glue_under_interpreter():
    """The grouped-GEMM launches (wgmma family). The decode path (small-M family) is one C call:
    tests/test_cuda_libraries.py checks its plan and workspace layout, tests/test_gpu_moe_cuda.py
    its results."""
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", TRITON_DEFAULT_FP_FUSION="0")
    code = "import tests.test_cuda_moe_glue as t; t.check_glue_interpreted(); print('glue ok')"
    res = subprocess.run([sys.executable, "-W", "ignore", "-c", code], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0 and "glue ok" in res.stdout, res.stdout[-3000:] + res.stderr[-6000:]
