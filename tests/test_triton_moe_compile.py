"""CPU checks of the Triton MoE kernels (no GPU needed).

- Compile for sm_90: the grouped GEMMs use wgmma and the mm kernel's in-register E2M1 decode,
  FC1 in W4A4 quantizes the intermediate in its epilogue (RN satfinite e4m3 scales), SwiGLU and
  alphas use correctly rounded divisions and libdevice exp, no kernel lets the compiler fuse a
  multiply and an add, the grouping kernels use no atomics (FC2's fused finalize only counts
  arrivals with them, after a barrier), and the tiles chosen for the benchmark models fit in
  shared memory without register spills in their main loops.
- Under Triton's interpreter (TRITON_INTERPRET=1, in a subprocess, with the kernels' portable
  forms): routing ids equal the reference's and weights are within moe_route.weight_rtol; the
  expert grouping equals a Python computation of the contract (counts, offsets, stable order,
  padding, block map); the whole fused MoE launcher equals the reference bit for bit in every
  mode and tile configuration, with expert parallelism, empty experts, one expert taking every
  pair, T = 1 and top_k = 1.
"""
import os
import re
import subprocess
import sys

import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

import torch_fp4  # noqa: E402
from torch_fp4 import testing as T  # noqa: E402
from torch_fp4.kernels.triton import moe_align as MA  # noqa: E402
from torch_fp4.kernels.triton import moe_fused as MF  # noqa: E402
from torch_fp4.kernels.triton import moe_gemm as MG  # noqa: E402
from torch_fp4.kernels.triton import moe_route as MR  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIV16 = [["tt.divisibility", 16]]
SMEM_SM90 = 227 * 1024


def _compile(fn, sig, consts, divisible, warps=4, stages=3, arch=90):
    sig = {**sig, **{k: "constexpr" for k in consts}}
    attrs = {(i,): DIV16 for i, name in enumerate(sig) if name in divisible or sig[name].startswith("*")}
    src = ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32),
                          options={"num_warps": warps, "num_stages": stages, "enable_fp_fusion": False})


def _fc1(w4a4, swap, bm, bn, bk, warps=4, stages=3, x="bf16", even_k=True, arch=90, mx=False, bias=False,
         clamped=False):
    half = tl.float16 if x == "fp16" else tl.bfloat16
    sig = dict(a_ptr="*u8" if w4a4 else f"*{x}", as_ptr="*u8", w_ptr="*u8", ws_ptr="*u8",
               gsw_ptr="*fp32", gsa_ptr="*fp32", gs2_ptr="*fp32", out_ptr="*u8" if w4a4 else "*bf16",
               outs_ptr="*u8" if w4a4 else "*bf16", sorted_ptr="*i32", block_expert_ptr="*i32",
               expert_end_ptr="*i32", b1_ptr="*bf16", top_k="i32", T="i32", KH="i32", I="i32", w_kp="i32",
               a_kp="i32", out_kp="i32", w_stride="i32", ws_stride="i32", gs2_stride="i32", sw_alpha="fp32",
               sw_limit="fp32")
    consts = dict(A_FP4=w4a4, QUANT_OUT=w4a4, SWAP=swap, DOT=half, HALF=half, BM=bm, BN=bn,
                  BK=bk, EVEN_K=even_k, PORTABLE=False, USE_GDC=False, MX=mx, BIAS=bias, CLAMPED=clamped)
    return _compile(MG._fc1_kernel, sig, consts, {"KH", "I", "w_kp", "w_stride", "ws_stride"},
                    warps, stages, arch)


def _fc2(w4a4, swap, bm, bn, bk, split=1, warps=4, stages=3, fused=True, top_k=8, strict=True, mx=False,
         bias=False):
    sig = dict(a_ptr="*u8" if w4a4 else "*bf16", as_ptr="*u8", w_ptr="*u8", ws_ptr="*u8",
               gsw_ptr="*fp32", gsa_ptr="*fp32", y_ptr="*bf16" if split == 1 else "*fp32",
               sorted_ptr="*i32", block_expert_ptr="*i32", expert_end_ptr="*i32", ids_ptr="*i32",
               tw_ptr="*fp32", out_ptr="*bf16", cnt_ptr="*i32", b2_ptr="*bf16", R="i32", N="i32", KH="i32",
               P="i32", w_kp="i32", a_kp="i32", w_stride="i32", ws_stride="i32", gsa_stride="i32",
               kh_per_split="i32", top_k="i32", T="i32", lo="i32", E="i32", n_gemm="i32")
    consts = dict(A_FP4=w4a4, SPLIT=split, SWAP=swap, DOT=tl.bfloat16, BM=bm, BN=bn, BK=bk,
                  EVEN_K=True, FUSED=fused, OUT=tl.bfloat16, KP=triton.next_power_of_2(top_k),
                  ZB=MG.ZERO_TOKENS, PORTABLE=False, STRICT=strict,
                  FIN_N=MG._finalize_columns(MG.MoeConfig(bm, swap, MG.GemmTile(64, 64),
                                                          MG.GemmTile(bn, bk, warps)), top_k), USE_GDC=False,
                  MX=mx, BIAS=bias)
    return _compile(MG._fc2_kernel, sig, consts, {"N", "KH", "w_kp", "w_stride", "ws_stride"},
                    warps, stages)


def _no_compiler_fma(ptx):
    """libdevice's expf uses fma.rn.ftz.f32 by design; the compiler's own contraction of a
    multiply and an add would be fma.rn.f32."""
    return not re.search(r"\bfma\.rn\.f32\b", ptx)


def _spills(kernel):
    """Spill instructions (STL/LDL) inside the main loop: the span of a backward branch that
    contains the MMAs (all of them where the listing has no labels). A few registers spilled
    around the loop, for the epilogue, cost nothing measurable."""
    from tests.sass_tools import disassemble, have_disassembler
    if not have_disassembler():
        pytest.skip("no nvdisasm/cuobjdump to check register spills")
    lines = disassemble(kernel.asm["cubin"]).splitlines()
    spills = [i for i, line in enumerate(lines) if re.search(r"\b(STL|LDL)\b", line)]
    labels = {m.group(1): i for i, line in enumerate(lines)
              if (m := re.match(r"\s*(\.L_x_\d+):", line))}
    mmas = [i for i, line in enumerate(lines) if re.search(r"\b(HGMMA|HMMA)\b", line)]
    if not labels or not mmas:
        return len(spills)
    loops = [(labels[m.group(1)], i) for i, line in enumerate(lines)
             if (m := re.search(r"\bBRA\b.*`\((\.L_x_\d+)\)", line)) and labels.get(m.group(1), i) < i]
    loops = [(a, b) for a, b in loops if any(a <= h <= b for h in mmas)]
    assert loops, "no loop around the MMAs found in the SASS listing"
    return sum(1 for i in spills if any(a <= i <= b for a, b in loops))


FC1_CASES = [dict(w4a4=False, swap=True, bm=16, bn=64, bk=128),
             dict(w4a4=False, swap=True, bm=16, bn=64, bk=128, x="fp16"),
             dict(w4a4=True, swap=True, bm=16, bn=64, bk=128),
             dict(w4a4=True, swap=True, bm=64, bn=64, bk=64),
             dict(w4a4=True, swap=False, bm=128, bn=64, bk=64, warps=8),
             dict(w4a4=False, swap=False, bm=128, bn=64, bk=64, warps=8, even_k=False)]


@pytest.mark.parametrize("case", FC1_CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_fc1_kernel_ptx(case):
    k = _fc1(**case)
    ptx = k.asm["ptx"]
    half = "f16" if case.get("x") == "fp16" else "bf16"
    assert "wgmma.mma_async" in ptx, "FC1 does not use wgmma"
    assert "prmt.b32" in ptx and f"fma.rn.{half}x2" in ptx, "the in-register E2M1 decode is missing"
    assert "div.rn.f32" in ptx and "div.full.f32" not in ptx and "rcp.approx" not in ptx, \
        "SwiGLU / alpha divisions must be correctly rounded"
    assert "ex2.approx.ftz.f32" in ptx, "silu's exp should be libdevice expf"
    assert _no_compiler_fma(ptx), "a fused multiply-add would merge two rounding steps"
    assert ("cvt.rn.satfinite.e4m3x2.f32" in ptx) == case["w4a4"], \
        "W4A4 quantizes the intermediate in the epilogue (and W4A16 does not)"
    assert k.metadata.shared <= SMEM_SM90
    assert _spills(k) == 0, "register spills in the main loop"


@pytest.mark.parametrize("case", [dict(w4a4=False, swap=True, bm=16, bn=64, bk=128),
                                  dict(w4a4=True, swap=True, bm=16, bn=64, bk=128, split=4),
                                  dict(w4a4=True, swap=True, bm=64, bn=64, bk=128),
                                  dict(w4a4=False, swap=False, bm=128, bn=128, bk=64, warps=8,
                                       fused=False)],
                         ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_fc2_kernel_ptx(case):
    k = _fc2(**case)
    ptx = k.asm["ptx"]
    assert "wgmma.mma_async" in ptx and "prmt.b32" in ptx and "fma.rn.bf16x2" in ptx
    assert _no_compiler_fma(ptx), "w * y + acc of the fused finalize must round twice"
    assert "div.rn.f32" in ptx, "alpha2 must be a correctly rounded reciprocal"
    # the fused finalize: stores published (barrier) before one acq_rel arrival count per row;
    # the last program reads the rows past L1
    if case.get("fused", True):
        assert "atom.global.gpu.acq_rel.add" in ptx and "ld.global.cg" in ptx
        assert ptx.count("atom.") == 1, "atomics only count arrivals, never add data"
    else:
        assert "atom." not in ptx
    assert k.metadata.shared <= SMEM_SM90
    assert _spills(k) == 0, "register spills in the main loop"


@pytest.mark.parametrize("split", [1, 4])
def test_gpt_oss_kernels_ptx(split):
    """MXFP4 experts with biases and the clamped SwiGLU compile for sm_90 with the in-register
    MXFP4 decode, correctly rounded divisions, no contracted multiply-add (the bias joins after
    alpha's rounding) and no spills in the main loop."""
    k1 = _fc1(False, True, 16, 64, 128, mx=True, bias=True, clamped=True)
    k2 = _fc2(False, True, 16, 64, 128, split=split, mx=True, bias=True)
    for k in (k1, k2):
        ptx = k.asm["ptx"]
        assert "wgmma.mma_async" in ptx and "prmt.b32" in ptx
        assert _no_compiler_fma(ptx)
        assert _spills(k) == 0
    assert "div.rn.f32" in k1.asm["ptx"] and "rcp.approx" not in k1.asm["ptx"]


def test_fc1_compiles_for_sm100():
    assert "prmt.b32" in _fc1(True, True, 16, 64, 128, arch=100).asm["ptx"]


@pytest.mark.parametrize("split", [1, 4])
def test_finalize_kernel_ptx(split):
    sig = dict(y_ptr="*bf16" if split == 1 else "*fp32", inv_ptr="*i32", ids_ptr="*i32",
               tw_ptr="*fp32", gsw_ptr="*fp32", gsa_ptr="*fp32", b2_ptr="*bf16", out_ptr="*bf16", top_k="i32",
               H="i32", P="i32", lo="i32", E="i32", gsa_stride="i32")
    consts = dict(KP=8, SPLIT=split, A_FP4=True, INDIRECT=False, OUT=tl.bfloat16, BT=4, BH=256,
                  PORTABLE=False, STRICT=split == 1, USE_GDC=False, MX=False, BIAS=False)
    ptx = _compile(MF._finalize_kernel, sig, consts, {"H"}).asm["ptx"]
    assert _no_compiler_fma(ptx), "w * y + acc must round twice, as the reference"
    assert "atom." not in ptx, "the top-k sum must be deterministic"


@pytest.mark.parametrize("method", list(MR.METHODS))
def test_route_kernel_ptx(method):
    sig = dict(logits_ptr="*bf16", bias_ptr="*fp32", ids_ptr="*i32", w_ptr="*fp32", stride_t="i32",
               stride_e="i32", bias_stride="i32", rsf="fp32")
    grouped = method == "deepseek_v3"
    consts = dict(METHOD=MR.METHODS[method], RENORM=method == "softmax", TOP_K=1 if method == "llama4" else 8,
                  BLOCK_K=1 if method == "llama4" else 8, N_GROUP=8 if grouped else 1,
                  GROUP=32 if grouped else 256, TOPK_GROUP=4 if grouped else 1,
                  BLOCK_G=8 if grouped else 1, BLOCK_I=32 if grouped else 256, PORTABLE=False,
                  USE_GDC=False)
    ptx = _compile(MR._route_kernel, sig, consts, set()).asm["ptx"]
    assert "div.rn.f32" in ptx and "ex2.approx.ftz.f32" in ptx and _no_compiler_fma(ptx)


def test_align_kernels_compile_without_atomics():
    ptxs = [
        _compile(MA._count_kernel, dict(ids_ptr="*i32", P="i32", lo="i32", E="i32",
                                        chunk_counts_ptr="*i32", rank_ptr="*i32", zero_ptr="*i32",
                                        n_zero="i32"),
                 dict(C=MA.CHUNK, ES=MA.EXPERT_SLICE, Z=MA.ZERO_STEP, USE_GDC=False), set()).asm["ptx"],
        _compile(MA._layout_kernel, dict(chunk_counts_ptr="*i32", n_chunks="i32", E="i32",
                                         base_ptr="*i32", counts_ptr="*i32", start_ptr="*i32",
                                         end_ptr="*i32", block_expert_ptr="*i32", n_blocks="i32"),
                 dict(BM=16, BLOCK_E=256, CH=16, NB=16, USE_GDC=False), set(), warps=8).asm["ptx"],
        _compile(MA._scatter_kernel, dict(ids_ptr="*i32", P="i32", lo="i32", E="i32", rank_ptr="*i32",
                                          base_ptr="*i32", start_ptr="*i32", sorted_ptr="*i32"),
                 dict(C=MA.CHUNK, USE_GDC=False), set()).asm["ptx"],
        _compile(MA._align_small_kernel,
                 dict(ids_ptr="*i32", P="i32", lo="i32", E="i32", chunk_counts_ptr="*i32",
                      base_ptr="*i32", counts_ptr="*i32", start_ptr="*i32", end_ptr="*i32",
                      block_expert_ptr="*i32", n_blocks="i32", sorted_ptr="*i32", zero_ptr="*i32",
                      n_zero="i32"),
                 dict(C=MA.CHUNK, ES=MA.EXPERT_SLICE, BM=16, BLOCK_E=512, CH=8, NB=8, Z=MA.ZERO_STEP,
                      USE_GDC=False),
                 set()).asm["ptx"],
        _compile(MA._align_small_kernel,   # the decode shape: a 16-pair chunk, 256 experts per step
                 dict(ids_ptr="*i32", P="i32", lo="i32", E="i32", chunk_counts_ptr="*i32",
                      base_ptr="*i32", counts_ptr="*i32", start_ptr="*i32", end_ptr="*i32",
                      block_expert_ptr="*i32", n_blocks="i32", sorted_ptr="*i32", zero_ptr="*i32",
                      n_zero="i32"),
                 dict(C=16, ES=256, BM=8, BLOCK_E=256, CH=1, NB=16, Z=MA.ZERO_STEP, USE_GDC=False),
                 set()).asm["ptx"],
    ]
    for ptx in ptxs:
        assert ".entry" in ptx and "atom." not in ptx
    assert "bar.sync" in ptxs[-1], "the one-program variant needs barriers between its steps"


# The benchmark models (bench moe): E, H, I, top_k.
MODELS = {"mixtral": (8, 4096, 14336, 2), "qwen3-30b-a3b": (128, 2048, 768, 8),
          "deepseek-v3": (256, 7168, 2048, 8)}


def test_default_tiles_of_the_benchmark_models_fit():
    seen = set()
    for experts, hidden, inter, top_k in MODELS.values():
        for tokens in (1, 4, 16, 64, 256, 1024, 4096):
            cfg = MG.default_config(tokens, top_k, experts, hidden, inter)
            for w4a4 in (False, True):
                for which, tile, k_dim in (("fc1", cfg.fc1, hidden), ("fc2", cfg.fc2, inter)):
                    split = cfg.fc2_split if which == "fc2" else 1
                    key = (which, w4a4, cfg.block_m, cfg.swap_ab, tile, split, cfg.fused_finalize, top_k)
                    if key in seen:
                        continue
                    seen.add(key)
                    assert k_dim % tile.block_k == 0, (which, tile, k_dim)
                    if which == "fc1":
                        k = _fc1(w4a4, cfg.swap_ab, cfg.block_m, tile.block_n, tile.block_k,
                                 tile.num_warps, tile.num_stages)
                    else:
                        k = _fc2(w4a4, cfg.swap_ab, cfg.block_m, tile.block_n, tile.block_k,
                                 cfg.fc2_split, tile.num_warps, tile.num_stages,
                                 cfg.fused_finalize, top_k)
                    assert k.metadata.shared <= SMEM_SM90, (key, k.metadata.shared)
                    assert _spills(k) == 0, (key, "register spills in the main loop")


def test_block_k_keeps_scale_loads_in_bounds():
    assert MG.block_k_for(7168, 256) == 256 and MG.block_k_for(768, 256) == 256
    assert MG.block_k_for(320, 256) == 64 and MG.block_k_for(48, 128) == 64
    assert MG.block_k_for(2048 + 64, 128) == 64


def test_max_blocks_bounds_every_routing():
    for pairs, experts, bm in ((8, 256, 16), (2, 8, 16), (32768, 256, 128), (5, 3, 64)):
        worst = min(experts, pairs) * (bm - 1) + pairs
        assert MA.max_blocks(pairs, experts, bm) * bm >= worst
    assert MA.max_blocks(1, 256, 16) == 1   # decode: one block, not one per expert


def test_triton_backend_refuses_cpu_tensors_and_auto_falls_back():
    logits = torch.randn(3, 8)
    with pytest.raises(ValueError, match="triton.*needs CUDA tensors"):
        torch_fp4.route(logits, 2, backend="triton")
    ids, w = torch_fp4.route(logits, 2)             # auto: the reference on the CPU
    ref_ids, ref_w = torch_fp4.route(logits, 2, backend="reference")
    assert torch.equal(ids, ref_ids) and torch.equal(w, ref_w)
    kw = T.moe_problem(tokens=3, hidden=32, inter=16, experts=2, top_k=1)
    with pytest.raises(ValueError, match="fused_moe: backend: 'triton' cannot run here"):
        torch_fp4.fused_moe(**kw, backend="triton")


# ---------------------------------------------------------------------------------------------
# Interpreter checks: each runs in a subprocess with TRITON_INTERPRET=1 (the variable must be set
# before triton.jit decorates the kernels).
# ---------------------------------------------------------------------------------------------
def _run_interpreted(check: str):
    env = dict(os.environ, TRITON_INTERPRET="1", TRITON_DEFAULT_FP_FUSION="0")
    code = (f"import tests.interpreted_exp as e; e.use_torch_exp(); import tests.test_triton_moe_compile as t; "
            f"t.{check}(); print('{check} ok')")
    res = subprocess.run([sys.executable, "-W", "ignore", "-c", code], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0 and f"{check} ok" in res.stdout, (res.stdout[-3000:] + res.stderr[-6000:])


@pytest.mark.parametrize("check", ["check_route_interpreted", "check_align_interpreted",
                                   "check_fused_moe_interpreted", "check_fused_moe_gpt_oss_interpreted",
                                   "check_fused_moe_tactics_interpreted"])
def test_under_interpreter(check):
    _run_interpreted(check)


def _assert_route(logits, top_k, method, renormalize=False, bias=None, n_group=None,
                  topk_group=None, rsf=1.0):
    from torch_fp4 import reference
    args = (logits, top_k, method, renormalize, bias, n_group, topk_group, rsf)
    ids, w = MR.route(*args)
    ref_ids, ref_w = reference.route(*args)
    what = f"{method} E={logits.shape[1]} k={top_k} renormalize={renormalize} n_group={n_group}"
    assert torch.equal(ids, ref_ids), f"{what}: ids differ\n{ids}\n{ref_ids}"
    rtol = MR.weight_rtol(method, logits.shape[1], top_k, renormalize)
    err = (w.double() - ref_w.double()).abs()
    ok = (err <= rtol * ref_w.double().abs()) | (w.isnan() & ref_w.isnan())
    assert ok.all(), f"{what}: weights beyond {rtol:.2e} relative: {w[~ok]} vs {ref_w[~ok]}"


def check_route_interpreted():
    g = torch.Generator().manual_seed(0)
    for e, k in ((8, 2), (12, 3), (64, 8), (160, 6), (512, 8)):
        logits = torch.randn(9, e, generator=g) * 3
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            _assert_route(logits.to(dtype), k, "softmax")
        _assert_route(logits, k, "softmax", renormalize=True)
        _assert_route(logits, k, "renormalize")
        _assert_route(logits, 1, "llama4")
    for e, n_group, topk_group, k in ((32, 8, 3, 6), (256, 8, 4, 8), (20, 4, 2, 5), (12, 12, 5, 4),
                                      (64, None, None, 8), (16, 1, 1, 4)):
        logits = torch.randn(7, e, generator=g)
        bias = torch.randn(e, generator=g) * 0.3
        _assert_route(logits, k, "deepseek_v3", bias=bias, n_group=n_group, topk_group=topk_group,
                      rsf=2.5)
        _assert_route(logits.bfloat16(), k, "deepseek_v3", bias=bias.bfloat16(), n_group=n_group,
                      topk_group=topk_group)
    # strided logits and bias
    base = torch.randn(24, 10, generator=g)
    _assert_route(base.T, 3, "softmax")
    _assert_route(base[:, :8], 2, "deepseek_v3", bias=torch.randn(16, generator=g)[::2], n_group=4,
                  topk_group=2)
    # ties go to the lower expert id; NaN and infinities order as torch.sort
    ties = torch.tensor([[0.0] * 8, [1.0, 3.0, 3.0, 0.0, 3.0, -1.0, 3.0, 2.0],
                         [-2.0, 5.0, -2.0, 5.0, -2.0, -2.0, -2.0, -2.0],
                         [0.0, -0.0, 0.0, -0.0, 1.0, -0.0, 0.0, 0.0],
                         [1.0, float("nan"), 2.0, float("inf"), 0.0, float("-inf"), 3.0, 1.0],
                         [float("-inf")] * 8])
    for method, kw in (("softmax", {}), ("softmax", {"renormalize": True}), ("renormalize", {})):
        _assert_route(ties, 3, method, **kw)
    _assert_route(ties, 1, "llama4")
    _assert_route(ties, 3, "deepseek_v3", bias=torch.zeros(8), n_group=4, topk_group=2)
    _assert_route(ties, 3, "deepseek_v3", bias=torch.zeros(8))


def _align_expected(ids: torch.Tensor, experts: int, lo: int, bm: int):
    flat = ids.reshape(-1).long()
    counts = torch.stack([(flat == lo + e).sum() for e in range(experts)])
    padded = (counts + bm - 1) // bm * bm
    start = torch.cumsum(padded, 0) - padded
    return flat, counts, padded, start


def _assert_align(ids, experts, lo, bm, zero_padding=False):
    b = MA.align(ids, experts, lo, bm, zero_padding=zero_padding)
    flat, counts, padded, start = _align_expected(ids, experts, lo, bm)
    what = f"T*k={ids.numel()} E={experts} offset={lo} block_m={bm}"
    assert torch.equal(b.counts.long(), counts), f"{what}: counts"
    assert torch.equal(b.expert_start.long(), start), f"{what}: start"
    assert torch.equal(b.expert_end.long(), start + counts), f"{what}: end"
    assert b.rows == MA.max_blocks(ids.numel(), experts, bm) * bm
    for e in range(experts):
        want = (flat == lo + e).nonzero().flatten()
        got = b.sorted_pairs[int(start[e]):int(start[e] + counts[e])].long()
        assert torch.equal(got, want), f"{what}: rows of expert {e}: {got} vs {want}"
    ends = torch.cumsum(padded, 0)
    used = int(padded.sum()) // bm
    for blk in range(b.num_blocks):
        want = int(torch.searchsorted(ends, blk * bm, right=True)) if blk < used else -1
        assert int(b.block_expert[blk]) == want, f"{what}: block {blk}: {int(b.block_expert[blk])} vs {want}"
    if zero_padding:   # every row that holds no pair reads pair 0
        holds = torch.zeros(b.rows, dtype=torch.bool)
        for e in range(experts):
            holds[int(start[e]):int(start[e] + counts[e])] = True
        assert not b.sorted_pairs[~holds].any(), f"{what}: padding entries not cleared"


def check_align_interpreted():
    g = torch.Generator().manual_seed(1)
    for tokens, k, experts, lo, bm in ((1, 8, 256, 0, 16), (5, 2, 4, 0, 16), (7, 3, 6, 2, 16),
                                       (64, 8, 16, 0, 64), (300, 4, 8, 3, 128), (100, 8, 128, 0, 16),
                                       (33, 5, 520, 10, 16), (2, 1, 1, 0, 16)):
        ids = torch.randint(max(0, lo - 2), lo + experts + 2, (tokens, k), generator=g,
                            dtype=torch.int32)
        _assert_align(ids, experts, lo, bm)
    # every pair on one expert (one chunk and several), none local, garbage ids
    _assert_align(torch.full((3, 2), 5, dtype=torch.int32), 8, 0, 16)
    _assert_align(torch.full((200, 2), 7, dtype=torch.int32), 8, 0, 16)
    _assert_align(torch.full((200, 2), 1, dtype=torch.int32), 8, 2, 64)
    _assert_align(torch.tensor([[-2**31, 2**31 - 1], [-1, 4]], dtype=torch.int32), 4, 2, 16)
    # the cleared padding the grouped-GEMM launches gather through (one chunk and several)
    _assert_align(torch.randint(0, 6, (5, 2), generator=g, dtype=torch.int32), 6, 0, 16, zero_padding=True)
    _assert_align(torch.randint(0, 8, (300, 4), generator=g, dtype=torch.int32), 8, 0, 128, zero_padding=True)
    with pytest.raises(ValueError, match="pass one of them"):
        MA.align(torch.zeros((1, 1), dtype=torch.int32), 2, 0, 16, zero=torch.zeros(2, dtype=torch.int32),
                 zero_padding=True)


def check_fused_moe_interpreted():
    from tests.test_moe import Moe, _act_scales, _gen, _routing
    from torch_fp4 import reference
    from torch_fp4.kernels import _common
    _common.POISON_OUTPUTS = True   # outputs start as NaN: an unwritten element fails
    bf16 = torch.bfloat16
    tiles = [None, MG.MoeConfig(16, True, MG.GemmTile(64, 64), MG.GemmTile(64, 64), 2),
             MG.MoeConfig(128, False, MG.GemmTile(64, 64, 8), MG.GemmTile(128, 64, 8)),
             MG.MoeConfig(32, True, MG.GemmTile(32, 128), MG.GemmTile(16, 64)),
             MG.MoeConfig(16, True, MG.GemmTile(64, 64), MG.GemmTile(64, 64), 2,
                          fused_finalize=False)]

    def same(moe, x, ids, tw, a1=None, a2=None, lo=0, out_dtype=bf16, weights=None, cfg=None, what=""):
        weights = weights if weights is not None else moe.weights()
        got = MF.fused_moe(x, *weights, ids, tw, a1, a2, lo, out_dtype, config=cfg)
        want = reference.fused_moe(x, *weights, ids, tw, a1, a2, lo, out_dtype)
        d = (got.float() - want.float()).abs()
        assert torch.equal(got, want), (f"{what} {cfg and cfg.label()}: {int((d > 0).sum())} of "
                                        f"{d.numel()} differ, max {d.max().item()}")
        return got

    moe = Moe(e=4, h=64, inter=32, seed=1)
    x = torch.randn(7, moe.h, generator=_gen(2)).to(bf16)
    ids, tw = _routing(7, moe.e, 2, 3)
    for mode in ("w4a16", "w4a4", "w4a4-a2-per-expert"):
        a1, a2 = _act_scales(x, moe, mode.endswith("expert")) if mode != "w4a16" else (None, None)
        for cfg in tiles:
            same(moe, x, ids, tw, a1, a2, cfg=cfg, what=mode)
    # fp16 activations, every output dtype
    xh = x.half()
    a1, a2 = _act_scales(xh, moe, False)
    for out_dtype in (torch.float32, torch.float16, bf16):
        same(moe, xh, ids, tw, out_dtype=out_dtype, what="fp16 w4a16")
        same(moe, xh, ids, tw, a1, a2, out_dtype=out_dtype, what="fp16 w4a4")
    # I = 48 (scale padding, K not a multiple of block_k) and H = 80
    odd = Moe(e=3, h=80, inter=48, seed=4)
    xo = torch.randn(5, odd.h, generator=_gen(5)).to(bf16)
    io, to = _routing(5, odd.e, 3, 6)
    a1, a2 = _act_scales(xo, odd, False)
    for cfg in tiles:
        same(odd, xo, io, to, cfg=cfg, what="H=80 I=48 w4a16")
        same(odd, xo, io, to, a1, a2, cfg=cfg, what="H=80 I=48 w4a4")
    # expert parallelism: experts 2 and 3 of 6 local; token 0 routed to none of them
    big = Moe(e=6, h=32, inter=16, seed=31)
    xe = torch.randn(9, big.h, generator=_gen(32)).to(bf16)
    ie, te = _routing(9, big.e, 2, 33)
    ie[0] = torch.tensor([0, 5], dtype=torch.int32)
    local = big.sliced(2, 4)
    a1 = torch_fp4.compute_global_scale(xe)
    a2 = torch.tensor([150.0, 200.0])
    for cfg in tiles[:2]:
        out = same(big, xe, ie, te, weights=local, lo=2, cfg=cfg, what="EP w4a16")
        assert (out[0] == 0).all()
        same(big, xe, ie, te, a1, a2, weights=local, lo=2, cfg=cfg, what="EP w4a4")
    # no expert parallelism (strict ids): a token with an id outside [0, E) is NaN in every
    # column, in the fused finalize, its zero-fill of unrouted tokens and the finalize kernel
    bad = ie.clone()
    bad[1, 0] = 6
    bad[2, 1] = -3
    bad[3] = torch.tensor([7, 9], dtype=torch.int32)
    stray = torch.zeros(9, dtype=torch.bool)
    stray[1:4] = True
    for cfg in (tiles[0], tiles[1], tiles[4]):
        for a1s, a2s in ((None, None), (a1, torch.tensor([96.0, 150.0, 200.0, 310.0, 64.0, 128.0]))):
            got = MF.fused_moe(xe, *big.weights(), bad, te, a1s, a2s, 0, bf16, True, config=cfg)
            want = reference.fused_moe(xe, *big.weights(), bad, te, a1s, a2s, 0, bf16, True)
            assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.isnan().all(1), stray)
            assert torch.equal(got[~stray], want[~stray]), cfg and cfg.label()
    # empty experts; every pair on one expert over several blocks and align chunks; T = 1; k = 1
    many = Moe(e=8, h=32, inter=32, seed=41)
    xm = torch.randn(70, many.h, generator=_gen(42)).to(bf16)
    one = torch.full((70, 2), 6, dtype=torch.int32)
    one[:, 1] = 3
    tm = torch.rand(70, 2, generator=_gen(43))
    a1, a2 = _act_scales(xm, many, False)
    for cfg in tiles[:3]:
        same(many, xm, one, tm, cfg=cfg, what="two experts take every pair")
        same(many, xm, one, tm, a1, a2, cfg=cfg, what="two experts take every pair w4a4")
    same(many, xm[:1].contiguous(), one[:1, :1].contiguous(), tm[:1, :1].contiguous(), what="T=1 k=1")
    same(many, xm[:1].contiguous(), one[:1, :1].contiguous(), tm[:1, :1].contiguous(),
         a1, a2, what="T=1 k=1 w4a4")


def check_fused_moe_gpt_oss_interpreted():
    """gpt-oss's features in the Triton MoE kernels (portable forms) bit for bit against the
    reference: MXFP4 experts (hidden 96: 3 scale blocks, not a multiple of 128), bf16 and fp32
    biases on both GEMMs, the clamped SwiGLU, over every tile shape (split-K FC2, whose bias joins
    in the finalize; the separate finalize kernel), with expert parallelism, W4A4 with MXFP4
    activations (x and the intermediate replaced by their MXFP4 values), and NVFP4 experts with the
    same features."""
    from torch_fp4 import formats as F, reference, testing as T
    from torch_fp4.kernels import _common
    _common.POISON_OUTPUTS = True
    bf16 = torch.bfloat16
    tiles = [None, MG.MoeConfig(16, True, MG.GemmTile(64, 64), MG.GemmTile(64, 64), 2),
             MG.MoeConfig(128, False, MG.GemmTile(64, 64, 8), MG.GemmTile(128, 64, 8)),
             MG.MoeConfig(16, True, MG.GemmTile(64, 64), MG.GemmTile(64, 64), 2, fused_finalize=False)]
    torch.manual_seed(3)
    g = T.gpt_oss_moe_problem(tokens=7, hidden=96, inter=64, experts=4, top_k=2)
    w = (g["w1"], g["w1_scale"], None, g["w2"], g["w2_scale"], None)

    def same(x, weights, ids, tw, extra, lo=0, what="", cfg=None, strict=True):
        args = (x, *weights, ids, tw, None, None, lo, bf16, strict, *extra)
        got = MF.fused_moe(*args, config=cfg)
        want = reference.fused_moe(*args)
        d = (got.float() - want.float()).abs()
        assert torch.equal(got, want), (f"{what} {cfg and cfg.label()}: {int((d > 0).sum())} of "
                                        f"{d.numel()} differ, max {d.max().item()}")

    b1, b2 = g["w1_bias"], g["w2_bias"]
    cases = [("mxfp4 bias clamped", (F.MXFP4, b1, b2, "clamped_swiglu", 1.702, 7.0)),
             ("mxfp4 fp32 bias swiglu", (F.MXFP4, b1.float(), b2.float(), "swiglu", 1.702, 7.0)),
             ("mxfp4 no bias clamped", (F.MXFP4, None, None, "clamped_swiglu", 1.5, 3.0))]
    for what, extra in cases:
        for cfg in tiles:
            same(g["x"], w, g["topk_ids"], g["topk_weights"], extra, what=what, cfg=cfg)
    # W4A4: MXFP4 activations (the launchers' last argument), every tile shape
    for cfg in tiles:
        same(g["x"], w, g["topk_ids"], g["topk_weights"], (*cases[0][1], True), what="mxfp4 w4a4", cfg=cfg)
    a16, a4 = (MF.fused_moe(g["x"], *w, g["topk_ids"], g["topk_weights"], None, None, 0, bf16, True,
                            *cases[0][1], w4a4) for w4a4 in (False, True))
    assert not torch.equal(a16, a4), "MXFP4 activations must change the result"   # they are quantized
    # expert parallelism: experts 1 and 2 of 4 local, their biases
    local = (g["w1"][1:3], g["w1_scale"][1:3], None, g["w2"][1:3], g["w2_scale"][1:3], None)
    for cfg in tiles[:2]:
        same(g["x"], local, g["topk_ids"], g["topk_weights"],
             (F.MXFP4, b1[1:3], b2[1:3], "clamped_swiglu", 1.702, 7.0), lo=1, what="EP", cfg=cfg, strict=False)
    # NVFP4 experts with biases and the clamped SwiGLU
    kw = T.moe_problem(tokens=5, hidden=64, inter=32, experts=3, w4a4=False)
    nv = (kw["w1"], kw["w1_scale"], kw["w1_global_scale"], kw["w2"], kw["w2_scale"], kw["w2_global_scale"])
    extra = (F.NVFP4, torch.randn(3, 64), torch.randn(3, 64).to(bf16), "clamped_swiglu", 1.702, 7.0)
    for cfg in tiles:
        same(kw["x"], nv, kw["topk_ids"], kw["topk_weights"], extra, what="nvfp4 bias clamped", cfg=cfg)


def check_fused_moe_tactics_interpreted():
    """Every candidate of the Triton fused_moe tactic space (kernels/triton/moe_tactics.py) for a
    decode-sized and a larger batch, through the launcher's `tactic` (as the dispatch passes it):
    bit for bit the reference, W4A16 and W4A4."""
    from tests.test_moe import Moe, _act_scales, _gen, _routing
    from torch_fp4 import reference
    from torch_fp4.kernels import _common
    from torch_fp4.kernels.triton import moe_tactics as MT
    from torch_fp4.problems import MoeProblem
    _common.POISON_OUTPUTS = True
    bf16 = torch.bfloat16
    moe = Moe(e=4, h=64, inter=128, seed=4)
    for tokens in (5, 80):
        x = torch.randn(tokens, moe.h, generator=_gen(tokens)).to(bf16)
        ids, tw = _routing(tokens, moe.e, 2, tokens + 1)
        w = moe.weights()
        for mode in ("w4a16", "w4a4"):
            a1, a2 = _act_scales(x, moe, False) if mode == "w4a4" else (None, None)
            p = MoeProblem.of(x, w[0], w[1], w[3], w[4], ids, a1, a2, 0, None, bf16)
            want = reference.fused_moe(x, *w, ids, tw, a1, a2, 0, bf16)
            cands = MT.candidates(p)
            assert cands[0] == MT.default(p) and len(cands) >= 4
            for t in cands:
                got = MF.fused_moe(x, *w, ids, tw, a1, a2, 0, bf16, tactic=t, problem=p)
                d = (got.float() - want.float()).abs()
                assert torch.equal(got, want), f"T={tokens} {mode} {t.label()}: {int((d > 0).sum())} differ"
