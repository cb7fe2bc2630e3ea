"""Checkpoint interop (torch_fp4.checkpoint): ModelOpt and compressed-tensors NVFP4 layers."""
import contextlib
import json
import os
import struct

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import torch_fp4 as t4
from torch_fp4 import checkpoint as ck
from torch_fp4 import formats as F

pytest.importorskip("safetensors")
from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

FMTS = ck.CHECKPOINT_FORMATS
N, K = 200, 96          # N not a multiple of 128, K/16 = 6 not a multiple of 4: 128x4 padding on both
LUT = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


@contextlib.contextmanager
def raises(exc, *fragments):
    """pytest.raises that also checks that every fragment appears in the message."""
    with pytest.raises(exc) as info:
        yield info
    msg = str(info.value)
    for frag in fragments:
        assert frag in msg, f"{frag!r} not in {msg!r}"


def rcp(x: torch.Tensor) -> torch.Tensor:
    return torch.reciprocal(x)


def bits(t: torch.Tensor) -> torch.Tensor:
    """Raw bytes of a tensor (shape kept apart: compare shapes separately)."""
    return t.contiguous().reshape(-1).view(torch.uint8)


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b))


def not_a_reciprocal_image(start: float) -> torch.Tensor:
    """The first fp32 x >= start (stepping by one ulp) with RN(1/RN(1/x)) != x, as a [1] tensor.
    Such x exist only for mantissas above sqrt(2), so `start` must lie there."""
    x = torch.tensor([start], dtype=torch.float32)
    inf = torch.tensor([float("inf")])
    for _ in range(1000):
        if not torch.equal(rcp(rcp(x)), x):
            return x
        x = torch.nextafter(x, inf)
    raise AssertionError("no such value within 1000 ulps")


def quantized(gs=None, seed=0):
    """(NVFP4Weight with an activation scale, the bf16 source) of a random [N, K] weight."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(N, K, generator=g).to(torch.bfloat16)
    x = (3 * torch.randn(16, K, generator=g)).to(torch.bfloat16)
    gs = t4.compute_global_scale(w) if gs is None else gs
    data, scale = t4.nvfp4_quantize(w, gs)
    return ck.NVFP4Weight(data, scale, gs, t4.compute_global_scale(x)), w


def dequant(w: ck.NVFP4Weight, out_dtype=torch.bfloat16) -> torch.Tensor:
    return t4.fp4_dequantize(w.data, w.scale, w.global_scale, out_dtype=out_dtype)


def read_file(path) -> dict:
    with safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


# --- the reciprocal facts the module relies on ----------------------------------------------------
def test_reciprocal_of_reciprocal_image_is_stable():
    """Exhaustive over the fp32 binade [1, 2) (the reciprocal's rounding depends only on the
    mantissa for normal inputs with normal reciprocals): RN(1/RN(1/x)) != x for about 17% of x,
    all with mantissa above sqrt(2) (so the decode <-> encode conversion is not an involution),
    but f(f(f(x))) == f(x) for f = RN(1/.) everywhere, which is why fp4_dequantize is unchanged by
    any chain of format conversions."""
    x = torch.arange(0x3F800000, 0x40000000, dtype=torch.int64).to(torch.int32).view(torch.float32)
    r = rcp(x)
    rr = rcp(r)
    assert (rr != x).sum().item() > 1_000_000                  # ~17% of mantissas move by one ulp
    assert (rr.view(torch.int32) - x.view(torch.int32)).abs().max().item() == 1
    assert torch.equal(rr[x < 2 ** 0.5], x[x < 2 ** 0.5])
    assert torch.equal(rcp(rr), r)


# --- round trips through files ------------------------------------------------------------------
@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("gs_kind", ["amax", "not_reciprocal_image"])
def test_roundtrip_through_file(tmp_path, fmt, gs_kind):
    gs = None
    if gs_kind == "not_reciprocal_image":   # a gs whose decode RN(1/gs) does not map back to gs
        # 1.25 * gs moves the mantissa of this gs (about 1.21) above sqrt(2).
        gs = not_a_reciprocal_image(1.25 * t4.compute_global_scale(quantized()[1]).item())
    w, _ = quantized(gs)
    w2, _ = quantized(seed=1)
    path = tmp_path / "model.safetensors"
    ck.save_safetensors({"model.layers.0.mlp.down_proj": w, "model.layers.1.mlp.down_proj": w2},
                        path, fmt)
    loaded = ck.load_safetensors(path)          # format detected from the keys
    assert sorted(loaded) == ["model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj"]
    for orig, back in ((w, loaded["model.layers.0.mlp.down_proj"]),
                       (w2, loaded["model.layers.1.mlp.down_proj"])):
        assert back.data.dtype == torch.float4_e2m1fn_x2 and same_bytes(back.data, orig.data)
        assert back.scale.dtype == torch.float8_e4m3fn and same_bytes(back.scale, orig.scale)
        if fmt == "compressed-tensors":          # encode scales stored: identical
            assert same_bytes(back.global_scale, orig.global_scale)
            assert same_bytes(back.input_global_scale, orig.input_global_scale)
            assert back.global_decode_scale is None
        else:                                    # decode scales stored: RN(1/gs), kept as read
            assert same_bytes(back.global_decode_scale, rcp(orig.global_scale).reshape(()))
            assert same_bytes(back.input_decode_scale, rcp(orig.input_global_scale).reshape(()))
            assert torch.equal(back.global_scale, rcp(rcp(orig.global_scale)))
            # The decode factor fp4_dequantize uses is unchanged even when gs itself is not.
            assert torch.equal(rcp(back.global_scale), rcp(orig.global_scale))
        for out_dtype in (torch.bfloat16, torch.float32):
            assert torch.equal(dequant(back, out_dtype), dequant(orig, out_dtype))
        assert torch.equal(back.dequantize(), dequant(orig))
    if fmt == "modelopt" and gs_kind == "not_reciprocal_image":   # the case is really exercised
        assert not torch.equal(loaded["model.layers.0.mlp.down_proj"].global_scale, w.global_scale)


@pytest.mark.parametrize("fmt", FMTS)
def test_save_of_load_is_byte_identical(tmp_path, fmt):
    w, _ = quantized(not_a_reciprocal_image(800.0))
    first, second = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    ck.save_safetensors({"lin": w}, first, fmt)
    ck.save_safetensors(ck.load_safetensors(first, fmt=fmt), second, fmt)
    assert first.read_bytes() == second.read_bytes()


def test_format_conversion_chain(tmp_path):
    """CT -> ModelOpt -> CT -> ModelOpt: data, block scales and dequantized values never change,
    and the two ModelOpt files are byte-identical (f(f(f(x))) == f(x))."""
    w, _ = quantized(not_a_reciprocal_image(800.0))
    ref = dequant(w)
    paths = [tmp_path / f"{i}.safetensors" for i in range(4)]
    cur = {"lin": w}
    for path, fmt in zip(paths, ["compressed-tensors", "modelopt", "compressed-tensors", "modelopt"]):
        ck.save_safetensors(cur, path, fmt)
        cur = ck.load_safetensors(path)
        assert same_bytes(cur["lin"].data, w.data) and same_bytes(cur["lin"].scale, w.scale)
        assert torch.equal(dequant(cur["lin"]), ref)
    assert paths[1].read_bytes() == paths[3].read_bytes()


def test_loaded_weight_runs_in_mm_fp4(tmp_path):
    w, _ = quantized()
    x = torch.randn(8, K).to(torch.bfloat16)
    ck.save_safetensors({"lin": w}, tmp_path / "m.safetensors", "modelopt")
    back = ck.load_safetensors(tmp_path / "m.safetensors")["lin"]
    y = t4.mm_fp4(x, back.data.T, None, back.scale.T, alpha=t4.nvfp4_alpha(None, back.global_scale))
    y_ref = t4.mm_fp4(x, w.data.T, None, w.scale.T, alpha=t4.nvfp4_alpha(None, w.global_scale))
    assert torch.equal(y, y_ref)


# --- hand-built checkpoints ---------------------------------------------------------------------
def hand_built(fmt: str, n=40, k=64, seed=3, per_tensor=None):
    """A checkpoint dict built without torch_fp4: random codes and finite positive e4m3 scales."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    scale = torch.randint(1, 0x7F, (n, k // 16), generator=g, dtype=torch.uint8).view(torch.float8_e4m3fn)
    if fmt == "modelopt":
        tensors = {"m.q_proj.weight": packed, "m.q_proj.weight_scale": scale,
                   "m.q_proj.weight_scale_2": per_tensor.reshape(()),
                   "m.q_proj.input_scale": torch.tensor(0.0123, dtype=torch.float32)}
    else:
        tensors = {"m.q_proj.weight_packed": packed, "m.q_proj.weight_scale": scale,
                   "m.q_proj.weight_global_scale": per_tensor.reshape(1),
                   "m.q_proj.input_global_scale": torch.tensor([81.25], dtype=torch.float32)}
    lut_times_scale = LUT[codes.long()].reshape(n, k // 16, 16) * scale.float().unsqueeze(-1)
    return tensors, lut_times_scale.reshape(n, k)      # LUT * scale: exact in fp32


def bf16_ulps_apart(a: torch.Tensor, b: torch.Tensor) -> int:
    """Max distance in bf16 ulps (ordered integer view; +0 and -0 are the same point)."""
    def ordered(t):
        i = t.view(torch.int16).to(torch.int32)
        return torch.where(i < 0, -(i & 0x7FFF), i)
    return (ordered(a) - ordered(b)).abs().max().item()


def test_modelopt_hand_built(tmp_path):
    """ModelOpt's value LUT * weight_scale * weight_scale_2 versus torch_fp4.

    weight_scale_2 = d is picked so that RN(1/RN(1/d)) != d. Loading keeps d and sets the encode
    scale gs = RN(1/d). fp4_dequantize(gs) multiplies the exact LUT * scale by RN(1/gs), one fp32
    ulp away from d, so its fp32 results can differ from RN(LUT * scale * d) by a couple of fp32
    ulps; rounding to bf16 is monotonic and a bf16 ulp is 2^16 fp32 ulps, so the bf16 results are
    equal or adjacent (within 1 bf16 ulp; adjacent only when the exact value lies within an fp32
    ulp or two of a bf16 rounding boundary, so almost always equal). NVFP4Weight.dequantize()
    multiplies by d as stored and is exact.
    """
    d = not_a_reciprocal_image(4.3 / 2688)                 # amax 4.3, ModelOpt's amax / (6 * 448)
    tensors, lut_scale = hand_built("modelopt", per_tensor=d)
    ref32 = lut_scale * d                                  # one rounding: RN(LUT * scale * d)
    ref = ref32.to(torch.bfloat16)

    assert ck.detect_format(tensors) == "modelopt"
    w = ck.load_nvfp4(tensors, "m.q_proj")
    assert torch.equal(w.global_scale, rcp(d)) and same_bytes(w.global_decode_scale, d.reshape(()))
    assert torch.equal(w.input_global_scale, rcp(torch.tensor([0.0123])))
    assert same_bytes(w.linear_scale(), tensors["m.q_proj.weight_scale"])

    assert torch.equal(w.dequantize(), ref)
    assert torch.equal(w.dequantize(torch.float32), ref32)
    ours32 = dequant(w, torch.float32)
    assert not torch.equal(ours32, ref32)                  # the 1-ulp decode factor shows up ...
    assert torch.equal(ours32, lut_scale * rcp(rcp(d)))    # ... and is the only difference
    assert bf16_ulps_apart(dequant(w), ref) <= 1

    # save(load(x)) gives back the very tensors (bytes, dtypes, shapes), and the same file.
    saved = ck.save_nvfp4(w, "m.q_proj", "modelopt")
    assert saved.keys() == tensors.keys()
    assert all(same_bytes(saved[key], tensors[key]) for key in tensors)
    save_file(tensors, str(tmp_path / "orig.safetensors"))
    ck.save_safetensors(ck.load_safetensors(tmp_path / "orig.safetensors"),
                        tmp_path / "again.safetensors", "modelopt")
    assert (tmp_path / "orig.safetensors").read_bytes() == (tmp_path / "again.safetensors").read_bytes()


def test_compressed_tensors_hand_built(tmp_path):
    """CT's value LUT * weight_scale / weight_global_scale: torch_fp4 multiplies by RN(1/gs)."""
    gs = torch.tensor([2688 / 3.1], dtype=torch.float32)
    tensors, lut_scale = hand_built("compressed-tensors", per_tensor=gs)
    assert ck.detect_format(tensors) == "compressed-tensors"
    w = ck.load_nvfp4(tensors, "m.q_proj")
    assert same_bytes(w.global_scale, gs) and w.global_decode_scale is None
    assert torch.equal(dequant(w), (lut_scale * rcp(gs)).to(torch.bfloat16))
    saved = ck.save_nvfp4(w, "m.q_proj", "compressed-tensors")
    assert saved.keys() == tensors.keys()
    assert all(same_bytes(saved[key], tensors[key]) for key in tensors)


def test_weight_only_checkpoint_has_no_input_scale():
    tensors, _ = hand_built("modelopt", per_tensor=torch.tensor([0.001]))
    del tensors["m.q_proj.input_scale"]
    w = ck.load_nvfp4(tensors, "m.q_proj")
    assert w.input_global_scale is None and w.input_decode_scale is None
    assert "m.q_proj.input_scale" not in ck.save_nvfp4(w, "m.q_proj", "modelopt")


# --- detection ----------------------------------------------------------------------------------
def test_detect_format_and_prefixes():
    mo, _ = hand_built("modelopt", per_tensor=torch.tensor([0.001]))
    ct, _ = hand_built("compressed-tensors", per_tensor=torch.tensor([448.0]))
    extra = {"model.embed_tokens.weight": torch.zeros(4, 4), "lm_head.weight": torch.zeros(4, 4)}
    assert ck.detect_format({**mo, **extra}) == "modelopt"
    assert ck.detect_format({**ct, **extra}) == "compressed-tensors"
    assert ck.detect_format({**ct, **extra}, prefix="m.q_proj") == "compressed-tensors"
    assert ck.find_prefixes({**mo, **extra}, "modelopt") == ["m.q_proj"]
    assert ck.find_prefixes({**ct, **extra}, "compressed-tensors") == ["m.q_proj"]
    bare = {k.removeprefix("m.q_proj."): v for k, v in mo.items()}   # a layer at the root
    assert ck.find_prefixes(bare, "modelopt") == [""]
    assert ck.load_nvfp4(bare, "").out_features == 40
    with raises(ValueError, "detect_format", "weight_scale_2", "weight_packed", "2 keys, none"):
        ck.detect_format(extra)
    renamed = {k.replace("m.q_proj", "m.k_proj"): v for k, v in ct.items()}
    with raises(ValueError, "detect_format", "both", "m.q_proj.weight_scale_2", "m.k_proj.weight_packed"):
        ck.detect_format({**mo, **renamed})


# --- errors -------------------------------------------------------------------------------------
def modelopt_dict():
    return hand_built("modelopt", per_tensor=torch.tensor([0.001]))[0]


@pytest.mark.parametrize("fmt", FMTS)
def test_missing_weight_scale(fmt):
    tensors, _ = hand_built(fmt, per_tensor=torch.tensor([0.5]))
    del tensors["m.q_proj.weight_scale"]
    with raises(ValueError, "load_nvfp4", "m.q_proj.weight_scale", "e4m3 block scales [N, K/16] = [40, 4]",
                "no such key"):
        ck.load_nvfp4(tensors, "m.q_proj", fmt)


@pytest.mark.parametrize("fmt,key", [("modelopt", "m.q_proj.weight_scale_2"),
                                     ("modelopt", "m.q_proj.weight"),
                                     ("compressed-tensors", "m.q_proj.weight_global_scale"),
                                     ("compressed-tensors", "m.q_proj.weight_packed")])
def test_missing_other_tensors(fmt, key):
    tensors, _ = hand_built(fmt, per_tensor=torch.tensor([0.5]))
    del tensors[key]
    with raises(ValueError, key, "no such key"):
        ck.load_nvfp4(tensors, "m.q_proj", fmt)


def test_misshaped_scale():
    tensors = modelopt_dict()
    tensors["m.q_proj.weight_scale"] = tensors["m.q_proj.weight_scale"][:, :3].contiguous()
    with raises(ValueError, "m.q_proj.weight_scale", "expected shape (40, 4)", "got shape (40, 3)"):
        ck.load_nvfp4(tensors, "m.q_proj")
    tensors = modelopt_dict()     # a 128x4-swizzled scale is not what checkpoints store
    tensors["m.q_proj.weight_scale"] = F.swizzle(tensors["m.q_proj.weight_scale"], "128x4")
    with raises(ValueError, "m.q_proj.weight_scale", "(40, 4)", "got shape (128, 4)"):
        ck.load_nvfp4(tensors, "m.q_proj")


@pytest.mark.parametrize("key,bad,expected", [
    ("m.q_proj.weight_scale", torch.ones(40, 4, dtype=torch.bfloat16), "float8_e4m3fn"),
    ("m.q_proj.weight_scale", torch.ones(40, 4, dtype=torch.uint8), "float8_e4m3fn"),
    ("m.q_proj.weight", torch.ones(40, 32, dtype=torch.int8), "uint8 or float4_e2m1fn_x2"),
    ("m.q_proj.weight_scale_2", torch.tensor(0.001, dtype=torch.bfloat16), "float32"),
    ("m.q_proj.input_scale", torch.tensor(0.01, dtype=torch.float64), "float32"),
])
def test_wrong_dtype(key, bad, expected):
    tensors = modelopt_dict()
    tensors[key] = bad
    with raises(TypeError, key, expected, str(bad.dtype).replace("torch.", "")):
        ck.load_nvfp4(tensors, "m.q_proj")


def test_k_not_multiple_of_16():
    tensors = modelopt_dict()
    tensors["m.q_proj.weight"] = torch.zeros(40, 20, dtype=torch.uint8)   # K = 40
    with raises(ValueError, "m.q_proj.weight", "multiple of 16", "40"):
        ck.load_nvfp4(tensors, "m.q_proj")
    with raises(ValueError, "data", "multiple of 16", "40"):
        ck.NVFP4Weight(torch.zeros(40, 20, dtype=torch.uint8), torch.zeros(128, 4, dtype=torch.uint8),
                       torch.ones(1))


def test_bad_per_tensor_scales():
    for value in (0.0, -1.0, float("inf"), float("nan"), 1e-45):   # 1e-45: reciprocal overflows
        tensors = modelopt_dict()
        tensors["m.q_proj.weight_scale_2"] = torch.tensor(value)
        with raises(ValueError, "m.q_proj.weight_scale_2", "positive finite"):
            ck.load_nvfp4(tensors, "m.q_proj")
    tensors = modelopt_dict()
    tensors["m.q_proj.input_scale"] = torch.tensor([0.1, 0.2])
    with raises(ValueError, "m.q_proj.input_scale", "scalar of shape [] or [1]", "(2,)"):
        ck.load_nvfp4(tensors, "m.q_proj")
    tensors = modelopt_dict()
    tensors["m.q_proj.weight"] = torch.zeros(2, 40, 32, dtype=torch.uint8)
    with raises(ValueError, "m.q_proj.weight", "2-D [N, K/2]", "(2, 40, 32)"):
        ck.load_nvfp4(tensors, "m.q_proj")


def test_unsupported_variants_are_refused():
    tensors = modelopt_dict()
    tensors["m.q_proj.pre_quant_scale"] = torch.ones(64, dtype=torch.bfloat16)
    with raises(ValueError, "m.q_proj.pre_quant_scale", "AWQ"):
        ck.load_nvfp4(tensors, "m.q_proj")
    tensors, _ = hand_built("compressed-tensors", per_tensor=torch.tensor([448.0]))
    tensors["m.q_proj.weight_zero_point"] = torch.zeros(40, 4, dtype=torch.int8)
    with raises(ValueError, "m.q_proj.weight_zero_point", "zero-point"):
        ck.load_nvfp4(tensors, "m.q_proj")
    with raises(ValueError, "fmt", "'modelopt' or 'compressed-tensors'", "'gguf'"):
        ck.load_nvfp4(modelopt_dict(), "m.q_proj", "gguf")
    with raises(ValueError, "fmt", "'gguf'"):
        ck.save_nvfp4(quantized()[0], "x", "gguf")


def test_weight_consistency_checks():
    w, _ = quantized()
    wrong = rcp(w.global_scale) * 2
    with raises(ValueError, "NVFP4Weight", "global_scale", "RN(1/global_decode_scale)"):
        ck.NVFP4Weight(w.data, w.scale, w.global_scale, global_decode_scale=wrong)
    with raises(ValueError, "input_global_scale", "None"):
        ck.NVFP4Weight(w.data, w.scale, w.global_scale, input_decode_scale=torch.tensor(0.5))
    with raises(ValueError, "scale", "(256, 8)", "(200, 6)"):
        ck.NVFP4Weight(w.data, w.linear_scale(), w.global_scale)


@pytest.mark.parametrize("name", ["global_scale", "input_global_scale", "global_decode_scale",
                                  "input_decode_scale"])
@pytest.mark.parametrize("value", [0.0, -1.0, float("inf"), float("nan"), 1e-45])
def test_weight_refuses_per_tensor_scales_the_loader_refuses(name, value):
    """The constructor checks what load_nvfp4 checks (test_bad_per_tensor_scales): 1e-45 is
    positive but its reciprocal overflows. A bad decode scale comes with its own reciprocal as
    the encode scale, so only its value is wrong."""
    w, _ = quantized()
    bad = torch.tensor([value])
    scales = dict(global_scale=w.global_scale, input_global_scale=w.input_global_scale)
    if name == "global_decode_scale":
        scales.update(global_decode_scale=bad, global_scale=rcp(bad))
    elif name == "input_decode_scale":
        scales.update(input_decode_scale=bad, input_global_scale=rcp(bad))
    else:
        scales[name] = bad
    with raises(ValueError, f"NVFP4Weight: {name}: expected a positive finite ",
                f"with a finite reciprocal, got {float(bad)!r}"):
        ck.NVFP4Weight(w.data, w.scale, **scales)


def test_requested_prefix_must_be_complete(tmp_path):
    w, _ = quantized()
    path = tmp_path / "m.safetensors"
    ck.save_safetensors({"a": w}, path, "compressed-tensors",
                        extra_tensors={"b.weight": torch.zeros(2, 2)})
    assert set(read_file(path)) == {"a.weight_packed", "a.weight_scale", "a.weight_global_scale",
                                    "a.input_global_scale", "b.weight"}
    with raises(ValueError, "b.weight_packed", "no such key"):
        ck.load_safetensors(path, prefixes=["a", "b"])
    with raises(ValueError, "a.weight_packed", "a key not written by an NVFP4 layer"):
        ck.save_safetensors({"a": w}, tmp_path / "x.safetensors", "compressed-tensors",
                            extra_tensors={"a.weight_packed": torch.zeros(1)})
    assert not os.path.exists(tmp_path / "x.safetensors")


# --- incomplete layers in files -------------------------------------------------------------------
REQUIRED = {"modelopt": ("weight", "weight_scale", "weight_scale_2"),
            "compressed-tensors": ("weight_packed", "weight_scale", "weight_global_scale")}
INCOMPLETE = [(fmt, name) for fmt in FMTS for name in REQUIRED[fmt]]


def two_layers(fmt: str) -> dict:
    """Layers m.k_proj (complete) and m.q_proj of format `fmt`, hand-built."""
    q, _ = hand_built(fmt, per_tensor=torch.tensor([0.5]))
    k, _ = hand_built(fmt, seed=4, per_tensor=torch.tensor([0.25]))
    return {**q, **{key.replace("m.q_proj", "m.k_proj"): t for key, t in k.items()}}


def present_keys(tensors: dict, prefix: str) -> list:
    return [key for key in tensors if key.startswith(prefix + ".")]


@pytest.mark.parametrize("explicit", [False, True], ids=["prefixes=None", "prefixes=[...]"])
@pytest.mark.parametrize("fmt,name", INCOMPLETE)
def test_incomplete_layer_in_file_is_an_error(tmp_path, fmt, name, explicit):
    tensors = two_layers(fmt)
    del tensors[f"m.q_proj.{name}"]
    path = tmp_path / "m.safetensors"
    save_file(tensors, str(path))
    assert ck.find_prefixes(tensors, fmt) == ["m.k_proj", "m.q_proj"]
    prefixes = ["m.k_proj", "m.q_proj"] if explicit else None
    with raises(ValueError, "load_safetensors", str(path), "layer 'm.q_proj'",
                f"no such key 'm.q_proj.{name}'", *present_keys(tensors, "m.q_proj")):
        ck.load_safetensors(path, prefixes=prefixes)


@pytest.mark.parametrize("fmt,name", INCOMPLETE)
def test_lone_incomplete_layer_is_an_error(tmp_path, fmt, name):
    """The only layer of a file lacks a tensor: with fmt given it is reported as incomplete;
    detected, the error names the file and the layer's keys either way."""
    tensors, _ = hand_built(fmt, per_tensor=torch.tensor([0.5]))
    del tensors[f"m.q_proj.{name}"]
    path = tmp_path / "m.safetensors"
    save_file(tensors, str(path))
    with raises(ValueError, str(path), f"no such key 'm.q_proj.{name}'"):
        ck.load_safetensors(path, fmt=fmt)
    with raises(ValueError, str(path), "m.q_proj."):
        ck.load_safetensors(path)


def test_layer_without_marker_names_its_block_scales(tmp_path):
    tensors = modelopt_dict()
    del tensors["m.q_proj.weight_scale_2"]
    path = tmp_path / "m.safetensors"
    save_file(tensors, str(path))
    with raises(ValueError, "detect_format", str(path), "'m.q_proj.weight_scale' holds e4m3 block scales"):
        ck.load_safetensors(path)


@pytest.mark.parametrize("fmt", FMTS)
def test_weight_only_layers_need_no_input_scale(tmp_path, fmt):
    tensors = {k: t for k, t in two_layers(fmt).items() if "input" not in k}
    path = tmp_path / "m.safetensors"
    save_file(tensors, str(path))
    loaded = ck.load_safetensors(path)
    assert sorted(loaded) == ["m.k_proj", "m.q_proj"]
    assert all(w.input_global_scale is None for w in loaded.values())


@pytest.mark.parametrize("fmt", FMTS)
def test_unquantized_and_fp8_layers_are_not_nvfp4_layers(tmp_path, fmt):
    """`weight`, fp32 `weight_scale` and `input_scale` are what bf16 and FP8 layers have too."""
    tensors, _ = hand_built(fmt, per_tensor=torch.tensor([0.5]))
    others = {"lm_head.weight": torch.zeros(8, 64, dtype=torch.bfloat16),
              "m.o_proj.weight": torch.zeros(8, 64).to(torch.float8_e4m3fn),
              "m.o_proj.weight_scale": torch.tensor(0.5),
              "m.o_proj.input_scale": torch.tensor(0.25)}
    path = tmp_path / "m.safetensors"
    save_file({**tensors, **others}, str(path))
    assert sorted(ck.load_safetensors(path)) == ["m.q_proj"]


@pytest.mark.parametrize("fmt", FMTS)
def test_complete_multi_layer_file_loads_identically(tmp_path, fmt):
    weights = {f"model.layers.{i}.mlp.up_proj": quantized(seed=i)[0] for i in range(3)}
    path = tmp_path / "m.safetensors"
    ck.save_safetensors(weights, path, fmt,
                        extra_tensors={"lm_head.weight": torch.zeros(4, 4, dtype=torch.bfloat16)})
    loaded = ck.load_safetensors(path)
    in_memory = read_file(path)
    assert sorted(loaded) == sorted(weights)
    for prefix, w in weights.items():
        ref = ck.load_nvfp4(in_memory, prefix, fmt)
        for field in ("data", "scale", "global_scale", "input_global_scale", "global_decode_scale",
                      "input_decode_scale"):
            got, want = getattr(loaded[prefix], field), getattr(ref, field)
            assert (got is None and want is None) or same_bytes(got, want), field
        assert torch.equal(dequant(loaded[prefix]), dequant(w))


# --- unreadable files -----------------------------------------------------------------------------
def valid_file(tmp_path) -> tuple:
    """(bytes of a valid one-layer file, header length, {key: (start, end) byte offsets in it})."""
    path = tmp_path / "valid.safetensors"
    ck.save_safetensors({"lin": quantized()[0]}, path, "modelopt")
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    spans = {k: (8 + n + v["data_offsets"][0], 8 + n + v["data_offsets"][1])
             for k, v in header.items() if k != "__metadata__"}
    return raw, n, spans


def corrupt(raw: bytes, n: int, spans: dict, case: str) -> tuple:
    """(bytes of a corrupt file, fragments its error must hold besides the path)."""
    start, end = spans["lin.weight"]
    if case == "empty":
        return b"", ("empty file",)
    if case == "cut_in_data":
        return raw[:(start + end) // 2], ("cut short", "'lin.weight'")
    if case == "cut_in_header":
        return raw[:8 + n // 2], ("header length", "cut short inside its header")
    if case == "header_length_past_end":
        return struct.pack("<Q", len(raw)) + raw[8:], ("header length", f"{len(raw)} bytes")
    assert case == "bad_json"
    return raw[:8] + b"{not json".ljust(n) + raw[8 + n:], ("not valid JSON",)


@pytest.mark.parametrize("case", ["empty", "cut_in_data", "cut_in_header", "header_length_past_end",
                                  "bad_json"])
def test_corrupt_file_is_a_clear_error(tmp_path, case):
    data, fragments = corrupt(*valid_file(tmp_path), case)
    path = tmp_path / "bad.safetensors"
    path.write_bytes(data)
    with raises(ValueError, "load_safetensors", "expected a valid .safetensors file", str(path),
                *fragments):
        ck.load_safetensors(path)


def test_missing_file_names_the_path(tmp_path):
    path = tmp_path / "absent.safetensors"
    with raises(FileNotFoundError, "load_safetensors", "no such file", str(path)):
        ck.load_safetensors(path)


def test_unreadable_tensor_names_file_and_key(tmp_path, monkeypatch):
    import safetensors
    path = tmp_path / "m.safetensors"
    ck.save_safetensors({"lin": quantized()[0]}, path, "modelopt")
    real_open = safetensors.safe_open

    class FailingReads:
        def __init__(self, *args, **kwargs):
            self._handle = real_open(*args, **kwargs)

        def __enter__(self):
            self._handle.__enter__()
            return self

        def __exit__(self, *exc):
            return self._handle.__exit__(*exc)

        def __getattr__(self, name):
            return getattr(self._handle, name)

        def get_tensor(self, key):
            raise safetensors.SafetensorError("simulated read failure")

    monkeypatch.setattr(safetensors, "safe_open", FailingReads)
    with raises(ValueError, "lin.weight: ", "simulated read failure", str(path)):
        ck.load_safetensors(path)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.floats(0, 1, exclude_max=True))
def test_truncated_file_never_loads(tmp_path, cut):
    """A file cut at any byte is an error naming it, and the cut tensor when the cut is in data."""
    raw, n, spans = valid_file(tmp_path)
    size = int(cut * len(raw))
    path = tmp_path / "cut.safetensors"
    path.write_bytes(raw[:size])
    cut_keys = [k for k, (start, end) in sorted(spans.items(), key=lambda kv: kv[1][1]) if end > size]
    fragments = (f"{cut_keys[0]!r}",) if size >= 8 + n else ()
    with raises(ValueError, str(path), *fragments):
        ck.load_safetensors(path)


def test_prefixes_given_as_one_string_is_an_error(tmp_path):
    w, _ = quantized()
    ck.save_safetensors({"lin": w}, tmp_path / "m.safetensors", "modelopt")
    with pytest.raises(TypeError, match="load_safetensors: prefixes: expected None or a list"):
        ck.load_safetensors(tmp_path / "m.safetensors", prefixes="lin")
