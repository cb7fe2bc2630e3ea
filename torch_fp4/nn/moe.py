"""FP4MoE: a mixture of NVFP4 experts with a dense router (route + fused_moe), and
FP4SparseMoeBlock, the drop-in for a transformers sparse-MoE block (torch_fp4.hf)."""
from __future__ import annotations

import copy
from typing import Optional, Sequence, Union

import torch

from .. import formats as F
from .. import hf, ops
from ..ops import _checks as C
from ..ops.moe import ACTIVATIONS, _validate_route
from ..reference.moe import silu_mul
from ._common import _COMPUTE_DTYPES, _activations, _input, _size, _widen, keep_state_row_major


ExpertWeights = Union[torch.Tensor, Sequence]


def _dense_weight(where: str, item) -> torch.Tensor:
    """One expert matrix from an nn.Linear (no bias) or a 2-D tensor."""
    if isinstance(item, torch.nn.Linear):
        if item.bias is not None:
            raise ValueError(f"FP4MoE: {where}: expected an nn.Linear without bias (FP4 experts "
                             f"have none), got one with bias")
        item = item.weight
    if not isinstance(item, torch.Tensor) or item.dim() != 2:
        got = f"shape {tuple(item.shape)}" if isinstance(item, torch.Tensor) else type(item).__name__
        raise TypeError(f"FP4MoE: {where}: expected an nn.Linear or a 2-D tensor, got {got}")
    return item.detach()


def _stack_experts(name: str, experts: ExpertWeights, pairs: bool) -> torch.Tensor:
    """[E, rows, cols] from a 3-D tensor or a sequence of per-expert weights. With `pairs` (w1) an
    entry may also be a (gate, up) pair, stacked as [gate; up] rows."""
    if isinstance(experts, torch.Tensor):
        if experts.dim() != 3:
            raise ValueError(f"FP4MoE: {name}: expected a 3-D [E, rows, cols] tensor, "
                             f"got shape {tuple(experts.shape)}")
        return experts.detach()
    if not isinstance(experts, (list, tuple, torch.nn.ModuleList)) or not len(experts):
        raise TypeError(f"FP4MoE: {name}: expected a 3-D tensor or a non-empty sequence of "
                        f"per-expert weights, got {type(experts).__name__}")
    mats = []
    for e, item in enumerate(experts):
        if pairs and isinstance(item, (list, tuple)):
            if len(item) != 2:
                raise ValueError(f"FP4MoE: {name}[{e}]: expected a (gate, up) pair, "
                                 f"got {len(item)} items")
            gate, up = (_dense_weight(f"{name}[{e}][{i}]", m) for i, m in enumerate(item))
            if gate.shape != up.shape:
                raise ValueError(f"FP4MoE: {name}[{e}]: expected gate and up of one shape, got "
                                 f"{tuple(gate.shape)} and {tuple(up.shape)}")
            mats.append(torch.cat((gate, up)))
        else:
            mats.append(_dense_weight(f"{name}[{e}]", item))
        if mats[-1].shape != mats[0].shape:
            raise ValueError(f"FP4MoE: {name}[{e}]: expected shape {tuple(mats[0].shape)} (that of "
                             f"expert 0), got {tuple(mats[-1].shape)}")
    return torch.stack(mats)


class FP4MoE(torch.nn.Module):
    """Mixture of NVFP4 experts with a dense router: a drop-in MoE MLP.

    forward(x [..., H]) routes each token with `router` (an nn.Linear H -> E kept in its own
    dtype) and `torch_fp4.route`, then runs `torch_fp4.fused_moe`: out = sum_j w_j *
    down(silu(gate) * up) over the top_k experts. Experts live in buffers: w1 [E, 2I, H/2]
    ([gate; up] rows) and w2 [E, H, I/2] as FP4 bytes, their 128x4 block scales, and one encode
    global scale per expert (as fp32 bit patterns, so dtype casts never round them).
    activations="bf16" runs W4A16; "fp4" runs W4A4: NVFP4 experts with fixed activation global
    scales (a1 [1] for the input, a2 [E] for the intermediate activation), set by `calibrate` or
    given; MXFP4 experts (fmt="mxfp4") with MXFP4 activations, which need no scales.
    Routing config (top_k, method, renormalize, and for "deepseek_v3" the correction bias
    `routing_bias`, n_group, topk_group, routed_scaling_factor) is that of `torch_fp4.route`.
    Traces with torch.compile(fullgraph=True) and has no host synchronization.

    x: [..., H] (at least 1-D) of dtype bf16, fp16, fp32 or fp64, rounded to `compute_dtype`
    for the router and the experts; the output has x's dtype, as FP4Linear's (fp32: the fused
    MoE's fp32 output, fp64: that output widened). Other dtypes are a TypeError.
    weight_layout: the byte order w1 and w2 keep, "row" (default) or "sm90" (every expert
    prepacked: `fused_moe(..., weight_layout="sm90")`, read by the cuda backend on sm_90 and the
    reference; 2I and H multiples of 128, H and I of 64). On an H200 "sm90" experts ran fused_moe
    7-17% faster from 16 routed rows per expert and 0.96-1.07x the row-major speed at decode sizes
    (up to 4% slower on DeepSeek-V3's decode; BENCHMARKS.md), so the default stays "row".
    state_dict holds the row-major bytes in either layout and loading
    converts them; `set_weight_layout` converts in place.
    """

    def __init__(self, hidden_size: int, intermediate_size: int, num_experts: int, top_k: int,
                 method: str = "softmax", renormalize: bool = False, n_group: Optional[int] = None,
                 topk_group: Optional[int] = None, routed_scaling_factor: float = 1.0,
                 activations: str = "bf16", compute_dtype: torch.dtype = torch.bfloat16,
                 router_bias: bool = False, device: Optional[torch.device] = None, *, fmt: str = "nvfp4",
                 expert_bias: bool = False, bias_dtype: torch.dtype = torch.bfloat16,
                 activation: str = "swiglu", swiglu_alpha: float = 1.702, swiglu_limit: float = 7.0,
                 weight_layout: str = "row"):
        super().__init__()
        _activations("FP4MoE", activations)
        if fmt not in ("nvfp4", "mxfp4"):
            C.fail("FP4MoE", "fmt", "'nvfp4' or 'mxfp4'", repr(fmt))
        if activation not in ACTIVATIONS:
            C.fail("FP4MoE", "activation", " or ".join(map(repr, ACTIVATIONS)), repr(activation))
        if bias_dtype not in (torch.bfloat16, torch.float32):
            raise TypeError(f"FP4MoE: bias_dtype: expected torch.bfloat16 or torch.float32, got {bias_dtype}")
        block = F.NVFP4.block_size if fmt == "nvfp4" else F.MXFP4.block_size
        if compute_dtype not in _COMPUTE_DTYPES:
            raise TypeError(f"FP4MoE: compute_dtype: expected torch.bfloat16 or torch.float16, "
                            f"got {compute_dtype}")
        for name, value in (("hidden_size", hidden_size), ("intermediate_size", intermediate_size)):
            C.integer("FP4MoE", name, value)
            if value <= 0 or value % block:
                C.fail("FP4MoE", name, f"a positive multiple of {block} (the {fmt.upper()} block size)", value)
        _size("FP4MoE", "num_experts", num_experts)
        meta = torch.device("meta")
        _validate_route(torch.empty(0, num_experts, device=meta), top_k, method, renormalize,
                        torch.empty(num_experts, device=meta) if method == "deepseek_v3" else None,
                        n_group, topk_group, float(routed_scaling_factor), "auto", op="FP4MoE")
        h, i, e = hidden_size, intermediate_size, num_experts
        self.hidden_size, self.intermediate_size, self.num_experts = h, i, e
        self.top_k, self.method, self.renormalize = top_k, method, renormalize
        self.n_group, self.topk_group = n_group, topk_group
        self.routed_scaling_factor = float(routed_scaling_factor)
        self.activations, self.compute_dtype = activations, compute_dtype
        self.fmt, self.activation = fmt, activation
        self.swiglu_alpha, self.swiglu_limit = float(swiglu_alpha), float(swiglu_limit)
        self.router = torch.nn.Linear(h, e, bias=router_bias, device=device,
                                      dtype=compute_dtype).requires_grad_(False)
        u8 = dict(dtype=torch.uint8, device=device)
        self.register_buffer("w1", torch.zeros(e, 2 * i, h // 2, **u8))
        self.register_buffer("w1_scale", torch.zeros(e, *F.padded_scale_shape(2 * i, h // block, "128x4"), **u8))
        self.register_buffer("w2", torch.zeros(e, h, i // 2, **u8))
        self.register_buffer("w2_scale", torch.zeros(e, *F.padded_scale_shape(h, i // block, "128x4"), **u8))
        if expert_bias:   # gpt-oss: added to FC1's and FC2's fp32 results (docs/NUMERICS.md section 6)
            self.register_buffer("w1_bias", torch.zeros(e, 2 * i, dtype=bias_dtype, device=device))
            self.register_buffer("w2_bias", torch.zeros(e, h, dtype=bias_dtype, device=device))
        ones = torch.ones(e, device=device).view(torch.int32)
        for name in ("w1_global_scale_bits", "w2_global_scale_bits", "a2_global_scale_bits"):
            self.register_buffer(name, ones.clone())
        self.register_buffer("a1_global_scale_bits", ones[:1].clone())
        if method == "deepseek_v3":
            self.register_buffer("routing_bias_bits", torch.zeros(e, device=device).view(torch.int32))
        self.weight_layout = "row"
        self.set_weight_layout(weight_layout)
        keep_state_row_major(self, ("w1", "w2"))

    # -- construction --------------------------------------------------------------------------
    @classmethod
    def _for_router(cls, router: torch.nn.Linear, intermediate_size: int, top_k: int, method: str,
                    renormalize: bool, routing_bias, n_group, topk_group, routed_scaling_factor,
                    activations: str, compute_dtype: torch.dtype, **experts) -> "FP4MoE":
        if not isinstance(router, torch.nn.Linear):
            raise TypeError(f"FP4MoE: router: expected an nn.Linear (hidden -> experts), "
                            f"got {type(router).__name__}")
        if method == "deepseek_v3" and routing_bias is None:
            raise ValueError("FP4MoE: routing_bias: expected a [E] correction-bias tensor for "
                             "method 'deepseek_v3', got None")
        if method != "deepseek_v3" and routing_bias is not None:
            raise ValueError(f"FP4MoE: routing_bias: expected None for method {method!r} (only "
                             f"'deepseek_v3' uses it), got a tensor")
        mod = cls(router.in_features, intermediate_size, router.out_features, top_k, method,
                  renormalize, n_group, topk_group, routed_scaling_factor, activations,
                  compute_dtype, router.bias is not None, router.weight.device, **experts)
        mod.router = copy.deepcopy(router).requires_grad_(False)
        if routing_bias is not None:
            if tuple(routing_bias.shape) != (mod.num_experts,):
                raise ValueError(f"FP4MoE: routing_bias: expected shape ({mod.num_experts},), "
                                 f"got {tuple(routing_bias.shape)}")
            mod.routing_bias_bits.copy_(routing_bias.detach().float().view(torch.int32))
        return mod

    @classmethod
    def from_experts(cls, router: torch.nn.Linear, w1: ExpertWeights, w2: ExpertWeights, *,
                     top_k: int, method: str = "softmax", renormalize: bool = False,
                     routing_bias: Optional[torch.Tensor] = None, n_group: Optional[int] = None,
                     topk_group: Optional[int] = None, routed_scaling_factor: float = 1.0,
                     activations: str = "bf16", calibration: Optional[torch.Tensor] = None,
                     compute_dtype: torch.dtype = torch.bfloat16) -> "FP4MoE":
        """Quantize dense experts to NVFP4 (one global scale per expert matrix).

        router: nn.Linear H -> E, copied (frozen: FP4MoE is inference-only), kept dense.
        w1: [E, 2I, H] ([gate; up] rows), or a sequence of E entries, each an nn.Linear or
        tensor [2I, H] or a (gate, up) pair of nn.Linear / tensors [I, H].
        w2: [E, H, I], or a sequence of E nn.Linear / tensors [H, I].
        W4A4 (activations="fp4") needs `calibration`, sample inputs [..., H] to `calibrate` on.
        """
        w1, w2 = _stack_experts("w1", w1, pairs=True), _stack_experts("w2", w2, pairs=False)
        if activations == "fp4" and calibration is None:
            raise ValueError("FP4MoE.from_experts: calibration: expected sample inputs [..., H] "
                             "for activations='fp4' (W4A4 needs activation global scales), got None")
        mod = cls._for_router(router, w1.shape[1] // 2, top_k, method, renormalize, routing_bias,
                              n_group, topk_group, routed_scaling_factor, activations, compute_dtype)
        mod.set_weights(w1, w2)
        if calibration is not None:
            mod.calibrate(calibration)
        return mod

    @classmethod
    def from_quantized(cls, router: torch.nn.Linear, w1: torch.Tensor, w1_scale: torch.Tensor,
                       w1_global_scale: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor,
                       w2_global_scale: torch.Tensor, *, top_k: int, method: str = "softmax",
                       renormalize: bool = False, routing_bias: Optional[torch.Tensor] = None,
                       n_group: Optional[int] = None, topk_group: Optional[int] = None,
                       routed_scaling_factor: float = 1.0, activations: str = "bf16",
                       a1_global_scale: Optional[torch.Tensor] = None,
                       a2_global_scale: Optional[torch.Tensor] = None,
                       calibration: Optional[torch.Tensor] = None, sf_layout: str = "128x4",
                       compute_dtype: torch.dtype = torch.bfloat16) -> "FP4MoE":
        """An FP4MoE from NVFP4 experts: w1 [E, 2I, H/2], w2 [E, H, I/2] (1-byte FP4 data), their
        block scales in `sf_layout` ("128x4" [E, Mp, Kp], or "linear" [E, rows, cols/16] as
        checkpoints store them), encode global scales [E]. W4A4 takes a1_global_scale [1] and
        a2_global_scale [1] or [E], or `calibration` inputs to measure them."""
        if not isinstance(w1, torch.Tensor) or w1.dim() != 3:
            raise ValueError(f"FP4MoE.from_quantized: w1: expected a 3-D [E, 2I, H/2] tensor, got "
                             f"{tuple(w1.shape) if isinstance(w1, torch.Tensor) else type(w1).__name__}")
        given = (a1_global_scale is not None, a2_global_scale is not None)
        if activations == "fp4" and calibration is None and given != (True, True):
            raise ValueError("FP4MoE.from_quantized: a1_global_scale: expected a1_global_scale and "
                             "a2_global_scale, or calibration inputs, for activations='fp4', got "
                             f"a1_global_scale={'set' if given[0] else None}, "
                             f"a2_global_scale={'set' if given[1] else None}")
        mod = cls._for_router(router, w1.shape[1] // 2, top_k, method, renormalize, routing_bias,
                              n_group, topk_group, routed_scaling_factor, activations, compute_dtype)
        mod.set_quantized(w1, w1_scale, w1_global_scale, w2, w2_scale, w2_global_scale, sf_layout)
        if calibration is not None:
            mod.calibrate(calibration)
        elif any(given):
            mod.set_activation_scales(a1_global_scale, a2_global_scale)
        return mod

    @classmethod
    def from_gpt_oss(cls, router: torch.nn.Linear, experts, *, top_k: int = 4,
                     compute_dtype: torch.dtype = torch.bfloat16, activations: str = "bf16") -> "FP4MoE":
        """gpt-oss's MoE layer: its router (nn.Linear H -> E with bias; top-k on the logits, then
        softmax over the k) and its MXFP4 experts as torch_fp4.gpt_oss_checkpoint loads them
        (MXFP4Experts: [gate; up] halves, 128x4 scales, biases), bytes copied unchanged; biases
        on both GEMMs and the clamped SwiGLU (alpha 1.702, limit 7). activations "bf16" (W4A16)
        or "fp4" (W4A4: MXFP4 activations)."""
        mod = cls._for_router(router, experts.intermediate_size, top_k, "renormalize", False, None, None, None,
                              1.0, activations, compute_dtype, fmt="mxfp4", expert_bias=True,
                              bias_dtype=experts.w1_bias.dtype, activation="clamped_swiglu")
        for name in ("w1", "w1_scale", "w2", "w2_scale", "w1_bias", "w2_bias"):
            src, buf = getattr(experts, name), getattr(mod, name)
            if tuple(src.shape) != tuple(buf.shape):
                raise ValueError(f"FP4MoE.from_gpt_oss: experts.{name}: expected shape {tuple(buf.shape)} "
                                 f"(router {router.in_features} -> {router.out_features}), got {tuple(src.shape)}")
            buf.copy_(src.view(buf.dtype) if src.element_size() == buf.element_size() else src)
        return mod

    def set_weights(self, w1: torch.Tensor, w2: torch.Tensor) -> None:
        """Quantize dense experts w1 [E, 2I, H] and w2 [E, H, I] into this module."""
        e, h, i = self.num_experts, self.hidden_size, self.intermediate_size
        for name, w, want in (("w1", w1, (e, 2 * i, h)), ("w2", w2, (e, h, i))):
            if tuple(w.shape) != want:
                raise ValueError(f"FP4MoE.set_weights: {name}: expected shape {want}, "
                                 f"got {tuple(w.shape)}")
        for w, data, scale, gs in ((w1, self.w1, self.w1_scale, self.w1_global_scale_bits),
                                   (w2, self.w2, self.w2_scale, self.w2_global_scale_bits)):
            w = w.detach().to(self.w1.device).contiguous()
            if w.dtype not in (torch.bfloat16, torch.float16, torch.float32):
                w = w.float()
            if self.fmt == "mxfp4":
                q, s = ops.mxfp4_quantize(w)
                data.copy_(F.to_weight_layout(q, self.weight_layout))
                scale.copy_(s.view(torch.uint8))
                continue
            g = torch.cat([ops.compute_global_scale(m) for m in w])
            q, s = ops.nvfp4_quantize(w, g)
            data.copy_(F.to_weight_layout(q, self.weight_layout))
            scale.copy_(s.view(torch.uint8))
            gs.copy_(g.view(torch.int32))

    def set_quantized(self, w1, w1_scale, w1_global_scale, w2, w2_scale, w2_global_scale,
                      sf_layout: str = "128x4") -> None:
        """Load NVFP4 experts (see from_quantized); bytes are copied unchanged."""
        if sf_layout not in ("128x4", "linear"):
            raise ValueError(f"FP4MoE.set_quantized: sf_layout: expected '128x4' or 'linear', "
                             f"got {sf_layout!r}")
        e, h, i = self.num_experts, self.hidden_size, self.intermediate_size
        linear = sf_layout == "linear"
        for name, t, buf in (("w1", w1, self.w1), ("w2", w2, self.w2),
                             ("w1_scale", w1_scale, self.w1_scale), ("w2_scale", w2_scale, self.w2_scale)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"FP4MoE.set_quantized: {name}: expected a torch.Tensor, "
                                f"got {type(t).__name__}")
            want = tuple(buf.shape)
            if linear and name == "w1_scale":
                want = (e, 2 * i, h // 16)
            elif linear and name == "w2_scale":
                want = (e, h, i // 16)
            if tuple(t.shape) != want or t.element_size() != 1:
                raise ValueError(f"FP4MoE.set_quantized: {name}: expected a 1-byte tensor of shape "
                                 f"{want}, got {t.dtype} {tuple(t.shape)}")
            if linear and name.endswith("scale"):
                t = F.swizzle(t, F.SfLayout.LAYOUT_128x4)
            elif name in ("w1", "w2"):
                t = F.to_weight_layout(t.to(buf.device).contiguous(), self.weight_layout)
            buf.copy_(t.view(torch.uint8))
        for name, t, buf in (("w1_global_scale", w1_global_scale, self.w1_global_scale_bits),
                             ("w2_global_scale", w2_global_scale, self.w2_global_scale_bits)):
            self._set_scale(name, t, buf, (self.num_experts,))

    def set_weight_layout(self, weight_layout: str) -> None:
        """Keep w1 and w2 in `weight_layout` ("row" or "sm90") from now on (their bytes are
        converted in place)."""
        layout = F.WeightLayout.parse(weight_layout, "FP4MoE: weight_layout").value
        if layout != "row":
            for name, n, k in (("w1", 2 * self.intermediate_size, self.hidden_size),
                               ("w2", self.hidden_size, self.intermediate_size)):
                reason = F.sm90_layout_reason(n, k)
                if reason is not None:
                    C.fail("FP4MoE", "weight_layout", f"'row' for experts {name} [N={n}, K={k}] ({reason})",
                           repr(layout))
        if layout == self.weight_layout:
            return
        for buf in (self.w1, self.w2):
            if buf.device.type != "meta":  # meta tensors hold no bytes to reorder
                buf.copy_(F.to_weight_layout(F.from_weight_layout(buf, self.weight_layout), layout))
        self.weight_layout = layout

    def row_major_experts(self) -> tuple[torch.Tensor, torch.Tensor]:
        """w1 [E, 2I, H/2] and w2 [E, H, I/2] as row-major FP4 bytes (what checkpoints store)."""
        return F.from_weight_layout(self.w1, self.weight_layout), F.from_weight_layout(self.w2, self.weight_layout)

    def set_activation_scales(self, a1_global_scale: torch.Tensor, a2_global_scale: torch.Tensor) -> None:
        """Fixed W4A4 activation encode global scales: a1 [1] (input), a2 [1] or [E]."""
        self._set_scale("a1_global_scale", a1_global_scale, self.a1_global_scale_bits, (1,))
        self._set_scale("a2_global_scale", a2_global_scale, self.a2_global_scale_bits,
                        (1, self.num_experts))

    @staticmethod
    def _set_scale(name: str, t, buf: torch.Tensor, sizes: tuple) -> None:
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or t.numel() not in sizes:
            got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
            want = " or ".join(f"[{n}]" for n in sizes)
            raise ValueError(f"FP4MoE: {name}: expected an fp32 tensor of shape {want}, got {got}")
        C.positive_finite_scales("FP4MoE", name, t)
        buf.copy_(t.reshape(-1).to(buf.device).view(torch.int32).expand(buf.numel()))

    @torch.no_grad()
    def calibrate(self, x: torch.Tensor) -> None:
        """Set the W4A4 activation global scales from sample inputs x [..., H] (eager; reads
        maxima on the host): a1 = 2688 / amax(x); a2[e] = 2688 / amax of expert e's intermediate
        activation silu(gate) * up (W4A16 experts) over the tokens routed to it (all tokens when
        none is)."""
        if self.fmt != "nvfp4":
            raise ValueError("FP4MoE.calibrate: sets NVFP4 W4A4 activation scales; this module's "
                             f"{self.fmt.upper()} experts need none (MXFP4 activations have no global scale)")
        a = self._tokens(x, "calibrate")[0]
        ids = self._route(a)[0]
        a2 = []
        for e in range(self.num_experts):
            h = ops.mm_fp4(a, self.w1[e].T, None, self.w1_scale[e].T,
                           F.nvfp4_alpha(None, self.w1_global_scale[e:e + 1]), torch.bfloat16,
                           weight_layout=self.weight_layout)
            act = silu_mul(h)
            hit = (ids == e).any(-1)
            a2.append(ops.compute_global_scale(act[hit] if bool(hit.any()) else act))
        self.set_activation_scales(ops.compute_global_scale(a), torch.cat(a2))

    # -- views used by forward -----------------------------------------------------------------
    def _f32(self, name: str) -> torch.Tensor:
        return getattr(self, name + "_bits").view(torch.float32)

    w1_global_scale = property(lambda self: self._f32("w1_global_scale"))
    w2_global_scale = property(lambda self: self._f32("w2_global_scale"))
    a1_global_scale = property(lambda self: self._f32("a1_global_scale"))
    a2_global_scale = property(lambda self: self._f32("a2_global_scale"))
    routing_bias = property(lambda self: self._f32("routing_bias") if self.method == "deepseek_v3" else None)

    def _tokens(self, x: torch.Tensor, where: str) -> tuple[torch.Tensor, torch.dtype]:
        """x as [T, H] tokens in compute_dtype, and the dtype the ops should write."""
        out_dtype = _input(f"FP4MoE.{where}", x, self.hidden_size, "hidden_size")
        return x.reshape(-1, self.hidden_size).to(self.compute_dtype).contiguous(), out_dtype

    def _route(self, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.router(a.to(self.router.weight.dtype))
        return ops.route(logits, self.top_k, self.method, self.renormalize, self.routing_bias,
                         self.n_group, self.topk_group, self.routed_scaling_factor)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, out_dtype = self._tokens(x, "forward")
        return self._experts(x, a, *self._route(a), out_dtype)

    def _experts(self, x: torch.Tensor, a: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
                 out_dtype: torch.dtype) -> torch.Tensor:
        """fused_moe of the tokens a [T, H] over the routed experts, shaped and typed as x."""
        y = ops.fused_moe(a, *self._expert_args(), ids, weights, out_dtype=out_dtype, **self._expert_kwargs())
        return _widen(y.reshape(*x.shape[:-1], self.hidden_size), x.dtype)

    def _expert_args(self) -> tuple:
        """fused_moe's expert operands: (w1, w1_scale, w1_global_scale, w2, w2_scale,
        w2_global_scale), with no global scales for MXFP4 experts."""
        if self.fmt == "mxfp4":
            return (self.w1, self.w1_scale.view(torch.float8_e8m0fnu), None, self.w2,
                    self.w2_scale.view(torch.float8_e8m0fnu), None)
        return self.w1, self.w1_scale, self.w1_global_scale, self.w2, self.w2_scale, self.w2_global_scale

    def _expert_kwargs(self) -> dict:
        """fused_moe's keyword arguments of this module's experts (activation scales, format,
        biases, activation)."""
        kw = {}
        if self.activations == "fp4" and self.fmt == "nvfp4":
            kw = dict(a1_global_scale=self.a1_global_scale, a2_global_scale=self.a2_global_scale)
        if self.fmt == "mxfp4":
            kw = dict(block_size=F.MXFP4.block_size, activations=self.activations)
        if "w1_bias" in self._buffers:
            kw.update(w1_bias=self.w1_bias, w2_bias=self.w2_bias)
        if self.activation != "swiglu":
            kw.update(activation=self.activation, swiglu_alpha=self.swiglu_alpha, swiglu_limit=self.swiglu_limit)
        if self.weight_layout != "row":
            kw.update(weight_layout=self.weight_layout)
        return kw

    def extra_repr(self) -> str:
        mode = "W4A16" if self.activations == "bf16" else "W4A4"
        extra = ", expert_bias=True" if "w1_bias" in self._buffers else ""
        if self.activation != "swiglu":
            extra += f", activation={self.activation!r}"
        if self.weight_layout != "row":
            extra += f", weight_layout={self.weight_layout}"
        return (f"hidden_size={self.hidden_size}, intermediate_size={self.intermediate_size}, "
                f"num_experts={self.num_experts}, top_k={self.top_k}, method={self.method!r}, "
                f"format={self.fmt}, {mode}{extra}")


class FP4SparseMoeBlock(FP4MoE):
    """An FP4MoE in place of a transformers MoE block (quantize_model builds it; torch_fp4.hf
    lists the supported blocks): forward(hidden_states) has the replaced block's signature and
    return structure, (hidden_states, router_logits) for Mixtral and Qwen3-MoE, and routes as
    that block does: router_logits = router(hidden_states) in the hidden states' own dtype (not
    rounded to compute_dtype first), softmax in fp32, top-k, renormalized when `renormalize`,
    and the k weights rounded to the hidden states' dtype. The router logits come from the same
    dense router, so code that reads them (transformers' output_router_logits and its
    load-balancing loss) sees what the dense block gave. quantize_model also makes the module
    an instance of the replaced block's class (a subclass of both, created once per class), as
    transformers collects router_logits from instances of that class; such a module cannot be
    pickled whole (save its state_dict).

    In place of DeepSeek-V3's DeepseekV3MoE (method "deepseek_v3", `routing_bias` its
    e_score_correction_bias) forward returns hidden_states alone: the routed NVFP4 experts plus
    `shared_experts(hidden_states)`, the block's shared MLP (its nn.Linear layers converted by
    quantize_model like any dense projection). Routing is DeepseekV3TopkRouter's, computed here
    (see `_deepseek_v3_route`), with the k weights applied in fp32 as that block does.
    """
    returns_logits = True
    norm_topk_prob = True

    def _deepseek_v3_route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids int32, weights fp32) of tokens x [T, H] as transformers 4.57's
        DeepseekV3TopkRouter computes them. ops.route(method="deepseek_v3") is not used: it
        always normalizes the weights, masks unchosen groups with -inf where transformers
        writes 0.0 (a different choice when the correction bias makes scores negative), and
        orders experts by score where transformers keeps torch.topk(sorted=False) order, which
        decides the order of the fp32 sums. This follows transformers' expressions one for one,
        so ids and weights are bitwise transformers' own."""
        e = self.num_experts
        logits = torch.nn.functional.linear(x.float(), self.router.weight.float())
        scores = logits.sigmoid()
        choice = scores.view(-1, e) + self.routing_bias.unsqueeze(0)
        group_scores = (choice.view(-1, self.n_group, e // self.n_group).topk(2, dim=-1)[0]
                        .sum(dim=-1))
        group_idx = torch.topk(group_scores, k=self.topk_group, dim=-1, sorted=False)[1]
        group_mask = torch.zeros_like(group_scores)
        group_mask.scatter_(1, group_idx, 1)
        score_mask = (group_mask.unsqueeze(-1).expand(-1, self.n_group, e // self.n_group)
                      .reshape(-1, e))
        choice = choice.masked_fill(~score_mask.bool(), 0.0)
        ids = torch.topk(choice, k=self.top_k, dim=-1, sorted=False)[1]
        weights = scores.gather(1, ids)
        if self.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        weights = weights * self.routed_scaling_factor
        return ids.to(torch.int32), weights

    def _route(self, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # calibrate routes with the block's own routing
        if self.method == "deepseek_v3":
            return self._deepseek_v3_route(a)
        return super()._route(a)

    def forward(self, hidden_states: torch.Tensor):
        if self.method == "deepseek_v3":
            a, out_dtype = self._tokens(hidden_states, "forward")
            ids, weights = self._deepseek_v3_route(hidden_states.reshape(-1, self.hidden_size))
            out = self._experts(hidden_states, a, ids, weights, out_dtype)
            return out + self.shared_experts(hidden_states)
        a, out_dtype = self._tokens(hidden_states, "forward")
        x = hidden_states.reshape(-1, self.hidden_size)
        logits = self.router(x.to(self.router.weight.dtype))
        ids, weights = ops.route(logits, self.top_k, self.method, self.renormalize)
        # transformers applies the routing weights in the hidden states' dtype
        if hidden_states.dtype != torch.float32:
            weights = weights.to(hidden_states.dtype).float()
        out = self._experts(hidden_states, a, ids, weights, out_dtype)
        return (out, logits) if self.returns_logits else out


_BLOCK_CLASSES: dict = {}


def _as_block(mod: FP4SparseMoeBlock, block_class: type) -> FP4SparseMoeBlock:
    """Make mod an instance of the replaced block's class too (FP4SparseMoeBlock's methods come
    first in the method order, so forward and __init__ are FP4MoE's)."""
    sub = _BLOCK_CLASSES.get(block_class)
    if sub is None:
        sub = type("FP4" + block_class.__name__, (FP4SparseMoeBlock, block_class),
                   {"__module__": __name__, "__doc__": FP4SparseMoeBlock.__doc__})
        _BLOCK_CLASSES[block_class] = sub
    mod.__class__ = sub
    return mod


def _routing_kwargs(spec: hf.MoeBlockSpec) -> dict:
    """The routing arguments of FP4MoE's constructors for a supported block, and its compute
    dtype (the router's, when 16-bit)."""
    w = spec.router.weight
    return dict(top_k=spec.top_k, method=spec.method, renormalize=spec.renormalize,
                routing_bias=spec.routing_bias, n_group=spec.n_group, topk_group=spec.topk_group,
                routed_scaling_factor=spec.routed_scaling_factor,
                compute_dtype=w.dtype if w.dtype in _COMPUTE_DTYPES else torch.bfloat16)


def _finish_block(mod: FP4SparseMoeBlock, spec: hf.MoeBlockSpec, block_class: type) -> FP4SparseMoeBlock:
    """The block's return structure and DeepSeek-V3's extras, and the block's class."""
    mod.returns_logits = spec.returns_logits
    if spec.method == "deepseek_v3":
        mod.norm_topk_prob = spec.norm_topk_prob
        # the same module, so that quantize_model converts its nn.Linear layers in place
        mod.shared_experts = spec.shared_experts
    return _as_block(mod, block_class)


def _convert_moe_block(block: torch.nn.Module, spec: hf.MoeBlockSpec) -> FP4SparseMoeBlock:
    """A W4A16 FP4SparseMoeBlock of a supported block's weights (quantize_model switches it to
    W4A4 after calibrating)."""
    mod = FP4SparseMoeBlock.from_experts(spec.router, spec.w1, spec.w2, **_routing_kwargs(spec))
    return _finish_block(mod, spec, type(block))
