"""NVFP4 linear weights from and to checkpoints (ModelOpt and compressed-tensors naming).

A checkpoint stores one NVFP4 linear layer `<prefix>` (weight [N, K], K a multiple of 16) as a few
tensors. Both formats store the same packed data and block scales and differ in names and in the
convention of the per-tensor scalars:

| what                      | ModelOpt (`fmt="modelopt"`)       | compressed-tensors                  |
| ------------------------- | --------------------------------- | ----------------------------------- |
| packed E2M1 data          | `weight`  uint8 [N, K/2]          | `weight_packed`  uint8 [N, K/2]     |
| block scales (linear)     | `weight_scale`  e4m3 [N, K/16]    | `weight_scale`  e4m3 [N, K/16]      |
| weight per-tensor scale   | `weight_scale_2`  fp32 scalar,    | `weight_global_scale`  fp32 [1],    |
|                           | DECODE: amax / 2688               | ENCODE: 2688 / amax                 |
| activation per-tensor     | `input_scale`  fp32 scalar,       | `input_global_scale`  fp32 [1],     |
| scale (W4A4 only)         | DECODE: amax / 2688               | ENCODE: 2688 / amax                 |

Packing in both: byte i = code[2i] | code[2i+1] << 4 (even element in the low nibble), the same as
torch_fp4 (docs/NUMERICS.md section 1). Block scales are row-major, torch_fp4's "linear" layout.

Where each fact was checked (public code, read for facts only):
- ModelOpt, NVIDIA/Model-Optimizer `modelopt/torch/quantization/qtensor/nvfp4_tensor.py`
  (`NVFP4QTensor`): the per-tensor weight factor `weights_scaling_factor_2` is
  `amax / (6 * 448)`; the block scale is `block_amax / (6 * weights_scaling_factor_2)` cast to
  e4m3; `quantize` packs `(q[..., 1::2] << 4) | q[..., 0::2]`; `dequantize` multiplies the E2M1
  value by `scale * weights_scaling_factor_2`; the activation factor is `amax / (6 * 448)` for
  FP4 (`get_activation_scaling_factor`, maxbound 6). So `weight_scale_2` and `input_scale` are
  decode factors, the reciprocals of torch_fp4's encode global scales.
- vLLM `vllm/model_executor/layers/quantization/modelopt.py` (`ModelOptNvFp4LinearMethod`):
  `weight` uint8 [N, K/2], `weight_scale` float8_e4m3fn [N, K/16], `weight_scale_2` and
  `input_scale` fp32; after loading, the GEMM alpha is `input_scale * weight_scale_2` and the
  activation quantizer uses `1 / input_scale` (both decode factors, as above). The W4A16 method's
  comment states the stored value is amax/2688, and its LM-head loader notes the checkpoint holds
  0-d scalars for `weight_scale_2` / `input_scale`; `save_nvfp4` therefore writes 0-d scalars
  for ModelOpt.
- compressed-tensors, neuralmagic/compressed-tensors
  `src/compressed_tensors/compressors/quantized_compressors/nvfp4_quantized.py`: the parameter
  names `weight_packed`, `weight_scale`, `weight_global_scale`; packing `idx[0] | idx[1] << 4`.
  `generate_gparam` (quantization utils) computes the global scale as `448 * 6 / amax`, shape [1]:
  the encode convention, equal to torch_fp4's `global_scale`.
- vLLM `.../compressed_tensors/schemes/compressed_tensors_w4a4_nvfp4.py`
  (`CompressedTensorsW4A4Fp4`): `weight_packed` uint8 [N, K/2], `weight_scale` e4m3 [N, K/16],
  `weight_global_scale` and `input_global_scale` fp32; after loading it takes `1 / stored` as the
  decode factor of both (alpha is their product) and quantizes activations with the stored
  `input_global_scale` directly: both are stored in the encode convention.

Conversions are exact:
- Layout: the checkpoint's linear [N, K/16] scales become the [Np, Kp] "128x4" layout that
  `torch_fp4.mm_fp4` / `fp4_dequantize` take (`formats.swizzle`, zero padding), and back
  (`formats.unswizzle`, padding dropped). Data and block-scale bytes are never changed.
- Scale convention: encode and decode are reciprocals, computed as RN(1/x) in fp32. RN(1/RN(1/x))
  differs from x by one ulp for about 17% of fp32 values (those with mantissa above sqrt(2);
  checked exhaustively in tests), so each format's stored scalar is kept as read and the other
  convention is derived from it:
  * loading ModelOpt keeps the decode scalars as read (`NVFP4Weight.global_decode_scale`,
    `input_decode_scale`) and sets the encode scales to RN(1/decode); saving ModelOpt writes the
    kept decode scalars back, so save(load(file)) is byte-identical.
  * loading compressed-tensors keeps the encode scalars as read (`global_scale`,
    `input_global_scale`); saving writes them back, byte-identical.
  * a weight with no kept decode scale (from `nvfp4_quantize`, or loaded from
    compressed-tensors) is saved to ModelOpt with decode = RN(1/global_scale), exactly the factor
    `fp4_dequantize` multiplies by. Loading that back gives encode' = RN(1/RN(1/gs)), which may
    differ from gs by one ulp, but RN(1/encode') == RN(1/gs) (RN(1/RN(1/RN(1/x))) == RN(1/x)
    holds for every fp32 x whose reciprocal is a normal number: exhaustive over a binade in the
    tests, and the rounding depends only on the mantissa there), so `fp4_dequantize` gives
    identical values after any chain of conversions.
  * `fp4_dequantize(w.data, w.scale, w.global_scale)` of a weight loaded from ModelOpt multiplies
    by RN(1/RN(1/decode)), which can be one fp32 ulp away from the stored decode scalar;
    `NVFP4Weight.dequantize()` multiplies by the decode scalar as stored (ModelOpt's value).

Only 2-D weights (one linear layer per prefix) are handled. Every missing, mis-shaped or
wrong-dtype tensor raises ValueError/TypeError naming the checkpoint key, what was expected and
what was found; nothing is filled in. Layers this module cannot represent are rejected, not
loaded approximately: ModelOpt NVFP4-AWQ (`pre_quant_scale`) and compressed-tensors zero points.
A layer is found by any tensor name only its format uses (`weight_scale_2`; `weight_packed`,
`weight_global_scale`, `input_global_scale`) or by float8_e4m3fn `weight_scale` block scales, so
one lacking a tensor is reported, not skipped; `weight` and `input_scale` alone mark nothing, as
unquantized and FP8 layers have them too. A file that is missing or corrupt raises an error naming
it (`load_safetensors`).

Loading and constructing read scalar values on the host (checks), so build `NVFP4Weight`s at load
time, not inside a captured CUDA graph. `safetensors` is needed only by `load_safetensors` /
`save_safetensors` (`pip install safetensors`).
"""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Optional

import torch

from . import formats as F
from .ops import _checks as C
from .ops.quantize import fp4_dequantize
from .safetensors_file import LazyFile, open_file, safetensors_module

__all__ = ["NVFP4Weight", "CHECKPOINT_FORMATS", "load_nvfp4", "save_nvfp4", "detect_format",
           "find_prefixes", "load_safetensors", "save_safetensors"]

_BLOCK = F.NVFP4.block_size
_SF_LAYOUT = F.SfLayout.LAYOUT_128x4


@dataclass(frozen=True)
class _Naming:
    data: str
    scale: str
    global_scale: str
    input_scale: str
    decode: bool               # per-tensor scalars stored in the decode convention (amax / 2688)
    scalar_shape: tuple        # shape this format writes its per-tensor scalars with
    unsupported: tuple         # (suffix, reason) of tensors whose presence we refuse to ignore
    # Names no other kind of layer has, so that one of them marks an NVFP4 layer of this format.
    # `weight` and `input_scale` are left out: unquantized and FP8 layers have them too.
    markers: tuple

    @property
    def required(self) -> tuple:
        return (self.data, self.scale, self.global_scale)

    @property
    def names(self) -> tuple:
        """Every tensor of a layer; the input scale is absent from weight-only (W4A16) layers."""
        return self.required + (self.input_scale,)


_NAMINGS = {
    "modelopt": _Naming("weight", "weight_scale", "weight_scale_2", "input_scale", True, (),
                        (("pre_quant_scale", "NVFP4-AWQ pre-quantization scaling is not supported"),),
                        ("weight_scale_2",)),
    "compressed-tensors": _Naming("weight_packed", "weight_scale", "weight_global_scale",
                                  "input_global_scale", False, (1,),
                                  (("weight_zero_point", "asymmetric (zero-point) NVFP4 is not supported"),),
                                  ("weight_packed", "weight_global_scale", "input_global_scale")),
}
CHECKPOINT_FORMATS = tuple(_NAMINGS)


def _naming(op: str, fmt: str) -> _Naming:
    found = _NAMINGS.get(fmt) if isinstance(fmt, str) else None
    if found is None:
        C.fail(op, "fmt", " or ".join(repr(f) for f in CHECKPOINT_FORMATS), repr(fmt))
    return found


def _key(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _describe(t: torch.Tensor) -> str:
    return f"dtype {str(t.dtype).replace('torch.', '')}, shape {tuple(t.shape)}"


def _scalar(op: str, name: str, t, what: str) -> torch.Tensor:
    """An fp32 tensor holding one value, shape [] or [1]."""
    C.tensor(op, name, t)
    if t.dtype != torch.float32:
        C.fail(op, name, f"dtype float32 ({what})", _describe(t), TypeError)
    if t.dim() > 1 or t.numel() != 1:
        C.fail(op, name, f"a scalar of shape [] or [1] ({what})", f"shape {tuple(t.shape)}")
    return t


def _positive_finite(op: str, name: str, t: torch.Tensor, what: str) -> None:
    """A per-tensor scale whose value and reciprocal are finite and positive (host read)."""
    value = float(t.reshape(()).item())
    recip = float(torch.reciprocal(t.reshape(())).item())
    if not (value > 0 and recip > 0 and value != float("inf") and recip != float("inf")):
        C.fail(op, name, f"a positive finite {what} with a finite reciprocal", repr(value))


# ---------------------------------------------------------------------------------------------
# The weight
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class NVFP4Weight:
    """One NVFP4 linear weight [N, K] in the form torch_fp4's ops take.

    data: float4_e2m1fn_x2 [N, K/2] (uint8 accepted and viewed). scale: float8_e4m3fn [Np, Kp] in
    the "128x4" layout (uint8 accepted and viewed), as `nvfp4_quantize` returns and `mm_fp4`
    takes (pass `w.data.T`, `w.scale.T`). global_scale: fp32 [1], encode convention (2688/amax,
    as `compute_global_scale`; [] accepted and reshaped). input_global_scale: fp32 [1] encode
    scale of the activations (W4A4 checkpoints) or None.

    global_decode_scale / input_decode_scale: the decode scalars exactly as a ModelOpt checkpoint
    stored them (amax/2688, any of shape [] or [1]), or None. When given, the matching encode scale
    must equal RN(1/decode) bit for bit. They exist so that saving back to ModelOpt writes the
    bytes that were read; see the module docstring.

    Every per-tensor scale given must be positive and finite with a finite reciprocal, as
    `load_nvfp4` requires of a checkpoint's (ValueError naming it).
    """
    data: torch.Tensor
    scale: torch.Tensor
    global_scale: torch.Tensor
    input_global_scale: Optional[torch.Tensor] = None
    global_decode_scale: Optional[torch.Tensor] = None
    input_decode_scale: Optional[torch.Tensor] = None

    def __post_init__(self):
        op = "NVFP4Weight"
        C.dtype(op, "data", self.data, F.FP4_DATA_DTYPES)
        C.ndim(op, "data", self.data, (2,), "a 2-D [N, K/2] tensor")
        C.contiguous(op, "data", self.data)
        n, k = self.data.shape[0], self.data.shape[1] * 2
        C.multiple_of(op, "data", k, _BLOCK, "K = 2 * data.shape[1] (the NVFP4 block size)")
        C.dtype(op, "scale", self.scale, (F.NVFP4.scale_dtype, torch.uint8))
        C.shape(op, "scale", self.scale, F.padded_scale_shape(n, k // _BLOCK, _SF_LAYOUT),
                f"(128x4 scales of a [{n}, {k}] weight)")
        C.contiguous(op, "scale", self.scale)
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731 (frozen)
        set_("data", self.data.view(torch.float4_e2m1fn_x2))
        set_("scale", self.scale.view(F.NVFP4.scale_dtype))
        # The per-tensor scalars pass the checks load_nvfp4 applies to a checkpoint's, the decode
        # scale first: when given, it is the value a checkpoint stored.
        for enc, dec, what in (("global_scale", "global_decode_scale", "encode global scale"),
                               ("input_global_scale", "input_decode_scale",
                                "activation encode global scale")):
            decode, encode = getattr(self, dec), getattr(self, enc)
            if decode is not None:
                _scalar(op, dec, decode, "decode scale as stored by ModelOpt")
                _positive_finite(op, dec, decode, "decode scale")
            if encode is None and enc == "input_global_scale":
                if decode is not None:
                    C.fail(op, enc, f"a tensor (RN(1/{dec})) since {dec} is given", "None")
                continue
            encode = _scalar(op, enc, encode, what).reshape(1)
            set_(enc, encode)
            _positive_finite(op, enc, encode, what)
            if decode is not None and not torch.equal(encode, torch.reciprocal(decode.reshape(1))):
                C.fail(op, enc, f"RN(1/{dec}) = {torch.reciprocal(decode).item()!r}",
                       repr(encode.item()))
        C.same_device(op, data=self.data, scale=self.scale, global_scale=self.global_scale,
                      input_global_scale=self.input_global_scale,
                      global_decode_scale=self.global_decode_scale,
                      input_decode_scale=self.input_decode_scale)

    @property
    def out_features(self) -> int:
        return self.data.shape[0]

    @property
    def in_features(self) -> int:
        return self.data.shape[1] * 2

    def linear_scale(self) -> torch.Tensor:
        """Block scales in the checkpoint layout: float8_e4m3fn [N, K/16], row-major (a copy)."""
        return F.unswizzle(self.scale, self.out_features, self.in_features // _BLOCK,
                           _SF_LAYOUT).contiguous()

    def weight_decode_scale(self) -> torch.Tensor:
        """fp32 [1] decode factor of the weight: the stored ModelOpt scalar when there is one,
        else RN(1/global_scale) (what `fp4_dequantize` multiplies by)."""
        if self.global_decode_scale is not None:
            return self.global_decode_scale.reshape(1)
        return torch.reciprocal(self.global_scale)

    def activation_decode_scale(self) -> Optional[torch.Tensor]:
        """fp32 [1] decode factor of the activations (as `weight_decode_scale`), or None."""
        if self.input_decode_scale is not None:
            return self.input_decode_scale.reshape(1)
        return None if self.input_global_scale is None else torch.reciprocal(self.input_global_scale)

    def dequantize(self, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        """[N, K] values RN_out(LUT(q) * scale * decode) with decode = `weight_decode_scale()`.

        LUT(q) * scale is exact in fp32, so this is one fp32 rounding then one to out_dtype, as
        `fp4_dequantize`; the two agree bit for bit whenever decode == RN(1/global_scale), i.e.
        always except for ModelOpt-loaded weights whose stored decode scalar is not a reciprocal
        image (then they can differ by one fp32 ulp before the final rounding).
        """
        x = fp4_dequantize(self.data, self.scale, None, block_size=_BLOCK,
                           sf_layout=_SF_LAYOUT.value, out_dtype=torch.float32)
        return (x * self.weight_decode_scale()).to(out_dtype)

    def to(self, device: torch.device | str) -> "NVFP4Weight":
        """The same weight with every tensor moved to `device`."""
        moved = {f.name: (None if getattr(self, f.name) is None else getattr(self, f.name).to(device))
                 for f in dataclasses.fields(self)}
        return NVFP4Weight(**moved)


# ---------------------------------------------------------------------------------------------
# Format detection
# ---------------------------------------------------------------------------------------------
def _name_of(key: str) -> str:
    return key.rpartition(".")[2]


def _holds_e4m3(tensors: Mapping[str, torch.Tensor], key: str) -> bool:
    """Whether tensors[key] is float8_e4m3fn (NVFP4 block scales; FP8 layers' scales are fp32).
    A file's dtype is read from its header, not from the tensor's data."""
    if isinstance(tensors, LazyFile):
        return tensors.stored_dtype(key) == "F8_E4M3"
    t = tensors[key]
    return isinstance(t, torch.Tensor) and t.dtype == F.NVFP4.scale_dtype


def _markers(keys) -> dict[str, list[str]]:
    return {fmt: [k for marker in naming.markers for k in keys if _name_of(k) == marker]
            for fmt, naming in _NAMINGS.items()}


def _marker_names() -> str:
    return " or ".join(f"{' / '.join(repr(m) for m in naming.markers)} ({fmt})"
                       for fmt, naming in _NAMINGS.items())


def _orphan_block_scales(tensors: Mapping[str, torch.Tensor], keys) -> str:
    """A hint for a file whose NVFP4 layers all lack their format's marker names."""
    orphans = [k for k in keys if _name_of(k) == "weight_scale" and _holds_e4m3(tensors, k)]
    if not orphans:
        return ""
    return (f" (but {orphans[0]!r} holds e4m3 block scales: an NVFP4 layer missing its per-tensor "
            "scale or packed data?)")


def detect_format(tensors: Mapping[str, torch.Tensor], prefix: Optional[str] = None) -> str:
    """"modelopt" if the keys (of `prefix`, when given) hold a `weight_scale_2`,
    "compressed-tensors" if they hold `weight_packed` / `weight_global_scale` /
    `input_global_scale`; ValueError when neither or both are found."""
    keys = list(tensors.keys())
    where = "tensors"
    if prefix is not None:
        keys = [k for k in keys if k.startswith(_key(prefix, ""))] if prefix else keys
        where = f"tensors of prefix {prefix!r}"
    found = {fmt: hits for fmt, hits in _markers(keys).items() if hits}
    if len(found) == 1:
        return next(iter(found))
    if not found:
        C.fail("detect_format", where, f"NVFP4 keys ending in {_marker_names()}",
               f"{len(keys)} keys, none of them{_orphan_block_scales(tensors, keys)}")
    examples = ", ".join(f"{fmt}: {hits[0]!r}" for fmt, hits in found.items())
    C.fail("detect_format", where, "the keys of one checkpoint format", f"both ({examples})")


def _layers(tensors: Mapping[str, torch.Tensor], naming: _Naming) -> dict[str, list[str]]:
    """{prefix: the names of `naming` it holds} for every prefix holding a marker name or e4m3
    block scales, so that a layer missing any one of its tensors is still found."""
    held: dict[str, list[str]] = {}
    for key in tensors.keys():
        prefix, _, name = key.rpartition(".")
        if name in naming.names:
            held.setdefault(prefix, []).append(name)
    return {p: names for p, names in held.items()
            if any(n in naming.markers or (n == naming.scale and _holds_e4m3(tensors, _key(p, n)))
                   for n in names)}


def find_prefixes(tensors: Mapping[str, torch.Tensor], fmt: str) -> list[str]:
    """Sorted prefixes of the NVFP4 linear layers of format `fmt` among the keys: every prefix
    holding one of the format's own tensor names (`_Naming.markers`) or float8_e4m3fn
    `weight_scale` block scales, complete or not (`load_nvfp4` names what an incomplete one
    lacks)."""
    return sorted(_layers(tensors, _naming("find_prefixes", fmt)))


def _require_complete(op: str, tensors: Mapping[str, torch.Tensor], fmt: str, prefix: str) -> None:
    naming = _NAMINGS[fmt]
    keys = [_key(prefix, name) for name in naming.names]
    missing = [_key(prefix, name) for name in naming.required if _key(prefix, name) not in tensors]
    if missing:
        found = ", ".join(repr(k) for k in keys if k in tensors) or "none of them"
        expected = (f"the tensors of a {fmt} NVFP4 layer: "
                    f"{', '.join(repr(k) for k in keys[:-1])} and optionally {keys[-1]!r}")
        C.fail(op, f"layer {prefix!r}", expected,
               f"no such key{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))} "
               f"(found {found})")


# ---------------------------------------------------------------------------------------------
# One layer
# ---------------------------------------------------------------------------------------------
def _get(op: str, tensors: Mapping[str, torch.Tensor], key: str, what: str,
         required: bool = True) -> Optional[torch.Tensor]:
    if key not in tensors:
        if required:
            C.fail(op, key, f"a tensor in the checkpoint ({what})", "no such key")
        return None
    return C.tensor(op, key, tensors[key])


def load_nvfp4(tensors: Mapping[str, torch.Tensor], prefix: str,
               fmt: Optional[str] = None) -> NVFP4Weight:
    """The NVFP4 linear layer `prefix` of a checkpoint's tensors -> NVFP4Weight.

    fmt: "modelopt" or "compressed-tensors" (None: `detect_format` on the prefix's keys). The
    packed data is viewed, not copied (it shares storage with `tensors[...]`); block scales are
    swizzled into a new 128x4 tensor. Per-tensor scalars: see the module docstring.
    """
    op = "load_nvfp4"
    fmt = detect_format(tensors, prefix) if fmt is None else fmt
    naming = _naming(op, fmt)
    for suffix, reason in naming.unsupported:
        key = _key(prefix, suffix)
        if key in tensors:
            C.fail(op, key, f"no such tensor ({reason})", f"a tensor ({_describe(tensors[key])})")

    data_key = _key(prefix, naming.data)
    data = _get(op, tensors, data_key, "packed E2M1 weight, uint8 [N, K/2]")
    if data.dtype not in F.FP4_DATA_DTYPES:
        C.fail(op, data_key, "dtype uint8 or float4_e2m1fn_x2 (packed E2M1 [N, K/2])",
               _describe(data), TypeError)
    if data.dim() != 2:
        C.fail(op, data_key, "a 2-D [N, K/2] tensor (packed E2M1)", _describe(data))
    n, k = data.shape[0], data.shape[1] * 2
    C.multiple_of(op, data_key, k, _BLOCK, "K = 2 * shape[1] (the NVFP4 block size)")

    scale_key = _key(prefix, naming.scale)
    scale = _get(op, tensors, scale_key, f"e4m3 block scales [N, K/16] = [{n}, {k // _BLOCK}]")
    if scale.dtype != F.NVFP4.scale_dtype:
        C.fail(op, scale_key, "dtype float8_e4m3fn (NVFP4 block scales)", _describe(scale),
               TypeError)
    if tuple(scale.shape) != (n, k // _BLOCK):
        C.fail(op, scale_key, f"shape {(n, k // _BLOCK)} (block scales [N, K/16] of the "
               f"[{n}, {k}] weight {data_key!r})", f"shape {tuple(scale.shape)}")

    convention = "decode scale amax/2688" if naming.decode else "encode scale 2688/amax"
    scalars = {}
    for role, name, required in (("weight", naming.global_scale, True),
                                 ("input", naming.input_scale, False)):
        key = _key(prefix, name)
        t = _get(op, tensors, key, f"fp32 per-tensor {role} {convention}", required)
        if t is not None:
            _scalar(op, key, t, f"per-tensor {role} {convention}")
            _positive_finite(op, key, t, convention)
        scalars[role] = t

    raw = data.contiguous()
    swizzled = F.swizzle(scale.contiguous(), _SF_LAYOUT)
    if naming.decode:
        w_dec, in_dec = scalars["weight"], scalars["input"]
        return NVFP4Weight(raw, swizzled, torch.reciprocal(w_dec.reshape(1)),
                           None if in_dec is None else torch.reciprocal(in_dec.reshape(1)),
                           global_decode_scale=w_dec, input_decode_scale=in_dec)
    return NVFP4Weight(raw, swizzled, scalars["weight"], scalars["input"])


def save_nvfp4(w: NVFP4Weight, prefix: str, fmt: str) -> dict[str, torch.Tensor]:
    """NVFP4Weight -> the checkpoint tensors of layer `prefix` in format `fmt` (a new dict).

    Data as uint8 [N, K/2] (a view), block scales as e4m3 [N, K/16] row-major (padding of the
    128x4 layout dropped), per-tensor scalars in the format's convention and shape (ModelOpt:
    0-d decode scalars, the kept ones when the weight has them; compressed-tensors: [1] encode
    scales). See the module docstring for why this is lossless.
    """
    naming = _naming("save_nvfp4", fmt)
    if not isinstance(w, NVFP4Weight):
        C.fail("save_nvfp4", "w", "an NVFP4Weight", type(w).__name__, TypeError)
    out = {_key(prefix, naming.data): w.data.view(torch.uint8),
           _key(prefix, naming.scale): w.linear_scale()}
    if naming.decode:
        weight = w.global_decode_scale
        if weight is None:
            weight = torch.reciprocal(w.global_scale).reshape(naming.scalar_shape)
        inp = w.input_decode_scale
        if inp is None and w.input_global_scale is not None:
            inp = torch.reciprocal(w.input_global_scale).reshape(naming.scalar_shape)
    else:
        weight = w.global_scale.reshape(naming.scalar_shape)
        inp = None if w.input_global_scale is None else w.input_global_scale.reshape(naming.scalar_shape)
    # Scalars are cloned so that no two saved tensors share storage (safetensors refuses that).
    out[_key(prefix, naming.global_scale)] = weight.clone()
    if inp is not None:
        out[_key(prefix, naming.input_scale)] = inp.clone()
    return out


# ---------------------------------------------------------------------------------------------
# safetensors files
# ---------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _file_named_in_errors(path) -> Iterator[None]:
    """ValueError / TypeError raised by checks on a file's tensors also name the file."""
    try:
        yield
    except (ValueError, TypeError) as e:
        if type(e) not in (ValueError, TypeError):
            raise
        raise type(e)(f"{e} (file {str(path)!r})") from e


def load_safetensors(path, prefixes: Optional[list[str]] = None, fmt: Optional[str] = None,
                     device: str = "cpu") -> dict[str, NVFP4Weight]:
    """The NVFP4 linear layers of a .safetensors file: {prefix: NVFP4Weight}.

    fmt: None detects it from the file's keys. prefixes: None loads every NVFP4 layer of that
    format (`find_prefixes`: a layer is found from any one of its format's own tensors, or from
    e4m3 block scales); otherwise exactly those. Every layer loaded must be complete: one lacking
    a required tensor (all but the input scale, absent from W4A16 layers) is a ValueError naming
    the file, the missing keys and those found. Only the tensors of the requested layers are read.

    Errors name the file: FileNotFoundError (or another OSError) when it cannot be opened,
    ValueError when it is not a valid safetensors file (empty, cut short, a header length past
    its end, a header that is not JSON; the tensor whose data is cut off, when one is), and the
    ValueError / TypeError of `detect_format` and `load_nvfp4` with the file appended.
    """
    op = "load_safetensors"
    if isinstance(prefixes, str):
        C.fail(op, "prefixes", "None or a list of layer prefixes", repr(prefixes), TypeError)
    with open_file(op, path, device) as tensors, _file_named_in_errors(path):
        fmt = detect_format(tensors) if fmt is None else fmt
        _naming(op, fmt)
        prefixes = find_prefixes(tensors, fmt) if prefixes is None else list(prefixes)
        for prefix in prefixes:
            _require_complete(op, tensors, fmt, prefix)
        return {p: load_nvfp4(tensors, p, fmt) for p in prefixes}


def save_safetensors(weights: Mapping[str, NVFP4Weight], path, fmt: str,
                     extra_tensors: Optional[Mapping[str, torch.Tensor]] = None,
                     metadata: Optional[dict[str, str]] = None) -> None:
    """Write {prefix: NVFP4Weight} (plus `extra_tensors`, e.g. unquantized layers) to a
    .safetensors file in format `fmt`. A key produced twice is a ValueError."""
    st = safetensors_module()
    op = "save_safetensors"
    _naming(op, fmt)
    out: dict[str, torch.Tensor] = {}
    for prefix, w in weights.items():
        for key, t in save_nvfp4(w, prefix, fmt).items():
            if key in out:
                C.fail(op, key, "one tensor per key", f"a second one from prefix {prefix!r}")
            out[key] = t
    for key, t in (extra_tensors or {}).items():
        if key in out:
            C.fail(op, key, "a key not written by an NVFP4 layer", "a key already written")
        out[key] = C.tensor(op, key, t).contiguous()
    # in key order: the same tensors give the same file, whatever order they were gathered in
    st.torch.save_file(dict(sorted(out.items())), str(path), metadata=metadata)
