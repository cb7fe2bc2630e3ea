"""gpt-oss MoE experts (MXFP4) from and to their checkpoint tensors, byte for byte.

A gpt-oss checkpoint (transformers' naming) stores the experts of one MoE layer `<prefix>` (e.g.
`model.layers.0.mlp.experts`) as six tensors, E experts, hidden size H, intermediate size I:

| key                              | dtype        | shape               | what                                 |
| -------------------------------- | ------------ | ------------------- | ------------------------------------ |
| `<prefix>.gate_up_proj_blocks`   | uint8        | [E, 2I, H/32, 16]   | packed E2M1 of FC1, 32 elements/block |
| `<prefix>.gate_up_proj_scales`   | uint8 (e8m0) | [E, 2I, H/32]       | FC1 block scales 2^(byte - 127)      |
| `<prefix>.gate_up_proj_bias`     | bf16 / fp32  | [E, 2I]             | FC1 bias                             |
| `<prefix>.down_proj_blocks`      | uint8        | [E, H, I/32, 16]    | packed E2M1 of FC2                   |
| `<prefix>.down_proj_scales`      | uint8 (e8m0) | [E, H, I/32]        | FC2 block scales                     |
| `<prefix>.down_proj_bias`        | bf16 / fp32  | [E, H]               | FC2 bias                             |

Facts (transformers 4.57 `integrations/mxfp4.py` and `models/gpt_oss/modeling_gpt_oss.py`, read
for facts): a block's 16 bytes hold its 32 codes low nibble first (the even element), so the
blocks of a row, flattened, are torch_fp4's packed row [.., K/2] unchanged; the scale byte is
the UE8M0 exponent (value 2^(byte - 127)), torch_fp4's MXFP4 scale; FC1's 2I output rows
interleave the gate and the up projection (row 2j is gate j, row 2j + 1 is up j), and so does
its bias.

`load_gpt_oss_experts` returns `MXFP4Experts` in torch_fp4's expert layout: FC1 rows as
[gate; up] halves (fused_moe's w1 order), converted once here by a row permutation of the bytes
and the bias; block scales in the "128x4" layout per expert (zero padded: H = 2880 gives 90
blocks per row, padded to 92 columns). `save_gpt_oss_experts` undoes both, so save(load(t)) is
t byte for byte. Nothing is requantized. Errors name the key, what was expected and what was
found.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from . import formats as F
from .ops import _checks as C

__all__ = ["MXFP4Experts", "load_gpt_oss_experts", "save_gpt_oss_experts", "GPT_OSS_NAMES"]

_BLOCK = F.MXFP4.block_size
_LAYOUT = F.SfLayout.LAYOUT_128x4
_BIAS_DTYPES = (torch.bfloat16, torch.float32, torch.float16)
GPT_OSS_NAMES = ("gate_up_proj_blocks", "gate_up_proj_scales", "gate_up_proj_bias",
                 "down_proj_blocks", "down_proj_scales", "down_proj_bias")


@dataclass(frozen=True)
class MXFP4Experts:
    """MXFP4 experts in torch_fp4's layout: w1 uint8 [E, 2I, H/2] ([gate; up] rows), w1_scale uint8
    [E, Mp, Kp] (128x4 of [2I, H/32]), w1_bias [E, 2I] ([gate; up]), w2 uint8 [E, H, I/2],
    w2_scale uint8 [E, Mp', Kp'] (128x4 of [H, I/32]), w2_bias [E, H]."""
    w1: torch.Tensor
    w1_scale: torch.Tensor
    w1_bias: torch.Tensor
    w2: torch.Tensor
    w2_scale: torch.Tensor
    w2_bias: torch.Tensor

    @property
    def num_experts(self) -> int:
        return self.w1.shape[0]

    @property
    def hidden_size(self) -> int:
        return self.w2.shape[1]

    @property
    def intermediate_size(self) -> int:
        return self.w1.shape[1] // 2

    def dequantize(self, out_dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """(w1 [E, 2I, H], w2 [E, H, I]) as values LUT(q) * 2^(e - 127) (exact in fp32)."""
        from .ops.quantize import fp4_dequantize
        return tuple(fp4_dequantize(w, s, None, block_size=_BLOCK, sf_layout=_LAYOUT.value, out_dtype=out_dtype)
                     for w, s in ((self.w1, self.w1_scale), (self.w2, self.w2_scale)))


def _tensor(op: str, tensors: Mapping[str, torch.Tensor], key: str, what: str) -> torch.Tensor:
    if key not in tensors:
        C.fail(op, key, f"a tensor in the checkpoint ({what})", "no such key")
    return C.tensor(op, key, tensors[key])


def _check(op: str, key: str, t: torch.Tensor, dtypes: tuple, shape: tuple, what: str) -> None:
    if t.dtype not in dtypes:
        C.fail(op, key, f"dtype {' or '.join(str(d).replace('torch.', '') for d in dtypes)} ({what})",
               f"dtype {str(t.dtype).replace('torch.', '')}", TypeError)
    if tuple(t.shape) != shape:
        C.fail(op, key, f"shape {shape} ({what})", f"shape {tuple(t.shape)}")


def _halves(t: torch.Tensor) -> torch.Tensor:
    """Interleaved rows (gate j at 2j, up j at 2j + 1) along dim 1 -> [gate; up] halves."""
    return torch.cat([t[:, 0::2], t[:, 1::2]], dim=1)


def _interleaved(t: torch.Tensor) -> torch.Tensor:
    """[gate; up] halves along dim 1 -> interleaved rows (the inverse of _halves)."""
    i = t.shape[1] // 2
    return torch.stack([t[:, :i], t[:, i:]], dim=2).flatten(1, 2)


def _swizzled(scales: torch.Tensor) -> torch.Tensor:
    return F.swizzle(scales.contiguous(), _LAYOUT)


def load_gpt_oss_experts(tensors: Mapping[str, torch.Tensor], prefix: str) -> MXFP4Experts:
    """The experts `prefix` of a gpt-oss checkpoint's tensors (the module docstring's table)."""
    op = "load_gpt_oss_experts"
    key = lambda name: f"{prefix}.{name}" if prefix else name  # noqa: E731
    t = {name: _tensor(op, tensors, key(name), name.replace("_", " ")) for name in GPT_OSS_NAMES}
    b1 = t["gate_up_proj_blocks"]
    if b1.dim() != 4 or b1.shape[-1] != _BLOCK // 2 or b1.shape[1] % 2:
        C.fail(op, key("gate_up_proj_blocks"), f"uint8 [E, 2I, H/32, {_BLOCK // 2}] (packed E2M1 blocks, 2I even)",
               f"shape {tuple(b1.shape)}")
    e, two_i, hb = b1.shape[0], b1.shape[1], b1.shape[2]
    h, i = hb * _BLOCK, two_i // 2
    b2 = t["down_proj_blocks"]
    if b2.dim() != 4 or b2.shape[-1] != _BLOCK // 2 or tuple(b2.shape[:2]) != (e, h) or b2.shape[2] * _BLOCK != i:
        C.fail(op, key("down_proj_blocks"), f"uint8 [E, H, I/32, 16] = [{e}, {h}, {i // _BLOCK}, 16] "
               f"(I = {i} from gate_up_proj_blocks)", f"shape {tuple(b2.shape)}")
    if i % _BLOCK:
        C.fail(op, key("gate_up_proj_blocks"), f"an intermediate size I that is a multiple of {_BLOCK} "
               "(down_proj's blocks run along I)", f"I = {i}")
    u8 = (torch.uint8,)
    _check(op, key("gate_up_proj_blocks"), b1, u8, (e, two_i, hb, 16), "packed E2M1 blocks")
    _check(op, key("gate_up_proj_scales"), t["gate_up_proj_scales"], u8, (e, two_i, hb), "UE8M0 block scales")
    _check(op, key("gate_up_proj_bias"), t["gate_up_proj_bias"], _BIAS_DTYPES, (e, two_i), "FC1 bias")
    _check(op, key("down_proj_blocks"), b2, u8, (e, h, i // _BLOCK, 16), "packed E2M1 blocks")
    _check(op, key("down_proj_scales"), t["down_proj_scales"], u8, (e, h, i // _BLOCK), "UE8M0 block scales")
    _check(op, key("down_proj_bias"), t["down_proj_bias"], _BIAS_DTYPES, (e, h), "FC2 bias")
    w1 = _halves(b1.reshape(e, two_i, h // 2))
    s1 = _halves(t["gate_up_proj_scales"])
    return MXFP4Experts(w1.contiguous(), _swizzled(s1), _halves(t["gate_up_proj_bias"]).contiguous(),
                        b2.reshape(e, h, i // 2).contiguous(), _swizzled(t["down_proj_scales"]),
                        t["down_proj_bias"].contiguous())


def save_gpt_oss_experts(experts: MXFP4Experts, prefix: str) -> dict[str, torch.Tensor]:
    """MXFP4Experts -> the six checkpoint tensors of `prefix` (gate and up interleaved again,
    scales row-major without padding): load_gpt_oss_experts' inverse, byte for byte."""
    if not isinstance(experts, MXFP4Experts):
        C.fail("save_gpt_oss_experts", "experts", "an MXFP4Experts", type(experts).__name__, TypeError)
    e, h, i = experts.num_experts, experts.hidden_size, experts.intermediate_size
    key = lambda name: f"{prefix}.{name}" if prefix else name  # noqa: E731
    s1 = torch.stack([F.unswizzle(s, 2 * i, h // _BLOCK, _LAYOUT) for s in experts.w1_scale.view(torch.uint8)])
    s2 = torch.stack([F.unswizzle(s, h, i // _BLOCK, _LAYOUT) for s in experts.w2_scale.view(torch.uint8)])
    return {key("gate_up_proj_blocks"): _interleaved(experts.w1).reshape(e, 2 * i, h // _BLOCK, 16).contiguous(),
            key("gate_up_proj_scales"): _interleaved(s1).contiguous(),
            key("gate_up_proj_bias"): _interleaved(experts.w1_bias).contiguous(),
            key("down_proj_blocks"): experts.w2.reshape(e, h, i // _BLOCK, 16).contiguous(),
            key("down_proj_scales"): s2.contiguous(),
            key("down_proj_bias"): experts.w2_bias.clone()}
