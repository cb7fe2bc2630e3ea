"""Problem objects (layer 1): the named facts of one validated op call, frozen.

An op's validation (torch_fp4/ops) builds its problem once per call; ops._registry.run keeps it
in the plan of that problem, so a repeated call builds nothing. It flows down unchanged:
backend requirement -> tactic space (why_not, candidates, heuristic, key) -> tuning.auto_order
-> launcher. Everything here is metadata (shapes, dtypes, layouts, the device and its compute
capability, pointer alignment), never tensor values, so a problem is valid for every call whose
tensors agree in those (ops._registry._problem_key).
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Optional

import torch
from torch._subclasses.fake_tensor import FakeTensor

from . import formats as F

NO_GPU = (0, 0)   # the capability of a device that is not a CUDA GPU


def device_capability(device: torch.device) -> tuple[int, int]:
    """(major, minor) of a CUDA device; NO_GPU for any other device."""
    if device.type != "cuda":
        return NO_GPU
    return tuple(torch.cuda.get_device_capability(device))


def alignment(t: torch.Tensor) -> int:
    """The largest power of two up to 16 that divides the tensor's data address (bytes). A fake
    tensor (tactic listings without memory) has none: its storage counts as 16-byte aligned, as a
    meta tensor's does (whose address is its storage offset)."""
    if isinstance(t, FakeTensor):
        low = t.storage_offset() * t.element_size() & 15
    else:
        low = t.data_ptr() & 15
    return 16 if low == 0 else low & -low


@dataclass(frozen=True, kw_only=True)
class Problem:
    """What every op's problem holds: where it runs."""
    device: torch.device            # the device of the op's first tensor argument
    capability: tuple[int, int]     # its compute capability (NO_GPU off CUDA)

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    def on(self, capability: tuple[int, int]) -> "Problem":
        """The same problem on a device of another compute capability (tests, what-if checks)."""
        return dataclasses.replace(self, capability=tuple(capability))


def _where(t: torch.Tensor) -> dict:
    return dict(device=t.device, capability=device_capability(t.device))


@dataclass(frozen=True, kw_only=True)
class MmProblem(Problem):
    """mm_fp4: out [m, n] = alpha * A [m, k] @ W [n, k]^T, W FP4 in `fmt`."""
    m: int
    n: int
    k: int
    fmt: F.Fp4Format
    w4a4: bool                      # a is FP4 with block scales; False: 16-bit a (W4A16)
    a_dtype: torch.dtype            # bf16/fp16 (W4A16) or the FP4 storage dtype (W4A4)
    sf_layout: F.SfLayout           # the layout of a's block scales (W4A4)
    weight_layout: F.WeightLayout   # the byte order of W
    out_dtype: torch.dtype
    has_alpha: bool                 # alpha given, or formed from the global scales (b_global_scale)
    a_align: int                    # byte alignment of a, b and b_scale (1 .. 16)
    b_align: int
    b_scale_align: int
    quantize_a: bool = False        # 16-bit a quantized in fmt on the way in (W4A4 from 16-bit a)

    @classmethod
    def of(cls, a, b, a_scale, b_scale, alpha, out_dtype, fmt, layout,
           wlayout: F.WeightLayout = F.WeightLayout.ROW, quantize_a: bool = False,
           b_global_scale=None) -> "MmProblem":
        """From validated mm_fp4 launcher arguments (b = w.T, b_scale = w_scale.T)."""
        return cls(m=a.shape[0], n=b.shape[1], k=2 * b.shape[0], fmt=fmt, w4a4=a_scale is not None,
                   a_dtype=a.dtype, sf_layout=F.SfLayout.parse(layout), weight_layout=wlayout,
                   out_dtype=out_dtype, has_alpha=alpha is not None or b_global_scale is not None,
                   a_align=alignment(a),
                   b_align=alignment(b), b_scale_align=alignment(b_scale), quantize_a=quantize_a,
                   **_where(a))

    def on_values(self) -> "MmProblem":
        """The W4A16 problem a quantize_a problem becomes once its activations are quantized
        first: bf16 exact values (fp4_quantized_values) in a fresh 16-byte aligned tensor."""
        return dataclasses.replace(self, quantize_a=False, a_dtype=torch.bfloat16, a_align=16)

    @property
    def a_itemsize(self) -> int:
        return self.a_dtype.itemsize

    @property
    def packed(self) -> bool:
        """W is in the "sm90" byte order (torch_fp4.prepack_weight)."""
        return self.weight_layout is F.WeightLayout.SM90


@dataclass(frozen=True, kw_only=True)
class GlobalScaleProblem(Problem):
    """compute_global_scale of a tensor of `numel` elements of `dtype`."""
    numel: int
    dtype: torch.dtype

    @classmethod
    def of(cls, x: torch.Tensor) -> "GlobalScaleProblem":
        return cls(numel=x.numel(), dtype=x.dtype, **_where(x))


@dataclass(frozen=True, kw_only=True)
class QuantizeProblem(Problem):
    """nvfp4_quantize / mxfp4_quantize of x [batch, rows, k] (batch None: a 2-D x)."""
    fmt: F.Fp4Format
    sf_layout: F.SfLayout
    batch: Optional[int]
    rows: int
    k: int
    x_dtype: torch.dtype

    @classmethod
    def of(cls, x: torch.Tensor, fmt: F.Fp4Format, layout: F.SfLayout) -> "QuantizeProblem":
        return cls(fmt=fmt, sf_layout=layout, batch=x.shape[0] if x.dim() == 3 else None,
                   rows=x.shape[-2], k=x.shape[-1], x_dtype=x.dtype, **_where(x))

    @property
    def numel(self) -> int:
        """Elements of x."""
        return (self.batch or 1) * self.rows * self.k


@dataclass(frozen=True, kw_only=True)
class DequantizeProblem(Problem):
    """fp4_dequantize of FP4 data [batch, rows, k / 2] (k unpacked; batch None: 2-D data)."""
    fmt: F.Fp4Format
    sf_layout: F.SfLayout
    batch: Optional[int]
    rows: int
    k: int
    has_global_scale: bool
    out_dtype: torch.dtype

    @classmethod
    def of(cls, data, scale, global_scale, fmt, layout, out_dtype) -> "DequantizeProblem":
        return cls(fmt=fmt, sf_layout=layout, batch=data.shape[0] if data.dim() == 3 else None,
                   rows=data.shape[-2], k=2 * data.shape[-1], has_global_scale=global_scale is not None,
                   out_dtype=out_dtype, **_where(data))

    @property
    def numel(self) -> int:
        """Elements of data (bytes: two FP4 values each)."""
        return (self.batch or 1) * self.rows * self.k // 2


@dataclass(frozen=True, kw_only=True)
class RouteProblem(Problem):
    """route: logits [tokens, experts] -> top_k experts per token by `method`."""
    tokens: int
    experts: int
    top_k: int
    method: str
    logits_dtype: torch.dtype

    @classmethod
    def of(cls, logits: torch.Tensor, top_k: int, method: str) -> "RouteProblem":
        return cls(tokens=logits.shape[0], experts=logits.shape[1], top_k=top_k, method=method,
                   logits_dtype=logits.dtype, **_where(logits))


@dataclass(frozen=True, kw_only=True)
class MoeProblem(Problem):
    """fused_moe: x [tokens, hidden] through top_k of `experts` FP4 experts (w1 [E, 2 inter,
    hidden / 2], w2 [E, hidden, inter / 2])."""
    tokens: int
    hidden: int
    inter: int
    experts: int
    top_k: int
    w4a4: bool                      # activations quantized (NVFP4: a1_global_scale given; MXFP4: asked)
    a2_per_expert: bool             # a2_global_scale holds one scale per expert
    x_dtype: torch.dtype
    out_dtype: torch.dtype
    local_expert_offset: int
    strict_ids: bool                # no expert parallelism: ids outside [0, E) give NaN rows
    weight_align: int = 16          # the least alignment of w1, w1_scale, w2, w2_scale (bytes, <= 16)
    fmt: F.Fp4Format = F.NVFP4      # the experts' format (MXFP4: no global scales)
    # the dtypes of w1_bias and w2_bias (None: no bias on that GEMM)
    bias_dtypes: tuple[Optional[torch.dtype], Optional[torch.dtype]] = (None, None)
    activation: str = "swiglu"      # or "clamped_swiglu" (gpt-oss) with:
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    weight_layout: F.WeightLayout = F.WeightLayout.ROW   # the byte order of every expert of w1 and w2

    @property
    def packed(self) -> bool:
        """w1 and w2 hold their experts in the "sm90" byte order (torch_fp4.prepack_weight)."""
        return self.weight_layout is F.WeightLayout.SM90

    @property
    def bias(self) -> bool:
        """Expert biases on FC1 and/or FC2."""
        return self.bias_dtypes != (None, None)

    @classmethod
    def of(cls, x, w1, w1_scale, w2, w2_scale, topk_ids, a1_global_scale, a2_global_scale,
           local_expert_offset, num_local_experts, out_dtype, fmt: F.Fp4Format = F.NVFP4,
           w1_bias=None, w2_bias=None, activation: str = "swiglu", swiglu_alpha: float = 1.702,
           swiglu_limit: float = 7.0, activations: Optional[str] = None,
           weight_layout: F.WeightLayout = F.WeightLayout.ROW) -> "MoeProblem":
        return cls(tokens=x.shape[0], hidden=x.shape[1], inter=w1.shape[1] // 2, experts=w1.shape[0],
                   top_k=topk_ids.shape[1], w4a4=a1_global_scale is not None or activations == "fp4",
                   a2_per_expert=a2_global_scale is not None and a2_global_scale.numel() > 1,
                   x_dtype=x.dtype, out_dtype=out_dtype, local_expert_offset=local_expert_offset,
                   strict_ids=local_expert_offset == 0 and num_local_experts is None,
                   weight_align=min(alignment(t) for t in (w1, w1_scale, w2, w2_scale)), fmt=fmt,
                   bias_dtypes=tuple(None if b is None else b.dtype for b in (w1_bias, w2_bias)),
                   activation=activation, swiglu_alpha=float(swiglu_alpha), swiglu_limit=float(swiglu_limit),
                   weight_layout=weight_layout, **_where(x))

    @functools.cached_property
    def gpt_oss_features(self) -> Optional[str]:
        """gpt-oss's features of this problem (MXFP4 experts, expert biases, the clamped SwiGLU),
        named, or None: the reference, triton and cuda fused_moe kernels run them (W4A4 with them:
        the reference and cuda's grouped Hopper GEMMs, and triton with MXFP4 experts); the cute-dsl
        ones only MXFP4 experts alone, in W4A4."""
        wanted = [what for what, on in (("MXFP4 experts", self.fmt is not F.NVFP4), ("expert biases", self.bias),
                                        ("the clamped SwiGLU", self.activation != "swiglu")) if on]
        return ", ".join(wanted) if wanted else None
