"""The "sm90" weight layout (spec section 4b) on the CPU: the byte order written out here from the
spec's table, the kernel's integer decode of a word, round trips, mm_fp4 and FP4Linear with
prepacked weights equal to row-major ones bit for bit, and the errors."""
from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import torch_fp4 as t4
from torch_fp4 import formats as F
from torch_fp4 import testing as T
from torch_fp4.kernels import cute as cute_backend
from torch_fp4.kernels import triton as triton_backend
from torch_fp4.ops import moe as moe_ops

SETTINGS = settings(max_examples=25, deadline=None)
# Spec table: (row half h, K half hk, element e) -> (lowest magnitude bit, sign bit) of the code.
SPEC_BITS = {(0, 0, 0): (6, 15), (0, 0, 1): (22, 31), (0, 1, 0): (3, 0), (0, 1, 1): (19, 16),
             (1, 0, 0): (25, 2), (1, 0, 1): (9, 18), (1, 1, 0): (12, 17), (1, 1, 1): (28, 1)}
KEEP = 0x81C081C0


def _oracle_word(codes: torch.Tensor, tile_r: int, tile_s: int, t: int, j: int) -> int:
    """Word j of MMA thread t in tile (tile_r, tile_s), from the spec's prose."""
    mwg, warp, g, c = t // 128, (t // 32) % 4, (t % 32) // 4, t % 4
    r = 128 * tile_r + 64 * mwg + 16 * warp + g
    word = 0
    for (h, hk, e), (mag_at, sign_at) in SPEC_BITS.items():
        code = int(codes[r + 8 * h, 64 * tile_s + 16 * j + 8 * hk + 2 * c + e])
        word |= (code & 7) << mag_at | (code >> 3) << sign_at
    return word


def _rotl(x: int, n: int) -> int:
    return ((x << n) | (x >> (32 - n))) & 0xFFFFFFFF


def _kernel_decode(x: int) -> list[int]:
    """The four A registers the Hopper GEMM builds from a word (csrc/mm_wgmma.cu)."""
    return [x & KEEP, _rotl(x, 13) & KEEP, ((x & 0x00390039) * 0x8008) & 0xFFFFFFFF & KEEP,
            ((_rotl(x, 26) & 0x09C009C0) * 17) & 0xFFFFFFFF & KEEP]


def _placed_codes(reg: int) -> tuple[int, int]:
    return tuple(((reg >> (6 + s)) & 7) | (((reg >> (15 + s)) & 1) << 3) for s in (0, 16))


@SETTINGS
@given(tiles_n=st.integers(1, 3), tiles_k=st.integers(1, 4), seed=st.integers(0, 2**31 - 1))
def test_layout_matches_spec_and_round_trips(tiles_n, tiles_k, seed):
    n, k = 128 * tiles_n, 64 * tiles_k
    g = torch.Generator().manual_seed(seed)
    w = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=g)
    packed = t4.prepack_weight(w)
    assert packed.shape == w.shape and packed.dtype == torch.uint8
    assert torch.equal(t4.unprepack_weight(packed), w)
    codes = F.unpack_e2m1(w)
    words = packed.view(torch.int32).reshape(tiles_n, tiles_k, 256, 4)
    for _ in range(64):
        r, s_, t, j = (int(torch.randint(0, hi, (1,), generator=g)) for hi in (tiles_n, tiles_k, 256, 4))
        got = int(words[r, s_, t, j]) & 0xFFFFFFFF
        assert got == _oracle_word(codes, r, s_, t, j)
        # The kernel's decode yields the A fragment (r, K 2c..) (r+8, ..) (r, K 2c+8..) (r+8, ..).
        mwg, warp, gg, c = t // 128, (t // 32) % 4, (t % 32) // 4, t % 4
        row = 128 * r + 64 * mwg + 16 * warp + gg
        kk = 64 * s_ + 16 * j + 2 * c
        for reg, (rr, k0) in zip(_kernel_decode(got), ((row, kk), (row + 8, kk), (row, kk + 8), (row + 8, kk + 8))):
            assert _placed_codes(reg) == (int(codes[rr, k0]), int(codes[rr, k0 + 1]))


def test_row_layout_is_identity_and_float4_input_accepted():
    w = torch.randint(0, 256, (128, 32), dtype=torch.uint8)
    assert torch.equal(F.to_weight_layout(w, "row"), w)
    assert torch.equal(t4.prepack_weight(w.view(torch.float4_e2m1fn_x2)), t4.prepack_weight(w))


@pytest.mark.parametrize("fmt,w4a4", [(F.NVFP4, False), (F.NVFP4, True), (F.MXFP4, False), (F.MXFP4, True)])
def test_reference_mm_sm90_equals_row(fmt, w4a4):
    x = torch.randn(37, 192, dtype=torch.bfloat16)
    wq, ws, wgs = T.quantized_weight(256, 192, fmt)
    packed = t4.prepack_weight(wq)
    alpha = t4.nvfp4_alpha(None, wgs) if fmt is F.NVFP4 else None
    if w4a4:
        if fmt is F.NVFP4:
            gs = t4.compute_global_scale(x)
            a, s = t4.nvfp4_quantize(x, gs)
            alpha = t4.nvfp4_alpha(gs, wgs)
        else:
            a, s = t4.mxfp4_quantize(x)
    else:
        a, s = x, None
    row = t4.mm_fp4(a, wq.T, s, ws.T, alpha, torch.float32, fmt.block_size)
    sm90 = t4.mm_fp4(a, packed.T, s, ws.T, alpha, torch.float32, fmt.block_size, weight_layout="sm90")
    assert torch.equal(row, sm90)
    assert t4.supported_backends("mm_fp4", a, packed.T, s, ws.T, alpha, torch.float32, fmt.block_size,
                                 weight_layout="sm90") == [t4.Backend.REFERENCE]


def test_errors_name_the_argument():
    w = torch.randint(0, 256, (100, 32), dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"prepack_weight: w: .*N % 128 == 0 and K % 64 == 0.*N=100, K=64"):
        t4.prepack_weight(w)
    with pytest.raises(TypeError, match="prepack_weight: w: expected dtype"):
        t4.prepack_weight(torch.zeros(128, 32))
    with pytest.raises(ValueError, match="prepack_weight: layout: expected one of 'row', 'sm90', got 'sm80'"):
        t4.prepack_weight(torch.zeros(128, 32, dtype=torch.uint8), "sm80")
    with pytest.raises(ValueError, match="unprepack_weight: w: expected a 2-D .* or a 3-D"):
        t4.unprepack_weight(torch.zeros(2, 2, 128, 32, dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"prepack_weight: w: .*N=136, K=64"):
        t4.prepack_weight(torch.zeros(2, 136, 32, dtype=torch.uint8))
    wq, ws, _ = T.quantized_weight(136, 64)
    with pytest.raises(ValueError, match=r"mm_fp4: weight_layout: expected 'row' .*N=136"):
        t4.mm_fp4(torch.randn(2, 64), wq.T, None, ws.T, weight_layout="sm90")
    with pytest.raises(ValueError, match="mm_fp4: weight_layout: expected one of"):
        t4.mm_fp4(torch.randn(2, 64), wq.T, None, ws.T, weight_layout="tiled")
    with pytest.raises(ValueError, match=r"FP4Linear: weight_layout: expected 'row' for a 64 -> 136 layer"):
        t4.FP4Linear(64, 136, weight_layout="sm90")


@pytest.mark.parametrize("fmt,acts", [("nvfp4", "bf16"), ("nvfp4", "fp4"), ("mxfp4", "bf16")])
def test_fp4linear_sm90_equals_row_and_state_dict_is_row_major(fmt, acts):
    torch.manual_seed(0)
    lin = torch.nn.Linear(192, 256)
    row = t4.FP4Linear.from_linear(lin, fmt, acts)
    sm90 = t4.FP4Linear.from_linear(lin, fmt, acts, weight_layout="sm90")
    x = torch.randn(2, 5, 192)
    assert torch.equal(row(x), sm90(x))
    assert torch.equal(sm90.weight, t4.prepack_weight(row.weight))
    sd = sm90.state_dict()
    assert torch.equal(sd["weight"], row.weight)          # checkpoints hold row-major bytes
    assert torch.equal(sm90.weight, t4.prepack_weight(row.weight))   # the module is untouched
    fresh = t4.FP4Linear(192, 256, fmt=fmt, activations=acts, weight_layout="sm90")
    fresh.load_state_dict(row.state_dict())
    assert torch.equal(fresh.weight, sm90.weight) and torch.equal(fresh(x), row(x))
    row.set_weight_layout("sm90")
    assert torch.equal(row.weight, sm90.weight)
    row.set_weight_layout("row")
    assert torch.equal(row.weight, sd["weight"])


def test_fp4linear_sm90_compiles_fullgraph_and_quantize_model_config():
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 72))
    x = torch.randn(3, 128)
    ref = t4.quantize_model(copy.deepcopy(model))(x)
    t4.quantize_model(model, t4.QuantConfig(weight_layout="sm90"))
    assert [getattr(m, "weight_layout", None) for m in model] == ["sm90", None, "row"]
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    assert torch.equal(compiled(x), ref) and torch.equal(model(x), ref)


def test_auto_layout_follows_the_device(monkeypatch):
    """weight_layout="auto" (the default) keeps the weight in preferred_weight_layout of its device:
    "row" on the CPU; on a device that prefers "sm90" (an sm_90 GPU, simulated here) the bytes are
    reordered at build and again on every move; results, state_dict and explicit choices stay."""
    torch.manual_seed(2)
    lin = torch.nn.Linear(192, 256)
    row = t4.FP4Linear.from_linear(lin)
    assert row.weight_layout == "row" and row.weight_layout_choice == "auto"
    assert t4.preferred_weight_layout("cpu", 256, 192) is F.WeightLayout.ROW
    x = torch.randn(3, 192)
    prefers = {"layout": F.WeightLayout.SM90}
    monkeypatch.setattr(t4.ops, "preferred_weight_layout",
                        lambda device, n, k: prefers["layout"] if F.sm90_layout_reason(n, k) is None
                        else F.WeightLayout.ROW)
    mod = t4.FP4Linear.from_linear(lin)
    assert mod.weight_layout == "sm90" and torch.equal(mod.weight, t4.prepack_weight(row.weight))
    assert torch.equal(mod(x), row(x)) and torch.equal(mod.state_dict()["weight"], row.weight)
    assert "weight_layout=sm90" in repr(mod)
    assert t4.FP4Linear.from_linear(torch.nn.Linear(192, 72)).weight_layout == "row"  # N % 128 != 0
    pinned = t4.FP4Linear.from_linear(lin, weight_layout="row")
    prefers["layout"] = F.WeightLayout.ROW          # "moved" to a device that prefers row-major
    mod.to(torch.float32)
    pinned.to(torch.float32)
    assert mod.weight_layout == "row" and torch.equal(mod.weight, row.weight)
    assert pinned.weight_layout == "row"
    prefers["layout"] = F.WeightLayout.SM90
    mod.float()
    pinned.float()
    assert mod.weight_layout == "sm90" and pinned.weight_layout == "row"   # an explicit choice stays
    pinned.set_weight_layout("auto")
    assert pinned.weight_layout == "sm90" and torch.equal(pinned.weight, mod.weight)
    model = t4.quantize_model(torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.Linear(256, 72)))
    assert [m.weight_layout for m in model] == ["sm90", "row"]
    with pytest.raises(ValueError, match="FP4Linear: weight_layout: expected one of 'auto', 'row', 'sm90', got 'x'"):
        t4.FP4Linear(64, 128, weight_layout="x")
    with pytest.raises(ValueError, match="QuantConfig: weight_layout: expected one of 'auto'"):
        t4.quantize_model(torch.nn.Sequential(torch.nn.Linear(64, 128)), t4.QuantConfig(weight_layout="y"))


@SETTINGS
@given(experts=st.integers(1, 3), tiles_n=st.integers(1, 2), tiles_k=st.integers(1, 2), seed=st.integers(0, 2**31 - 1))
def test_expert_stack_packs_each_expert_alone(experts, tiles_n, tiles_k, seed):
    n, k = 128 * tiles_n, 64 * tiles_k
    w = torch.randint(0, 256, (experts, n, k // 2), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))
    packed = t4.prepack_weight(w)
    assert packed.shape == w.shape
    for e in range(experts):
        assert torch.equal(packed[e], t4.prepack_weight(w[e]))
    assert torch.equal(t4.unprepack_weight(packed), w)


@pytest.mark.parametrize("mode", ["w4a16", "w4a4", "mxfp4", "mxfp4_fp4", "gpt_oss"])
def test_reference_fused_moe_sm90_equals_row(mode):
    """fused_moe with every expert of w1 and w2 prepacked ("sm90") gives the row-major bits; on the
    CPU only the reference reads them (triton and cute-dsl refuse, named)."""
    if mode == "gpt_oss":
        kw = T.gpt_oss_moe_problem(hidden=128, inter=64)
    elif mode.startswith("mxfp4"):
        kw = T.moe_problem(tokens=7, hidden=128, inter=64, experts=3, w4a4=False)
        gen = torch.Generator().manual_seed(5)
        w1q, w1s = t4.mxfp4_quantize(torch.randn(3, 128, 128, generator=gen))
        w2q, w2s = t4.mxfp4_quantize(torch.randn(3, 128, 64, generator=gen))
        kw = dict(x=kw["x"], w1=w1q, w1_scale=w1s, w1_global_scale=None, w2=w2q, w2_scale=w2s, w2_global_scale=None,
                  topk_ids=kw["topk_ids"], topk_weights=kw["topk_weights"], block_size=32)
        if mode == "mxfp4_fp4":
            kw["activations"] = "fp4"
    else:
        kw = T.moe_problem(tokens=7, hidden=128, inter=64, experts=3, w4a4=mode == "w4a4")
    row = t4.fused_moe(**kw)
    packed = dict(kw, w1=t4.prepack_weight(kw["w1"]), w2=t4.prepack_weight(kw["w2"]), weight_layout="sm90")
    assert torch.equal(t4.fused_moe(**packed), row)
    assert torch.equal(torch.ops.torch_fp4.fused_moe(*_moe_schema_args(packed)), row)
    assert t4.supported_backends("fused_moe", **packed) == [t4.Backend.REFERENCE]
    # on an sm_90 / sm_100 GPU, the triton and cute-dsl kernels would refuse the layout by name
    p, _ = moe_ops._moe_problem(*_moe_schema_args(packed))
    for backend, capability in ((triton_backend, (9, 0)), (cute_backend, (10, 0))):
        on_gpu = dataclasses.replace(p, device=torch.device("cuda", 0), capability=capability)
        reason = backend.requirement("fused_moe", on_gpu)
        if mode == "gpt_oss" and backend is cute_backend:   # refused first for gpt-oss's features
            assert "do not run" in reason, reason
        else:
            assert "read row-major" in reason, reason


def _moe_schema_args(kw: dict) -> tuple:
    """fused_moe's keyword arguments in the custom op's order (reference backend)."""
    import inspect
    bound = inspect.signature(t4.fused_moe).bind(**kw)
    bound.apply_defaults()
    a = dict(bound.arguments)
    a["backend"] = int(t4.Backend.REFERENCE)
    return tuple(a.values())


def test_fused_moe_sm90_errors_name_the_argument():
    kw = T.moe_problem(tokens=3, hidden=64, inter=32, experts=2, w4a4=False)
    with pytest.raises(ValueError, match=r"fused_moe: weight_layout: expected 'row' for w1 of shape \(2, 64, 32\) .*"
                                         r"N % 128 == 0 and K % 64 == 0, got N=64, K=64"):
        t4.fused_moe(**kw, weight_layout="sm90")
    with pytest.raises(ValueError, match="fused_moe: weight_layout: expected one of 'row', 'sm90', got 'tiled'"):
        t4.fused_moe(**kw, weight_layout="tiled")


@pytest.mark.parametrize("fmt,acts", [("nvfp4", "bf16"), ("nvfp4", "fp4"), ("mxfp4", "bf16")])
def test_fp4moe_sm90_equals_row_and_state_dict_is_row_major(fmt, acts):
    """FP4MoE(weight_layout="sm90") keeps every expert prepacked, gives the row-major module's bits
    (the reference on the CPU), saves row-major bytes and loads them back into its layout."""
    torch.manual_seed(0)
    kw = dict(hidden_size=128, intermediate_size=64, num_experts=3, top_k=2, activations=acts, fmt=fmt)
    row = t4.FP4MoE(**kw)
    w1, w2 = torch.randn(3, 128, 128), torch.randn(3, 128, 64)
    row.set_weights(w1, w2)
    if acts == "fp4" and fmt == "nvfp4":
        row.calibrate(torch.randn(16, 128))
    sm90 = t4.FP4MoE(**kw, weight_layout="sm90")
    sm90.load_state_dict(row.state_dict())
    assert sm90.weight_layout == "sm90" and "weight_layout=sm90" in repr(sm90)
    assert torch.equal(sm90.w1, t4.prepack_weight(row.w1)) and torch.equal(sm90.w2, t4.prepack_weight(row.w2))
    x = torch.randn(5, 128)
    assert torch.equal(sm90(x), row(x))
    state = sm90.state_dict()
    assert torch.equal(state["w1"], row.w1) and torch.equal(state["w2"], row.w2)
    assert all(torch.equal(a, b) for a, b in zip(sm90.row_major_experts(), (row.w1, row.w2)))
    again = t4.FP4MoE(**kw, weight_layout="sm90")
    again.set_weights(w1, w2)
    assert torch.equal(again.w1, sm90.w1)
    sm90.set_weight_layout("row")
    assert torch.equal(sm90.w1, row.w1) and torch.equal(sm90(x), row(x))


def test_fp4moe_sm90_shape_errors():
    with pytest.raises(ValueError, match=r"FP4MoE: weight_layout: expected 'row' for experts w2 \[N=64, K=64\]"):
        t4.FP4MoE(64, 64, 2, 1, weight_layout="sm90")
    with pytest.raises(ValueError, match="FP4MoE: weight_layout: expected one of 'row', 'sm90'"):
        t4.FP4MoE(128, 64, 2, 1, weight_layout="tiled")
