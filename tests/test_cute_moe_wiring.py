"""CPU checks of the `cute-dsl` fused_moe backend's wiring (torch_fp4/kernels/cute/moe_fused.py).

The grouped tcgen05 GEMM (moe_blockscaled.grouped_gemm) is compiled, never run: no Blackwell GPU
was available. Here it is replaced by `emulated_grouped_gemm`, a PyTorch implementation of its
documented contract (per 128-row block b with expert e = block_expert[b] >= 0: dequantize A's
block and w[e], exact product in fp64 rounded to fp32, times alpha[e], bf16 rounding; FC1 then
SwiGLU exactly as torch_fp4.reference.silu_mul; blocks with e = -1 are not written). Everything
else runs for real: the Triton grouping, inverse-permutation and finalize kernels under Triton's
interpreter (TRITON_INTERPRET=1, in a subprocess), the gather, the alphas and the quantizations
(the reference quantize under the interpreter, as the Triton MoE launcher does). The whole
launcher must equal torch_fp4.reference.fused_moe bit for bit: this checks the grouping, the
gather, the 128-row block / 128x4 scale-tile alignment, the per-block a2
quantization, the alphas, the inverse permutation and the finalize, not the kernel itself.

To show that padding is never read, the harness checks that align cleared the sorted_pairs
entries of padding rows (the gather reads them: token 0's row) and the emulated GEMM writes NaN
to every row that holds no pair. The emulated GEMM also checks that the tensors the
launcher passes satisfy the real kernel's argument checks (moe_tactics.why_not with the default
tactics of compute capability 10.0 and 10.3).

Requirement checks run in-process: CPU tensors, W4A16, and (with fake CUDA tensors and a
monkeypatched torch.cuda.get_device_capability) capabilities and shape limits.
"""
import importlib.util
import os
import subprocess
import sys

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_fp4
from torch_fp4 import formats as F
from torch_fp4 import testing as T
from torch_fp4.backends import Backend
from torch_fp4.ops import supported_backends, unsupported_reason

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HAVE_CUTLASS = importlib.util.find_spec("cutlass") is not None
BF16 = torch.bfloat16


# ---------------------------------------------------------------------------------------------
# The grouped GEMM's contract, in PyTorch
# ---------------------------------------------------------------------------------------------
def emulated_grouped_gemm(a, a_scale, w, w_scale, alpha, block_expert, swiglu, block_m=128, mx=False):
    from torch_fp4.reference.moe import silu_mul
    from torch_fp4.reference.quantize import dequantize_fp32
    lay = F.SfLayout.LAYOUT_128x4
    fmt = F.MXFP4 if mx else F.NVFP4
    rows, experts = a.shape[0], w.shape[0]
    assert block_m % 128 == 0 and rows == block_expert.numel() * block_m
    sf = torch.float8_e8m0fnu if mx else torch.float8_e4m3fn
    assert a_scale.shape[0] == rows and a_scale.dtype == sf and F.as_uint8(w_scale).shape[0] == experts
    assert alpha.dtype == torch.float32 and tuple(alpha.shape) == (experts,)
    assert block_expert.dtype == torch.int32
    n_out = w.shape[1] // 2 if swiglu else w.shape[1]
    out = torch.full((rows, n_out), float("nan"), dtype=BF16)   # unused blocks: not written
    for b, e in enumerate(block_expert.tolist()):
        if e < 0:
            continue
        assert e < experts
        r = slice(b * block_m, (b + 1) * block_m)
        # a block of 128 (256) rows is one (two) 128x4 scale tiles: the rows [r] of a_scale are its bytes
        a_hat = dequantize_fp32(a[r], a_scale[r], None, fmt, lay)
        w_hat = dequantize_fp32(w[e], w_scale[e], None, fmt, lay)
        h = ((a_hat.double() @ w_hat.double().T).float() * alpha[e]).to(BF16)
        out[r] = silu_mul(h) if swiglu else h
    return out


def _holds_pair(blocks) -> torch.Tensor:
    e = blocks.block_expert.long().repeat_interleave(blocks.block_m)
    end = blocks.expert_end.long()[e.clamp(min=0)]
    return (e >= 0) & (torch.arange(blocks.rows) < end)


class Harness:
    """Replaces the shared launches' align (moe_grouped: to check its cleared padding) and
    moe_fused's grouped GEMM."""

    def __init__(self, MG):
        self.real_align = MG.align
        self.blocks, self.calls, self.tactics = None, [], []

    def align(self, ids, experts, lo, block_m, zero_padding=False):
        assert zero_padding, "the shared launches gather through every sorted_pairs entry"
        b = self.real_align(ids, experts, lo, block_m, zero_padding=True)
        pad = b.sorted_pairs[~_holds_pair(b)]
        assert torch.equal(pad, torch.zeros_like(pad)), "padding rows' sorted_pairs entries are cleared"
        self.blocks = b
        return b

    def gemm(self, a, a_scale, w, w_scale, alpha, block_expert, swiglu, tactic=None, mx=False):
        from torch_fp4.kernels.cute import moe_tactics as MT
        assert block_expert is self.blocks.block_expert
        if tactic is not None:   # the launcher's tactic: its rows per block group the pairs
            assert a.shape[0] == block_expert.numel() * tactic.block_m
            self.tactics.append(tactic)
        n_out = w.shape[1] // 2 if swiglu else w.shape[1]
        if (2 * a.shape[1]) % 32 == 0 and (not swiglu or n_out % 128 == 0):
            for cap in ((10, 0), (10, 3)):
                reason = MT.why_not(MT.default_for(cap, swiglu, n_out), a, a_scale, w, w_scale,
                                    alpha, block_expert, swiglu, 128 if tactic is None else tactic.block_m, cap=cap)
                assert reason is None, reason
        self.calls.append("fc1" if swiglu else "fc2")
        out = emulated_grouped_gemm(a, a_scale, w, w_scale, alpha, block_expert, swiglu,
                                    128 if tactic is None else tactic.block_m, mx)
        out[~_holds_pair(self.blocks)] = float("nan")   # padding rows: undefined
        return out


# ---------------------------------------------------------------------------------------------
# Under Triton's interpreter (a subprocess: TRITON_INTERPRET must be set before triton.jit runs)
# ---------------------------------------------------------------------------------------------
def check_wiring_interpreted():
    from tests.test_moe import Moe, _gen, _routing
    from torch_fp4 import reference
    from torch_fp4.kernels import _common
    from torch_fp4.kernels.cute import moe_fused as MF
    from torch_fp4.kernels.triton import moe_grouped as MG
    from tests.interpreted_exp import use_torch_exp
    _common.POISON_OUTPUTS = True
    use_torch_exp()
    harness = Harness(MG)
    MG.align, MF._grouped_gemm = harness.align, harness.gemm

    def same(moe, x, ids, tw, a2, lo=0, weights=None, out_dtype=BF16, what="", tactic=None):
        weights = weights if weights is not None else moe.weights()
        a1 = torch_fp4.compute_global_scale(x)
        harness.calls.clear()
        harness.tactics.clear()
        got = MF.fused_moe(x, *weights, ids, tw, a1, a2, lo, out_dtype, tactic=tactic)
        want = reference.fused_moe(x, *weights, ids, tw, a1, a2, lo, out_dtype)
        assert harness.calls == ["fc1", "fc2"], harness.calls
        assert harness.tactics == ([] if tactic is None else [tactic, tactic])
        d = (got.float() - want.float()).abs()
        assert got.dtype == want.dtype and torch.equal(got, want), (
            f"{what}: {int((d > 0).sum())} of {d.numel()} differ, max {d.max().item()}")
        assert want.abs().max() > 0.01, f"{what}: no signal"
        return got

    a2_one = torch.tensor([180.0])
    a2_of = lambda e: torch.tensor([96.0, 150.0, 200.0, 310.0, 120.0, 260.0, 90.0, 175.0][:e])  # noqa: E731
    # T = 5, E = 4, k = 2: a2 shared and per expert; output dtypes; fp16 activations
    moe = Moe(e=4, h=64, inter=128, seed=1)
    x = torch.randn(5, moe.h, generator=_gen(2)).to(BF16)
    ids, tw = _routing(5, moe.e, 2, 3)
    same(moe, x, ids, tw, a2_one, what="T=5 E=4 k=2 a2[1]")
    same(moe, x, ids, tw, a2_of(4), what="T=5 E=4 k=2 a2[E]")
    for out_dtype in (torch.float32, torch.float16):
        same(moe, x, ids, tw, a2_of(4), out_dtype=out_dtype, what=f"out {out_dtype}")
    same(moe, x.half(), ids, tw, a2_one, out_dtype=torch.float16, what="fp16 x")
    # T = 1 (k = 1 and 3), E = 8; T = 40, k = 3 (120 pairs: one align chunk)
    big = Moe(e=8, h=64, inter=128, seed=11)
    x1 = torch.randn(1, big.h, generator=_gen(12)).to(BF16)
    for k in (1, 3):
        i1, t1 = _routing(1, big.e, k, 13 + k)
        same(big, x1, i1, t1, a2_of(8), what=f"T=1 k={k}")
    x40 = torch.randn(40, big.h, generator=_gen(20)).to(BF16)
    i40, t40 = _routing(40, big.e, 3, 21)
    same(big, x40, i40, t40, a2_one, what="T=40 k=3 a2[1]")
    same(big, x40, i40, t40, a2_of(8), what="T=40 k=3 a2[E]")
    from torch_fp4.kernels.cute.moe_tactics import CuteMoeTactic   # 2x1 clusters: blocks of 256 rows
    same(big, x40, i40, t40, a2_of(8), what="T=40 k=3 a2[E] 2x1 clusters", tactic=CuteMoeTactic(256, 256, 256, 2))
    # several align chunks (150 pairs), E = 5, H = 96, I = 256
    wide = Moe(e=5, h=96, inter=256, seed=30)
    x50 = torch.randn(50, wide.h, generator=_gen(31)).to(BF16)
    i50, t50 = _routing(50, wide.e, 3, 32)
    same(wide, x50, i50, t50, a2_of(5), what="T=50 k=3 E=5 (3 chunks)")
    # empty experts: every pair on experts 6 and 1; one expert over two blocks (150 rows)
    two = torch.full((40, 2), 6, dtype=torch.int32)
    two[:, 1] = 1
    same(big, x40, two, torch.rand(40, 2, generator=_gen(40)), a2_of(8), what="6 empty experts")
    x150 = torch.randn(150, big.h, generator=_gen(41)).to(BF16)
    same(big, x150, torch.full((150, 1), 3, dtype=torch.int32),
         torch.rand(150, 1, generator=_gen(42)), a2_of(8), what="150 rows on one expert")
    # expert parallelism: experts 2..5 of 7 local; token 0 routed to none of them
    ep = Moe(e=7, h=64, inter=128, seed=50)
    xe = torch.randn(9, ep.h, generator=_gen(51)).to(BF16)
    ie, te = _routing(9, ep.e, 3, 52)
    ie[0] = torch.tensor([0, 6, 1], dtype=torch.int32)
    out = same(ep, xe, ie, te, a2_of(4), lo=2, weights=ep.sliced(2, 6), what="EP a2[E]")
    assert (out[0] == 0).all()
    same(ep, xe, ie, te, a2_one, lo=2, weights=ep.sliced(2, 6), what="EP a2[1]")
    # no local pair at all; T = 0
    none = torch.zeros((5, 2), dtype=torch.int32)
    none[:, 1] = 1
    got = MF.fused_moe(x, *ep.sliced(2, 6), none, tw, torch_fp4.compute_global_scale(x), a2_one,
                       2, BF16)
    assert (got == 0).all()
    empty = torch.empty(0, moe.h, dtype=BF16)
    assert MF.fused_moe(empty, *moe.weights(), torch.empty(0, 2, dtype=torch.int32),
                        torch.empty(0, 2), a2_one, a2_one, 0, BF16).shape == (0, moe.h)
    # MXFP4 experts with MXFP4 activations (kind::mxf4; no global scales, alphas 1): T = 40, k = 3,
    # and expert parallelism, against the reference's W4A4 with MXFP4 activations
    from torch_fp4 import testing as T
    g = T.gpt_oss_moe_problem(tokens=40, hidden=96, inter=128, experts=6, top_k=3)
    mxw = (g["w1"], g["w1_scale"], None, g["w2"], g["w2_scale"], None)
    tail = (F.MXFP4, None, None, "swiglu", 1.702, 7.0, True)
    for lo, weights in ((0, mxw), (2, tuple(t[2:5] if t is not None else None for t in mxw))):
        harness.calls.clear()
        got = MF.fused_moe(g["x"], *weights, g["topk_ids"], g["topk_weights"], None, None, lo, BF16, lo == 0, *tail)
        want = reference.fused_moe(g["x"], *weights, g["topk_ids"], g["topk_weights"], None, None, lo, BF16,
                                   lo == 0, *tail)
        assert harness.calls == ["fc1", "fc2"], harness.calls
        d = (got.float() - want.float()).abs()
        assert torch.equal(got, want), f"MXFP4 lo={lo}: {int((d > 0).sum())} of {d.numel()} differ"
        w4a16 = reference.fused_moe(g["x"], *weights, g["topk_ids"], g["topk_weights"], None, None, lo, BF16,
                                    lo == 0, *tail[:-1], False)
        assert not torch.equal(want, w4a16), "MXFP4 activations must change the result"
    try:
        MF.fused_moe(g["x"], *mxw, g["topk_ids"], g["topk_weights"], None, None, 0, BF16, True,
                     F.MXFP4, g["w1_bias"], None, "swiglu", 1.702, 7.0, True)
        raise AssertionError("biases must be refused")
    except ValueError as exc:
        assert "without biases" in str(exc)


def test_wiring_under_interpreter():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", TRITON_DEFAULT_FP_FUSION="0")
    code = ("import tests.test_cute_moe_wiring as t; t.check_wiring_interpreted(); "
            "print('wiring ok')")
    res = subprocess.run([sys.executable, "-W", "ignore", "-c", code], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0 and "wiring ok" in res.stdout, res.stdout[-3000:] + res.stderr[-6000:]


def test_op_tactic_space(capability):
    """fused_moe's cute-dsl tactics (CuteMoeTactic) join the tactic system: the default is
    default_for's tiles without clusters, candidates are every FC1 K tile x FC2 tile x cluster the
    capability has that both GEMMs of the problem can run, why_not names the GEMM and the reason,
    keys bucket the pairs."""
    from torch_fp4.kernels.cute import moe_tactics as MT
    from torch_fp4.problems import MoeProblem

    def problem(cap, tokens=64, top_k=2, experts=8, hidden=2048, inter=768, **kw):
        fields = dict(tokens=tokens, hidden=hidden, inter=inter, experts=experts, top_k=top_k, w4a4=True,
                      a2_per_expert=False, x_dtype=BF16, out_dtype=BF16, local_expert_offset=0, strict_ids=True,
                      device=torch.device("cuda", 0), capability=cap)
        return MoeProblem(**{**fields, **kw})
    p = problem((10, 0))
    d = MT.op_default(p)
    assert d == MT.CuteMoeTactic(256, 256, 256, 1) and MT.op_why_not(d, p) is None
    c = MT.op_candidates(p)
    assert c[0] == d and len(c) == len(set(c)) == 4        # FC2 tile_n 128 / 256, clusters 1 / 2
    assert {t.cluster_m for t in c} == {1, 2} and all(t.fc1_tile_k == 256 for t in c)
    c103 = MT.op_candidates(problem((10, 3)))
    assert {t.fc1_tile_k for t in c103} == {256, 768} and len(c103) == 16
    assert MT.op_candidates(problem((9, 0))) == [] or all(MT.op_why_not(t, problem((9, 0))) is None
                                                           for t in MT.op_candidates(problem((9, 0))))
    assert "FC1: FC1 needs I" in MT.op_why_not(d, problem((10, 0), inter=64))
    assert "not a grouped MoE tactic of compute capability 10.0" in MT.op_why_not(
        MT.CuteMoeTactic(768, 128, 768, 1), p)
    assert MT.op_why_not(MT.Sm100MoeTactic(), p) == "cute_moe_tcgen05 is not a cute-dsl fused_moe tactic"
    huge = problem((10, 0), tokens=1_100_000, top_k=8, a2_per_expert=True)
    assert "at most 65535 blocks" in MT.op_why_not(MT.CuteMoeTactic(cluster_m=1), huge)
    assert MT.op_key(p) != MT.op_key(problem((10, 0), tokens=128))
    assert MT.op_key(p) == MT.op_key(problem((10, 0), tokens=60))
    from torch_fp4 import tactics
    assert tactics.tactic_from_json(d.to_json()) == d
    capability((10, 0))
    pytest.importorskip("triton")
    if HAVE_CUTLASS:   # the op lists them through the tactic system
        listed = torch_fp4.fused_moe_tactics(**_fake_args(tokens=64, hidden=2048, inter=768, experts=8),
                                             backend="cute-dsl")
        assert listed and all(isinstance(t, MT.CuteMoeTactic) for t in listed)


def test_launcher_calls_grouped_gemm_with_its_signature(monkeypatch):
    """moe_fused._grouped_gemm forwards to moe_blockscaled.grouped_gemm with block_m = 128, or with
    the fused_moe tactic's GEMM tactic and rows per block."""
    pytest.importorskip("triton")
    pytest.importorskip("cutlass")
    from torch_fp4.kernels.cute import moe_blockscaled as MB
    from torch_fp4.kernels.cute import moe_fused as MF
    seen = {}

    def record(*args, **kwargs):
        seen["args"], seen["kwargs"] = args, kwargs
        return "out"
    monkeypatch.setattr(MB, "grouped_gemm", record)
    assert MF._grouped_gemm(1, 2, 3, 4, 5, 6, True) == "out"
    assert seen == {"args": (1, 2, 3, 4, 5, 6, True), "kwargs": {"block_m": 128, "mx": False}}
    MF._grouped_gemm(1, 2, 3, 4, 5, 6, True, mx=True)
    assert seen["kwargs"] == {"block_m": 128, "mx": True}
    from torch_fp4.kernels.cute.moe_tactics import CuteMoeTactic, Sm100MoeTactic
    t = CuteMoeTactic(256, 256, 256, 2)
    for swiglu, gemm in ((True, Sm100MoeTactic(256, 256, 2)), (False, Sm100MoeTactic(256, 256, 2))):
        MF._grouped_gemm(1, 2, 3, 4, 5, 6, swiglu, tactic=t)
        assert seen["kwargs"] == {"block_m": 256, "tactic": gemm, "mx": False}
    MF._grouped_gemm(1, 2, 3, 4, 5, 6, False, tactic=CuteMoeTactic(256, 128, 256, 1))
    assert seen["kwargs"] == {"block_m": 128, "tactic": Sm100MoeTactic(128, 256, 1), "mx": False}


@pytest.mark.parametrize("arch", [100, 103])
def test_glue_kernels_compile(arch):
    """The inverse-permutation and finalize kernels compile for Blackwell (compiled, not run):
    no atomics (deterministic), and no fused multiply-add in the top-k sum (w * y rounds, then
    the add, as the reference)."""
    triton = pytest.importorskip("triton")
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from torch_fp4.kernels.triton import moe_grouped as MG

    def compile_ptx(fn, sig, consts):
        src = ASTSource(fn=fn, signature={**sig, **{k: "constexpr" for k in consts}},
                        constexprs=consts)
        return triton.compile(src, target=GPUTarget("cuda", arch, 32),
                              options={"num_warps": 4, "enable_fp_fusion": False}).asm["ptx"]
    inv = compile_ptx(MG._inverse_kernel, dict(sorted_ptr="*i32", block_expert_ptr="*i32",
                                               end_ptr="*i32", inv_ptr="*i32", n_rows="i32"),
                      dict(BM=128, BR=1024, USE_GDC=False))
    from torch_fp4.kernels.triton import moe_fused as TF   # the shared finalize, through inv
    fin = compile_ptx(TF._finalize_kernel, dict(y_ptr="*bf16", inv_ptr="*i32", ids_ptr="*i32",
                                                tw_ptr="*fp32", gsw_ptr="*fp32", gsa_ptr="*fp32",
                                                b2_ptr="*bf16", out_ptr="*bf16", top_k="i32", H="i32",
                                                P="i32", lo="i32", E="i32", gsa_stride="i32"),
                      dict(KP=8, SPLIT=1, A_FP4=False, INDIRECT=True, OUT=tl.bfloat16, BT=4,
                           BH=256, PORTABLE=False, STRICT=True, USE_GDC=False, MX=False, BIAS=False))
    for ptx in (inv, fin):
        assert f".target sm_{arch}" in ptx and "atom." not in ptx
    assert "fma." not in fin


# ---------------------------------------------------------------------------------------------
# Requirement
# ---------------------------------------------------------------------------------------------
def _fake_args(tokens=6, hidden=64, inter=128, experts=4, top_k=2, a2_experts=False, w4a4=True):
    """fused_moe's public arguments as fake CUDA tensors (shapes and devices only)."""
    with FakeTensorMode():
        dev = "cuda"
        kp = lambda k: -(-(k // 16) // 4) * 4   # noqa: E731
        mp = lambda m: -(-m // 128) * 128       # noqa: E731
        x = torch.empty(tokens, hidden, dtype=BF16, device=dev)
        w1 = torch.empty(experts, 2 * inter, hidden // 2, dtype=torch.uint8, device=dev)
        w1s = torch.empty(experts, mp(2 * inter), kp(hidden), dtype=torch.uint8, device=dev)
        w2 = torch.empty(experts, hidden, inter // 2, dtype=torch.uint8, device=dev)
        w2s = torch.empty(experts, mp(hidden), kp(inter), dtype=torch.uint8, device=dev)
        gs = torch.empty(experts, device=dev)
        ids = torch.empty(tokens, top_k, dtype=torch.int32, device=dev)
        tw = torch.empty(tokens, top_k, device=dev)
        a1 = torch.empty(1, device=dev) if w4a4 else None
        a2 = (torch.empty(experts if a2_experts else 1, device=dev)) if w4a4 else None
    return dict(x=x, w1=w1, w1_scale=w1s, w1_global_scale=gs, w2=w2, w2_scale=w2s, w2_global_scale=gs,
                topk_ids=ids, topk_weights=tw, a1_global_scale=a1, a2_global_scale=a2, out_dtype=BF16)


def _reason(kw):
    return unsupported_reason("fused_moe", Backend.CUTE_DSL, **kw)


def test_requirement_on_cpu():
    kw = T.moe_problem(tokens=3, hidden=64, inter=128, experts=2, top_k=1)
    assert _reason(kw) == "needs CUDA tensors (got cpu)"
    w4a16 = dict(kw, a1_global_scale=None, a2_global_scale=None)
    assert _reason(w4a16).startswith("cute-dsl fused_moe needs W4A4 (a1_global_scale, or activations='fp4' with MXFP4")
    with pytest.raises(ValueError, match="fused_moe: backend: 'cute-dsl' cannot run here: "
                                         "needs CUDA tensors"):
        torch_fp4.fused_moe(**kw, backend="cute-dsl")
    # opt-in only: "auto" never considers it
    assert Backend.CUTE_DSL not in supported_backends("fused_moe", **kw)
    # MXFP4 experts: W4A4 with MXFP4 activations and no biases reaches the device check; biases,
    # the clamped SwiGLU or W4A16 are refused, named
    g = T.gpt_oss_moe_problem(tokens=3, hidden=64, inter=128, experts=2, top_k=1)
    plain = dict(g, w1_bias=None, w2_bias=None, activation="swiglu")
    assert _reason(dict(plain, activations="fp4")) == "needs CUDA tensors (got cpu)"
    assert "MXFP4 experts, expert biases, the clamped SwiGLU" in _reason(dict(g, activations="fp4"))
    assert "the clamped SwiGLU" in _reason(dict(plain, activation="clamped_swiglu", activations="fp4"))
    assert _reason(plain).startswith("cute-dsl fused_moe needs W4A4")


@pytest.fixture
def capability(monkeypatch):
    def set_cap(cap):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, **k: cap)
    return set_cap


def test_requirement_capability(capability):
    pytest.importorskip("triton")
    for cap in ((9, 0), (12, 0), (11, 0), (10, 1)):
        capability(cap)
        assert _reason(_fake_args()) == (
            "cute-dsl fused_moe needs compute capability 10.0 or 10.3 (tcgen05 block-scaled MMA); "
            f"device has {cap[0]}.{cap[1]}")
    capability((10, 0))
    assert _reason(_fake_args(w4a4=False)).startswith("cute-dsl fused_moe needs W4A4")
    for cap in ((10, 0), (10, 3)):
        capability(cap)
        if HAVE_CUTLASS:
            assert _reason(_fake_args()) is None
            assert _reason(_fake_args(tokens=300, top_k=8, experts=64, a2_experts=True,
                                      hidden=2048, inter=768)) is None


def test_requirement_shapes(capability):
    pytest.importorskip("triton")
    if not HAVE_CUTLASS:
        pytest.skip("needs nvidia-cutlass-dsl (the requirement asks for it first)")
    capability((10, 0))
    assert _reason(_fake_args(inter=48)) == (
        "FC1: FC1 needs I = w1.shape[1] / 2 = 48 to be a multiple of 128 (gate and up tiles "
        "start on 128-row scale-factor atoms)")
    assert _reason(_fake_args(hidden=80)) == (
        "FC1: K = 80 must be a multiple of 32 (TMA needs 16-byte rows of packed FP4)")
    # per-expert a2: the per-block quantize of the intermediate has at most 65535 blocks
    huge = dict(tokens=1_100_000, top_k=8, experts=8)
    assert _reason(_fake_args(**huge)) is None
    reason = _reason(_fake_args(**huge, a2_experts=True))
    assert reason.startswith("a per-expert a2_global_scale quantizes the intermediate per "
                             "128-row block, at most 65535 blocks"), reason
