"""`python -m torch_fp4 bench moe`: FP4 fused MoE on the expert shapes of Mixtral-8x7B,
Qwen3-30B-A3B and DeepSeek-V3 (NVFP4 experts, W4A16 and W4A4; the 256 routed experts one GPU
holds with expert parallelism) and of gpt-oss-20b and gpt-oss-120b (MXFP4 experts with biases
and the clamped SwiGLU, W4A16 only) against peers measured in the same run with CUDA-graph
replays (torch_fp4/bench/timing.py):

- bf16: a BF16 MoE with the same routing and the same expert shapes: stable sort of the pairs by
  expert, torch._grouped_mm for both GEMMs (gpt-oss: plus its biases), the model's activation,
  weighted sum of the top-k rows (where torch._grouped_mm is missing: a per-expert loop, timed
  eagerly because it reads the expert counts on the host);
- reference: torch_fp4's pure-PyTorch FP4 MoE (every expert densely over all tokens, fp64
  sums), timed where it is cheap enough (it is the oracle, not a contender) and used to report
  the Triton result's relative L2 error for small batches.

Columns: time per call (routing precomputed; `route` is timed on its own) with backend="auto",
speed-up over bf16, the FP4 expert weight bytes the batch touches (experts with at least one
pair) per second, the relative error of W4A4 / W4A16 against the reference, and the time of
each backend of BACKENDS asked for by name (nan where it cannot run the batch). W4A4 times include the activation
quantization. Weights are random codes with power-of-two block scales (timing does not depend
on the values); gpt-oss's biases are random bf16.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .. import formats as F
from .. import ops
from .timing import graph_time_us, write_csv

TOKENS = (1, 4, 16, 64, 256, 1024, 4096)
QUICK_TOKENS = (1, 16, 256)
REFERENCE_MAX_TFLOP = 1.0     # time the reference only below this much fp64 work per call
ERROR_MAX_TOKENS = 64         # compare with the reference up to this batch


@dataclass(frozen=True)
class Model:
    name: str
    experts: int
    hidden: int
    inter: int
    top_k: int
    method: str
    route_kw: dict = field(default_factory=dict)
    gpt_oss: bool = False   # MXFP4 experts, bf16 biases on both GEMMs, the clamped SwiGLU

    @property
    def block_size(self) -> int:
        return 32 if self.gpt_oss else 16

    @property
    def weight_bytes_per_element(self) -> float:
        return 1 / 2 + 1 / self.block_size


MODELS = (
    Model("Mixtral-8x7B", 8, 4096, 14336, 2, "softmax", {"renormalize": True}),
    Model("Qwen3-30B-A3B", 128, 2048, 768, 8, "softmax", {"renormalize": True}),
    Model("DeepSeek-V3", 256, 7168, 2048, 8, "deepseek_v3",
          {"n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5}),
    Model("gpt-oss-20b", 32, 2880, 2880, 4, "softmax", {"renormalize": True}, gpt_oss=True),
    Model("gpt-oss-120b", 128, 2880, 2880, 4, "softmax", {"renormalize": True}, gpt_oss=True),
)


def _fp4_experts(experts: int, rows: int, k: int, device, gen, block_size: int = 16):
    """Random FP4 experts [E, rows, K/2] with 128x4 scales (powers of two in [2^-4, 2^2]):
    NVFP4 (block_size 16) with global scales 1, or MXFP4 (32) with global scales None."""
    data = torch.randint(0, 256, (experts, rows, k // 2), dtype=torch.uint8, device=device, generator=gen)
    exps = torch.randint(-4, 3, (experts, rows, -(-k // block_size)), device=device, generator=gen).float()
    if block_size == 32:
        return data, F.swizzle((exps + 127).to(torch.uint8).view(torch.float8_e8m0fnu), "128x4"), None
    scale = F.swizzle(torch.exp2(exps).to(torch.float8_e4m3fn), "128x4")
    return data, scale, torch.ones(experts, device=device)


def _gpt_oss_kwargs(m: Model, experts: int, device, gen) -> dict:
    """fused_moe's gpt-oss arguments: random bf16 biases and the clamped SwiGLU (else none)."""
    if not m.gpt_oss:
        return {}
    b1 = torch.randn(experts, 2 * m.inter, device=device, generator=gen).to(torch.bfloat16)
    b2 = torch.randn(experts, m.hidden, device=device, generator=gen).to(torch.bfloat16)
    return dict(block_size=32, w1_bias=b1, w2_bias=b2, activation="clamped_swiglu")


def model_experts(m: Model, experts: int, device, gen: torch.Generator):
    """Random experts of the model's shapes (_fp4_experts): w1 and w2 as (data, scale, global scale)."""
    return (_fp4_experts(experts, 2 * m.inter, m.hidden, device, gen, m.block_size),
            _fp4_experts(experts, m.hidden, m.inter, device, gen, m.block_size))


def routed_tokens(m: Model, experts: int, tokens: int, device, gen: torch.Generator):
    """x [T, H] bf16 ~ N(0, 1) and the model's routing of random logits (with a random DeepSeek-V3
    bias): x, topk_ids, topk_weights."""
    x = torch.randn(tokens, m.hidden, device=device, dtype=torch.bfloat16, generator=gen)
    kw = dict(m.route_kw)
    if m.method == "deepseek_v3":
        kw["bias"] = torch.randn(experts, device=device, generator=gen) * 0.01
    ids, tw = ops.route(torch.randn(tokens, experts, device=device, generator=gen), m.top_k, m.method, **kw)
    return x, ids, tw


def routed_batch(m: Model, experts: int, tokens: int, device, gen: torch.Generator):
    """The scripts' batch (scripts/profile_moe.py, sweep_moe*.py): model_experts, then
    routed_tokens: w1, w2, x, ids, tw."""
    return (*model_experts(m, experts, device, gen), *routed_tokens(m, experts, tokens, device, gen))


def _bytes_needed(m: Model, experts: int, tokens: int) -> int:
    fp4 = 2 * experts * 3 * m.inter * m.hidden * m.weight_bytes_per_element   # row-major and "sm90"
    bf16 = experts * 3 * m.inter * m.hidden * 2
    acts = tokens * m.top_k * (3 * m.inter + 2 * m.hidden) * 4 * 3
    return int(fp4 + bf16 + acts)


def _experts_that_fit(m: Model, device, max_tokens: int) -> int:
    free, _ = torch.cuda.mem_get_info(device)
    experts = m.experts
    while experts > 8 and _bytes_needed(m, experts, max_tokens) > 0.85 * free:
        experts //= 2
    return experts


def _grouped_mm_works(device) -> bool:
    if not hasattr(torch, "_grouped_mm"):
        return False
    try:
        a = torch.randn(32, 64, device=device, dtype=torch.bfloat16)
        b = torch.randn(2, 32, 64, device=device, dtype=torch.bfloat16)
        offs = torch.tensor([16, 32], device=device, dtype=torch.int32)
        torch._grouped_mm(a, b.transpose(1, 2), offs=offs)
        return True
    except (RuntimeError, TypeError, NotImplementedError):
        return False


def bf16_activation(h: torch.Tensor, inter: int, clamped: bool) -> torch.Tensor:
    """The peers' activation of h [rows, 2I] ([gate; up] halves) in h's dtype: silu(gate) * up,
    or gpt-oss's clamped SwiGLU (alpha 1.702, limit 7) as gpt-oss computes it."""
    gate, up = h[:, :inter], h[:, inter:]
    if not clamped:
        return torch.nn.functional.silu(gate) * up
    gate, up = gate.clamp(max=7.0), up.clamp(-7.0, 7.0)
    return (up + 1) * (gate * torch.sigmoid(gate * 1.702))


def grouped_experts_fp32(x: torch.Tensor, ids: torch.Tensor, tw: torch.Tensor, w1: torch.Tensor,
                         w2: torch.Tensor, offset: int = 0, masked: bool = False,
                         b1: torch.Tensor | None = None, b2: torch.Tensor | None = None,
                         clamped: bool = False) -> torch.Tensor:
    """The BF16 peers' experts, fp32 [T, H]: per token the fp32 sum over its (token, slot) pairs of
    ids [T, k] of tw[t, j] * down(silu(gate) * up)(x[t]) with bf16 experts w1 [E', 2I, H] ([gate;
    up] rows) and w2 [E', H, I]; pairs stably sorted by expert, both GEMMs torch._grouped_mm with
    offsets over the experts. `masked` (a rank's share, bench moe --ep): w1 and w2 hold experts
    [offset, offset + E') only, the other pairs sort last, outside the offsets, and add zero;
    torch._grouped_mm leaves their rows unwritten (garbage, possibly NaN or Inf), so they are
    dropped with torch.where rather than multiplied by zero. gpt-oss (bench moe's gpt-oss rows):
    biases b1 [E', 2I] and b2 [E', H] added to the GEMMs' outputs, the clamped activation. No host
    synchronization."""
    tokens, k = ids.shape
    experts, inter = w1.shape[0], w2.shape[2]
    key = ids.reshape(-1)
    if masked:
        expert = key.long() - offset
        mine = (expert >= 0) & (expert < experts)
        key = torch.where(mine, expert, experts)
    order = torch.argsort(key, stable=True)
    counts = torch.zeros(experts + int(masked), dtype=torch.int32, device=x.device).scatter_add_(
        0, key.long(), torch.ones_like(key, dtype=torch.int32))
    offs = torch.cumsum(counts[:experts], 0, dtype=torch.int32)
    h = torch._grouped_mm(x[order // k], w1.transpose(1, 2), offs=offs)
    row_expert = key[order].long().clamp(max=experts - 1) if b1 is not None or b2 is not None else None
    if b1 is not None:
        h = h + b1[row_expert]
    a = bf16_activation(h, inter, clamped)
    y = torch._grouped_mm(a, w2.transpose(1, 2), offs=offs)
    if b2 is not None:
        y = y + b2[row_expert]
    pair_y = torch.empty_like(y).index_copy_(0, order, y).view(tokens, k, -1).float() * tw.unsqueeze(-1)
    if masked:
        pair_y = torch.where(mine.view(tokens, k, 1), pair_y, 0.0)
    return pair_y.sum(1)


class Bf16Moe:
    """The BF16 peer: same routing, same shapes, bf16 weights [E, 2I, H] ([gate; up]) and [E, H, I]."""

    def __init__(self, m: Model, experts: int, device, gen, gpt_oss: dict | None = None):
        """gpt_oss: fused_moe's gpt-oss keyword arguments (_gpt_oss_kwargs), whose biases the
        peer adds too, with the clamped activation."""
        self.w1 = torch.empty(experts, 2 * m.inter, m.hidden, device=device, dtype=torch.bfloat16)
        self.w2 = torch.empty(experts, m.hidden, m.inter, device=device, dtype=torch.bfloat16)
        self.w1.normal_(0, 0.02, generator=gen)
        self.w2.normal_(0, 0.02, generator=gen)
        self.inter = m.inter
        gpt_oss = gpt_oss or {}
        self.b1, self.b2 = gpt_oss.get("w1_bias"), gpt_oss.get("w2_bias")
        self.clamped = gpt_oss.get("activation") == "clamped_swiglu"

    def grouped(self, x, ids, tw):
        return grouped_experts_fp32(x, ids, tw, self.w1, self.w2, b1=self.b1, b2=self.b2,
                                    clamped=self.clamped).to(x.dtype)

    def loop(self, x, ids, tw):
        tokens, k = ids.shape
        out = torch.zeros(tokens, x.shape[1], device=x.device, dtype=torch.float32)
        for e in torch.unique(ids).tolist():
            t, j = (ids == e).nonzero(as_tuple=True)
            h = x[t] @ self.w1[e].T
            if self.b1 is not None:
                h = h + self.b1[e]
            y = bf16_activation(h, self.inter, self.clamped) @ self.w2[e].T
            if self.b2 is not None:
                y = y + self.b2[e]
            out.index_add_(0, t, y.float() * tw[t, j].unsqueeze(-1))
        return out.to(x.dtype)


def _eager_time_us(fn, iters: int = 10) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000.0 / iters


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    diff = torch.linalg.norm(got.float() - want.float())
    return (diff / torch.linalg.norm(want.float()).clamp_min(1e-30)).item()


BACKENDS = ("triton", "cuda")   # timed one by one beside "auto" where they support the batch
HEADER = (f"{'model':<14} {'E':>4} {'T':>5} | {'route us':>8} {'bf16 us':>9} {'ref us':>9} | "
          f"{'W4A16 us':>9} {'x bf16':>6} {'GB/s':>6} {'err':>8} | {'W4A4 us':>9} {'x bf16':>6} "
          f"{'err':>8} | " + " ".join(f"{b + ' ' + m:>11}" for b in BACKENDS for m in ('W4A16', 'W4A4'))
          + f" | {'sm90 W4A16':>11} {'sm90 W4A4':>11}")


def sm90_experts(weights: tuple) -> tuple | None:
    """The experts prepacked ("sm90": fused_moe(..., weight_layout="sm90")) when the device runs
    them (the cuda backend on sm_90) and their shapes fit the layout, else None."""
    w1, s1, g1, w2, s2, g2 = weights
    if not (w1.is_cuda and torch.cuda.get_device_capability(w1.device) == (9, 0)):
        return None
    if F.sm90_layout_reason(w1.shape[1], 2 * w1.shape[2]) or F.sm90_layout_reason(w2.shape[1], 2 * w2.shape[2]):
        return None
    return ops.prepack_weight(w1), s1, g1, ops.prepack_weight(w2), s2, g2


def _measure(m: Model, experts: int, tokens: int, weights: tuple, extra: dict, peer: Bf16Moe, grouped: bool,
             gen: torch.Generator, name: str, packed: tuple | None = None) -> dict:
    """One row: every contender on one batch of `tokens` tokens (`packed`: the experts in the
    "sm90" layout, timed with "auto" too)."""
    dev = weights[0].device
    x = torch.randn(tokens, m.hidden, device=dev, dtype=torch.bfloat16, generator=gen)
    logits = torch.randn(tokens, experts, device=dev, generator=gen)
    kw = dict(m.route_kw)
    if m.method == "deepseek_v3":
        kw["bias"] = torch.randn(experts, device=dev, generator=gen) * 0.01
    ids, tw = ops.route(logits, m.top_k, m.method, **kw)
    a1 = ops.compute_global_scale(x)
    a2 = torch.full((1,), F.NVFP4_AMAX_TARGET / 1e6, device=dev)

    # gpt-oss: W4A4 with MXFP4 activations (no global scales)
    w4a4_kw = dict(activations="fp4") if m.gpt_oss else dict(a1_global_scale=a1, a2_global_scale=a2)
    modes = {"w4a16": {}, "w4a4": w4a4_kw}

    def call(mode, backend="auto"):
        return ops.fused_moe(x, *weights, ids, tw, local_expert_offset=0, num_local_experts=experts,
                             backend=backend, **modes[mode], **extra)

    def w4a16(backend="auto"):
        return call("w4a16", backend)

    def w4a4(backend="auto"):
        return call("w4a4", backend)

    nan = float("nan")
    t_route = graph_time_us(lambda: ops.route(logits, m.top_k, m.method, **kw), [()])
    t16 = graph_time_us(w4a16, [()])
    t4 = graph_time_us(w4a4, [()]) if "w4a4" in modes else nan
    per_backend = {}
    for b in BACKENDS:
        for mode in ("w4a16", "w4a4"):
            ok = mode in modes and ops.unsupported_reason(
                "fused_moe", b, x, *weights, ids, tw, local_expert_offset=0, num_local_experts=experts,
                **modes[mode], **extra) is None
            per_backend[f"{mode}_{b}_us"] = graph_time_us(lambda: call(mode, b), [()]) if ok else nan
    for mode in ("w4a16", "w4a4"):
        per_backend[f"{mode}_sm90_us"] = nan if packed is None or mode not in modes else graph_time_us(
            lambda: ops.fused_moe(x, *packed, ids, tw, local_expert_offset=0, num_local_experts=experts,
                                  weight_layout="sm90", **modes[mode], **extra), [()])
    if grouped:
        try:
            t_bf16 = graph_time_us(lambda: peer.grouped(x, ids, tw), [()])
        except RuntimeError as exc:   # not capturable here: time it eagerly
            print(f"  torch._grouped_mm in a CUDA graph failed ({exc}); timing it eagerly", flush=True)
            t_bf16 = _eager_time_us(lambda: peer.grouped(x, ids, tw))
    else:
        t_bf16 = _eager_time_us(lambda: peer.loop(x, ids, tw))
    t_ref = err16 = err4 = nan
    if 2 * experts * tokens * 3 * m.inter * m.hidden / 1e12 <= REFERENCE_MAX_TFLOP:
        t_ref = graph_time_us(lambda: w4a16("reference"), [()], calls=2, repeats=3)
    if tokens <= ERROR_MAX_TOKENS:
        err16 = _rel_err(w4a16(), w4a16("reference"))
        if "w4a4" in modes:
            err4 = _rel_err(w4a4(), w4a4("reference"))
    active = torch.unique(ids).numel()
    gbs = active * 3 * m.inter * m.hidden * m.weight_bytes_per_element / t16 / 1e3
    return dict(gpu=name, model=m.name, experts=experts, hidden=m.hidden, inter=m.inter,
                top_k=m.top_k, tokens=tokens, route_us=t_route, bf16_us=t_bf16, reference_us=t_ref,
                w4a16_us=t16, w4a16_x_bf16=t_bf16 / t16, w4a16_weight_gbs=gbs,
                w4a16_rel_err=err16, w4a4_us=t4, w4a4_x_bf16=t_bf16 / t4, w4a4_rel_err=err4,
                active_experts=active, bf16_peer="grouped_mm" if grouped else "loop", **per_backend)


def _run_model(m: Model, tokens_list, grouped: bool, name: str) -> list[dict]:
    dev = torch.device("cuda")
    experts = _experts_that_fit(m, dev, max(tokens_list))
    if experts != m.experts:
        print(f"{m.name}: E reduced from {m.experts} to {experts} to fit in GPU memory", flush=True)
    print(HEADER, flush=True)
    gen = torch.Generator(device=dev).manual_seed(0)
    weights = (*_fp4_experts(experts, 2 * m.inter, m.hidden, dev, gen, m.block_size),
               *_fp4_experts(experts, m.hidden, m.inter, dev, gen, m.block_size))
    extra = _gpt_oss_kwargs(m, experts, dev, gen)
    peer = Bf16Moe(m, experts, dev, gen, extra)
    packed = sm90_experts(weights)
    rows = []
    for tokens in tokens_list:
        r = _measure(m, experts, tokens, weights, extra, peer, grouped, gen, name, packed)
        rows.append(r)
        print(f"{m.name:<14} {experts:>4} {tokens:>5} | {r['route_us']:>8.1f} {r['bf16_us']:>9.1f} "
              f"{r['reference_us']:>9.1f} | {r['w4a16_us']:>9.1f} {r['w4a16_x_bf16']:>6.2f} "
              f"{r['w4a16_weight_gbs']:>6.0f} {r['w4a16_rel_err']:>8.1e} | {r['w4a4_us']:>9.1f} "
              f"{r['w4a4_x_bf16']:>6.2f} {r['w4a4_rel_err']:>8.1e} | "
              + " ".join(f"{r[f'{mode}_{b}_us']:>11.1f}" for b in BACKENDS for mode in ('w4a16', 'w4a4'))
              + f" | {r['w4a16_sm90_us']:>11.1f} {r['w4a4_sm90_us']:>11.1f}", flush=True)
    return rows


def run(quick: bool = False, csv_path: str | None = None, tokens: tuple[int, ...] | None = None,
        models: tuple[str, ...] | None = None) -> list[dict]:
    """Every model (or those named in `models`) at every batch of TOKENS (QUICK_TOKENS, or
    `tokens`)."""
    dev = torch.device("cuda")
    name = torch.cuda.get_device_name(dev)
    grouped = _grouped_mm_works(dev)
    print(f"bench moe on {name}; torch {torch.__version__}; bf16 peer: "
          f"{'torch._grouped_mm (graph)' if grouped else 'per-expert loop (eager)'}", flush=True)
    rows = []
    for m in MODELS:
        if models and m.name not in models:
            continue
        rows += _run_model(m, tokens or (QUICK_TOKENS if quick else TOKENS), grouped, name)
        torch.cuda.empty_cache()
    write_csv(csv_path, rows)
    return rows

