"""Test helpers: the spec's accuracy bound (one place) and generators of exact FP4 operands.

Used by the CPU tests, the GPU tests and benchmarks' correctness checks.
"""
from __future__ import annotations

import torch

from . import formats as F

# (mantissa bits, smallest normal exponent) of each output dtype.
_FLOAT_FORMATS = {
    torch.float32: (23, -126),
    torch.bfloat16: (7, -126),
    torch.float16: (10, -14),
}


def ulp(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Spacing of `dtype` values at |x| (x in fp64): 2^(max(floor(log2|x|), emin) - mantissa)."""
    mant, emin = _FLOAT_FORMATS[dtype]
    mag = x.double().abs()
    exp = torch.floor(torch.log2(torch.where(mag > 0, mag, torch.ones_like(mag))))
    exp = torch.where(mag > 0, exp.clamp(min=emin), torch.full_like(exp, emin))
    return torch.exp2(exp - mant)


def mm_reference(a_hat: torch.Tensor, b_hat: torch.Tensor, alpha: float | torch.Tensor = 1.0
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(ref, abs_sum) in fp64 for A [M, K] and B [N, K]: ref = alpha * A @ B^T and
    abs_sum = |alpha| * |A| @ |B|^T (the magnitude term of the spec's bound)."""
    alpha = float(alpha) if not isinstance(alpha, torch.Tensor) else float(alpha.double().item())
    a64, b64 = a_hat.double().cpu(), b_hat.double().cpu()
    return alpha * (a64 @ b64.T), abs(alpha) * (a64.abs() @ b64.abs().T)


def mm_bound(ref: torch.Tensor, abs_sum: torch.Tensor, k: int, out_dtype: torch.dtype) -> torch.Tensor:
    """Spec section 5: 1 ulp_out(|ref|) + K * 2^-23 * |alpha| * sum_k |A[m,k] * B[n,k]|."""
    return ulp(ref, out_dtype) + k * 2.0 ** -23 * abs_sum


def assert_mm_within_bound(out: torch.Tensor, a_hat: torch.Tensor, b_hat: torch.Tensor,
                           alpha: float | torch.Tensor = 1.0) -> None:
    """Raise AssertionError unless every element of out is within the spec's bound."""
    ref, abs_sum = mm_reference(a_hat, b_hat, alpha)
    tol = mm_bound(ref, abs_sum, a_hat.shape[1], out.dtype)
    err = (out.double().cpu() - ref).abs()
    bad = ~(err <= tol)
    if bad.any():
        i = bad.nonzero()[0].tolist()
        raise AssertionError(f"{int(bad.sum())} of {out.numel()} elements outside the spec's "
                             f"bound; first at {i}: out={out[tuple(i)].item()}, "
                             f"ref={ref[tuple(i)].item()}, bound={tol[tuple(i)].item()}")


def same_bits_up_to_nan_payload(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Equal bits, except that where one is NaN the other must be NaN of any payload (two paths to
    the same NaN block may form their NaNs differently)."""
    nan = x.isnan()
    if x.dtype != y.dtype or not torch.equal(nan, y.isnan()):
        return False
    ints = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}[x.dtype]
    return torch.equal(x.view(ints)[~nan], y.view(ints)[~nan])


def random_codes(shape: tuple[int, ...], generator: torch.Generator | None = None,
                 device: torch.device | str = "cpu") -> torch.Tensor:
    """Uniform random E2M1 codes (uint8 in [0, 15]) of `shape` (unpacked)."""
    return torch.randint(0, 16, shape, dtype=torch.uint8, generator=generator).to(device)


def grid_exact_operand(rows: int, k: int, fmt: F.Fp4Format, layout: F.SfLayout | str = "128x4",
                       generator: torch.Generator | None = None, device: torch.device | str = "cpu"
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """An FP4 operand whose products and partial sums are exact in fp32.

    Codes are uniform; block scales are 2^j with j in [-2, 2] (exact in e4m3 and e8m0), so every
    dequantized value is a multiple of 2^-3 below 6 * 4 = 24 in magnitude: sums of up to 2^14
    products of two such values stay exact in fp32.
    Returns (data float4_e2m1fn_x2 [rows, k/2], scale in `layout`, dequantized fp32 [rows, k]).
    """
    layout = F.SfLayout.parse(layout)
    codes = random_codes((rows, k), generator)
    exps = torch.randint(-2, 3, (rows, k // fmt.block_size), generator=generator)
    values = torch.exp2(exps.float())
    if fmt is F.NVFP4:
        bits = F.e4m3_rn_satfinite(values)
    else:
        bits = (exps + 127).to(torch.uint8)
    scale = F.swizzle(bits.view(fmt.scale_dtype), layout)
    data = F.pack_e2m1(codes).view(torch.float4_e2m1fn_x2)
    hat = (F.e2m1_decode(codes).view(rows, -1, fmt.block_size) * values.unsqueeze(-1)).view(rows, k)
    return data.to(device), scale.to(device), hat.to(device)


def quantized_weight(n: int, k: int, fmt: F.Fp4Format = F.NVFP4, device: torch.device | str = "cpu",
                     dtype: torch.dtype = torch.bfloat16):
    """A random weight [N, K] quantized with the public op: (data [N, K/2], 128x4 scale, gs or None)."""
    from . import ops

    w = torch.randn(n, k, device=device, dtype=dtype)
    if fmt is F.NVFP4:
        gs = ops.compute_global_scale(w)
        return (*ops.nvfp4_quantize(w, gs), gs)
    return (*ops.mxfp4_quantize(w), None)


def moe_problem(tokens: int = 6, hidden: int = 64, inter: int = 32, experts: int = 4, top_k: int = 2,
                device: torch.device | str = "cpu", w4a4: bool = True) -> dict:
    """Keyword arguments of a small random fused_moe call (NVFP4 experts, softmax routing)."""
    from . import ops

    x = torch.randn(tokens, hidden, device=device, dtype=torch.bfloat16)
    w1 = torch.randn(experts, 2 * inter, hidden, device=device, dtype=torch.bfloat16)
    w2 = torch.randn(experts, hidden, inter, device=device, dtype=torch.bfloat16)
    gs1 = torch.cat([ops.compute_global_scale(w) for w in w1])
    gs2 = torch.cat([ops.compute_global_scale(w) for w in w2])
    w1q, w1s = ops.nvfp4_quantize(w1, gs1)
    w2q, w2s = ops.nvfp4_quantize(w2, gs2)
    ids, weights = ops.route(torch.randn(tokens, experts, device=device), top_k)
    kw = dict(x=x, w1=w1q, w1_scale=w1s, w1_global_scale=gs1, w2=w2q, w2_scale=w2s,
              w2_global_scale=gs2, topk_ids=ids, topk_weights=weights)
    if w4a4:
        kw["a1_global_scale"] = ops.compute_global_scale(x)
        kw["a2_global_scale"] = torch.full((1,), 448.0, device=device)
    return kw


def op_samples() -> list[tuple[str, str, tuple]]:
    """(id, op name, schema arguments) covering every op of torch.ops.torch_fp4 and its modes
    (CPU tensors, the reference backend): for opcheck, fake/real and eager/op comparisons."""
    from . import ops
    from .backends import Backend

    REF = int(Backend.REFERENCE)
    x = torch.randn(130, 64, dtype=torch.bfloat16)
    x3 = torch.randn(3, 20, 32, dtype=torch.float16)
    gs = ops.compute_global_scale(x)
    gs3 = torch.rand(3) * 100 + 1
    out = []
    out.append(("global_scale", "compute_global_scale", (x, REF)))
    for lay in ("128x4", "8x4", "linear"):
        out.append((f"nvfp4_{lay}", "nvfp4_quantize", (x, gs, lay, REF)))
        out.append((f"mxfp4_{lay}", "mxfp4_quantize", (x, lay, REF)))
    out.append(("nvfp4_3d", "nvfp4_quantize", (x3, gs3, "128x4", REF)))
    d, s = ops.nvfp4_quantize(x, gs)
    out.append(("deq_nvfp4", "fp4_dequantize", (d, s, gs, 16, "128x4", torch.bfloat16, REF)))
    dm, sm = ops.mxfp4_quantize(x, "8x4")
    out.append(("deq_mxfp4", "fp4_dequantize", (dm, sm, None, 32, "8x4", torch.float32, REF)))
    out.append(("values_nvfp4", "fp4_quantized_values", (x, gs, 16, REF)))
    out.append(("values_nvfp4_3d", "fp4_quantized_values", (x3, gs3, 16, REF)))
    out.append(("values_mxfp4", "fp4_quantized_values", (x, None, 32, REF)))
    wq, ws, wgs = quantized_weight(72, 64)
    alpha = F.nvfp4_alpha(gs, wgs)
    out.append(("mm_w4a4", "mm_fp4", (d, wq.T, s, ws.T, alpha, torch.bfloat16, 16, "128x4", REF)))
    mq, ms, _ = quantized_weight(72, 64, F.MXFP4)
    out.append(("mm_mxfp4", "mm_fp4", (dm, mq.T, sm, ms.T, None, torch.float32, 32, "8x4", REF)))
    out.append(("mm_w4a16", "mm_fp4", (x, wq.T, None, ws.T, alpha, torch.float16, 16, "128x4", REF)))
    pq, ps, _ = quantized_weight(128, 64)
    packed = ops.prepack_weight(pq)
    out.append(("mm_sm90", "mm_fp4", (x, packed.T, None, ps.T, None, torch.bfloat16, 16, "128x4", REF, "sm90")))
    out.append(("mm_quantize_a", "mm_fp4", (x, wq.T, None, ws.T, alpha, torch.bfloat16, 16, "128x4", REF, "row",
                                             True, gs)))
    out.append(("mm_quantize_a_mxfp4", "mm_fp4", (x, mq.T, None, ms.T, None, torch.float32, 32, "128x4", REF,
                                                   "row", True, None)))
    out.append(("mm_gs_w4a16", "mm_fp4", (x, wq.T, None, ws.T, None, torch.bfloat16, 16, "128x4", REF, "row",
                                           False, None, wgs)))
    out.append(("mm_gs_quantize_a", "mm_fp4", (x, wq.T, None, ws.T, None, torch.bfloat16, 16, "128x4", REF,
                                                "row", True, gs, wgs)))
    out.append(("mm_gs_w4a4", "mm_fp4", (d, wq.T, s, ws.T, None, torch.float32, 16, "128x4", REF, "row", False,
                                          gs, wgs)))
    out.append(("mm_bias", "mm_fp4", (x, wq.T, None, ws.T, None, torch.bfloat16, 16, "128x4", REF, "row", False,
                                       None, wgs, torch.randn(72))))
    out.append(("mm_bias_w4a4_bf16", "mm_fp4", (d, wq.T, s, ws.T, alpha, torch.float16, 16, "128x4", REF, "row",
                                                 False, None, None, torch.randn(72).to(torch.bfloat16))))
    out.append(("prepack", "prepack_weight", (pq.view(torch.uint8), "sm90")))
    out.append(("unprepack", "unprepack_weight", (packed, "sm90")))
    logits = torch.randn(9, 16)
    out.append(("route_softmax", "route", (logits, 3, "softmax", True, None, None, None, 1.0, REF)))
    out.append(("route_ds", "route", (logits, 4, "deepseek_v3", False, torch.randn(16), 4, 2, 2.5, REF)))
    for w4a4 in (False, True):
        kw = moe_problem(w4a4=w4a4)
        args = (kw["x"], kw["w1"], kw["w1_scale"], kw["w1_global_scale"], kw["w2"], kw["w2_scale"],
                kw["w2_global_scale"], kw["topk_ids"], kw["topk_weights"], kw.get("a1_global_scale"),
                kw.get("a2_global_scale"), 0, None, None, REF)
        out.append((f"moe_{'w4a4' if w4a4 else 'w4a16'}", "fused_moe", args))
    g = gpt_oss_moe_problem()
    out.append(("moe_gpt_oss", "fused_moe",
                (g["x"], g["w1"], g["w1_scale"], None, g["w2"], g["w2_scale"], None, g["topk_ids"],
                 g["topk_weights"], None, None, 0, None, None, REF, 32, g["w1_bias"], g["w2_bias"],
                 "clamped_swiglu", 1.702, 7.0)))
    kw = moe_problem(tokens=5, hidden=128, inter=64, experts=2, w4a4=False)
    out.append(("moe_sm90", "fused_moe",
                (kw["x"], ops.prepack_weight(kw["w1"]), kw["w1_scale"], kw["w1_global_scale"],
                 ops.prepack_weight(kw["w2"]), kw["w2_scale"], kw["w2_global_scale"], kw["topk_ids"],
                 kw["topk_weights"], None, None, 0, None, None, REF, 16, None, None, "swiglu", 1.702, 7.0, None,
                 "sm90")))
    return out


def gpt_oss_moe_problem(tokens: int = 6, hidden: int = 96, inter: int = 64, experts: int = 4, top_k: int = 2,
                        device: torch.device | str = "cpu") -> dict:
    """Keyword arguments of a small random fused_moe call shaped like gpt-oss's: MXFP4 experts
    (block_size 32; hidden 96 is not a multiple of 128), bf16 biases on both GEMMs, the clamped
    SwiGLU, routing by top-k on the logits then softmax."""
    from . import ops

    x = torch.randn(tokens, hidden, device=device, dtype=torch.bfloat16)
    w1 = torch.randn(experts, 2 * inter, hidden, device=device, dtype=torch.bfloat16)
    w2 = torch.randn(experts, hidden, inter, device=device, dtype=torch.bfloat16) / 4
    w1q, w1s = ops.mxfp4_quantize(w1)
    w2q, w2s = ops.mxfp4_quantize(w2)
    ids, weights = ops.route(torch.randn(tokens, experts, device=device), top_k, "renormalize")
    return dict(x=x, w1=w1q, w1_scale=w1s, w1_global_scale=None, w2=w2q, w2_scale=w2s, w2_global_scale=None,
                topk_ids=ids, topk_weights=weights, block_size=32,
                w1_bias=torch.randn(experts, 2 * inter, device=device, dtype=torch.bfloat16),
                w2_bias=torch.randn(experts, hidden, device=device, dtype=torch.bfloat16),
                activation="clamped_swiglu")


def as_list(result) -> list:
    """An op's result as a list of tensors."""
    return list(result) if isinstance(result, (tuple, list)) else [result]


def checked_candidates(space, problem) -> list:
    """A tactic space's (a module with candidates, default and why_not) candidates for `problem`,
    after asserting that there is at least one, the default comes first, none repeats and the
    space's own why_not accepts each."""
    cands = space.candidates(problem)
    assert cands and cands[0] == space.default(problem)
    assert len(set(cands)) == len(cands)
    assert all(space.why_not(t, problem) is None for t in cands)
    return cands


def bits(t: torch.Tensor) -> torch.Tensor:
    """A tensor to compare bit for bit: 1-byte dtypes (FP4, FP8 scales) as uint8."""
    return t.view(torch.uint8) if t.element_size() == 1 else t


E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def gpt_oss_expert_tensors(e: int, h: int, i: int, seed: int = 0, prefix: str = "model.layers.3.mlp.experts",
                           bias_dtype: torch.dtype = torch.bfloat16, scale_range: tuple[int, int] = (100, 151)
                           ) -> dict[str, torch.Tensor]:
    """A gpt-oss MoE layer's six expert tensors as its checkpoints store them, `prefix`.name: random
    `*_blocks` (uint8 [E, rows, G, 16], two E2M1 codes per byte) and `*_scales` (UE8M0 bytes in
    [scale_range), no NaN byte), biases ~ N(0, 1) in bias_dtype; gate and up interleaved."""
    g = torch.Generator().manual_seed(seed)

    def blocks(*shape):
        return torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)

    def scales(*shape):
        return torch.randint(*scale_range, shape, generator=g, dtype=torch.uint8)
    t = {"gate_up_proj_blocks": blocks(e, 2 * i, h // 32, 16), "gate_up_proj_scales": scales(e, 2 * i, h // 32),
         "gate_up_proj_bias": torch.randn(e, 2 * i, generator=g).to(bias_dtype),
         "down_proj_blocks": blocks(e, h, i // 32, 16), "down_proj_scales": scales(e, h, i // 32),
         "down_proj_bias": torch.randn(e, h, generator=g).to(bias_dtype)}
    return {f"{prefix}.{k}": v for k, v in t.items()}


def gpt_oss_decode(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Straightforward decode of gpt-oss blocks [.., rows, G, 16] -> [.., rows, 32 G] in fp64: byte
    b of a block holds elements 2b (low nibble) and 2b + 1 (high nibble), times 2^(scale - 127)."""
    lut = torch.tensor(E2M1_VALUES, dtype=torch.float64)
    lo, hi = lut[(blocks & 0xF).long()], lut[(blocks >> 4).long()]
    vals = torch.stack([lo, hi], dim=-1).flatten(-2) * torch.exp2(scales.double() - 127).unsqueeze(-1)
    return vals.flatten(-2)
