"""Weight layouts: prepack_weight / unprepack_weight convert an FP4 weight [N, K/2] (or a stack of
experts [E, N, K/2]) between the row-major layout (as quantized and as checkpoints store it) and a
kernel layout (spec 4b)."""
from __future__ import annotations

import torch

from .. import formats as F
from ..tuning import HOPPER_MM
from . import _checks as C
from ._registry import define


def _validate(op: str, w: torch.Tensor, layout: str) -> F.WeightLayout:
    wl = F.WeightLayout.parse(layout, f"{op}: layout")
    C.dtype(op, "w", w, F.FP4_DATA_DTYPES)
    C.ndim(op, "w", w, (2, 3), "a 2-D [N, K/2] weight or a 3-D [E, N, K/2] stack of experts")
    C.contiguous(op, "w", w)
    if wl is not F.WeightLayout.ROW:
        reason = F.sm90_layout_reason(w.shape[-2], 2 * w.shape[-1])
        if reason is not None:
            C.fail(op, "w", f"a weight the {wl.value!r} layout can hold ({reason})", f"shape {tuple(w.shape)}")
    return wl


def _fresh(out: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """An op's output may not alias its input: "row" to "row" returns the bytes themselves."""
    return out.clone() if out.data_ptr() == w.data_ptr() else out


def _prepack(w: torch.Tensor, layout: str) -> torch.Tensor:
    return _fresh(F.to_weight_layout(w, _validate("prepack_weight", w, layout)), w)


def _unprepack(w: torch.Tensor, layout: str) -> torch.Tensor:
    return _fresh(F.from_weight_layout(w, _validate("unprepack_weight", w, layout)), w)


def _fake(op: str):
    def fake(w: torch.Tensor, layout: str) -> torch.Tensor:
        _validate(op, w, layout)
        return w.new_empty(w.shape, dtype=torch.uint8)
    return fake


prepack_op = define("prepack_weight", _prepack, _fake("prepack_weight"))
unprepack_op = define("unprepack_weight", _unprepack, _fake("unprepack_weight"))


def prepack_weight(w: torch.Tensor, layout: F.WeightLayout | str = "sm90") -> torch.Tensor:
    """A row-major FP4 weight [N, K/2] (uint8 or float4_e2m1fn_x2, as `nvfp4_quantize` /
    `mxfp4_quantize` return it) as a new uint8 [N, K/2] tensor in `layout`, to pass to `mm_fp4`
    with `weight_layout=layout`; or a stack of experts [E, N, K/2] (each expert alone), for
    `fused_moe(..., weight_layout=layout)`. "sm90": the register-fragment order of the cuda
    backend's Hopper GEMM (docs/NUMERICS.md section 4b; N % 128 == 0 and K % 64 == 0). The block
    scales keep their 128x4 layout. Run once, at model build or checkpoint load."""
    C.tensor("prepack_weight", "w", w)
    return prepack_op(w, F.WeightLayout.parse(layout, "prepack_weight: layout").value)


def unprepack_weight(w: torch.Tensor, layout: F.WeightLayout | str = "sm90") -> torch.Tensor:
    """Inverse of `prepack_weight`: a weight [N, K/2] (or experts [E, N, K/2]) in `layout` as a new
    row-major uint8 tensor."""
    C.tensor("unprepack_weight", "w", w)
    return unprepack_op(w, F.WeightLayout.parse(layout, "unprepack_weight: layout").value)


def preferred_weight_layout(device: torch.device | str, out_features: int, in_features: int) -> F.WeightLayout:
    """The layout in which `mm_fp4`'s `auto` backend runs a weight [out_features, in_features]
    (K = in_features) kept on `device` fastest: "sm90" on an sm_90 GPU when the shape fits
    (N % 128 == 0, K % 64 == 0; both cuda GEMMs read it, BENCHMARKS.md), "row" everywhere else.
    FP4Linear's weight_layout="auto" follows it."""
    device = torch.device(device)
    if (device.type == "cuda" and torch.cuda.get_device_capability(device) == HOPPER_MM
            and F.sm90_layout_reason(out_features, in_features) is None):
        return F.WeightLayout.SM90
    return F.WeightLayout.ROW
