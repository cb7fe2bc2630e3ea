"""FP4Linear / quantize_model / FP4MoE on the GPU: torch.compile(fullgraph=True) with CUDA graphs
(mode="reduce-overhead") gives what eager gives, call after call, for every format and
activation mode. The compiled graph may fuse the bf16 glue ops differently (no bit equality
with eager is promised; in W4A4 a changed rounding between layers can move an activation to
another FP4 code), so results are compared by cosine: > 0.999 in W4A16, > 0.995 in W4A4;
repeated replays must be bit-identical to each other."""
import pytest
import torch
import torch.nn.functional as Fn

import torch_fp4 as t4

pytestmark = pytest.mark.gpu

MODES = [("nvfp4", "bf16"), ("nvfp4", "fp4"), ("mxfp4", "bf16"), ("mxfp4", "fp4")]


def _mlp(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.SiLU(),
                               torch.nn.Linear(512, 256)).to("cuda", torch.bfloat16)


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return Fn.cosine_similarity(a.float().flatten(), b.float().flatten(), dim=0).item()


def _replays(fn, xs):
    outs = []
    for x in xs:
        torch.compiler.cudagraph_mark_step_begin()
        outs.append(fn(x).clone())
    return outs


def _check_under_cuda_graphs(module, xs, act):
    """Compiled with CUDA graphs, replayed twice over `xs`: replays agree bit for bit and each
    output is close to eager."""
    with torch.no_grad():
        eager = [module(x) for x in xs]
        fn = torch.compile(module, mode="reduce-overhead", fullgraph=True)
        first = _replays(fn, xs)
        again = _replays(fn, xs)
    bound = 0.999 if act == "bf16" else 0.995
    for e, f, a in zip(eager, first, again):
        assert torch.equal(f, a), "replays of the same input differ"
        assert _cos(f, e) > bound, _cos(f, e)


@pytest.mark.parametrize("fmt,act", MODES)
def test_quantized_model_under_cuda_graphs(fmt, act):
    torch._dynamo.reset()
    model = t4.quantize_model(_mlp(0), t4.QuantConfig(fmt=fmt, activations=act))
    xs = [torch.randn(8, 256, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    _check_under_cuda_graphs(model, xs, act)


@pytest.mark.parametrize("act", ["bf16", "fp4"])
def test_fp4moe_under_cuda_graphs(act):
    torch._dynamo.reset()
    torch.manual_seed(1)
    hidden, inter, experts = 256, 128, 8
    router = torch.nn.Linear(hidden, experts, bias=False).to("cuda", torch.bfloat16)
    w1 = (torch.randn(experts, 2 * inter, hidden, device="cuda") / 16).to(torch.bfloat16)
    w2 = (torch.randn(experts, hidden, inter, device="cuda") / 11).to(torch.bfloat16)
    xs = [torch.randn(16, hidden, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    moe = t4.FP4MoE.from_experts(router, w1, w2, top_k=2, method="renormalize",
                                 activations=act, calibration=xs[0])
    _check_under_cuda_graphs(moe, xs, act)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_w4a4_forward_is_w4a4s_product(fmt):
    """FP4Linear's W4A4 forward (fp4_quantized_values, then mm_fp4 on them as bf16 activations)
    is within the spec's GEMM bound of the exact product of the quantized activations and
    weights, at M = 1, 33 and 300 (the small-M and the Hopper GEMM on sm_90), weights in the
    device's preferred layout; NaN-poisoned outputs show any element left unwritten."""
    from torch_fp4 import formats as F
    from torch_fp4.kernels import _common
    from torch_fp4.testing import assert_mm_within_bound
    torch.manual_seed(3)
    lin = torch.nn.Linear(512, 384, bias=False).to("cuda", torch.bfloat16)
    mod = t4.FP4Linear.from_linear(lin, fmt, "fp4")
    block = 16 if fmt == "nvfp4" else 32
    w_row = F.from_weight_layout(mod.weight, mod.weight_layout)
    w_hat = t4.fp4_dequantize(w_row, mod.weight_scale, None, block, out_dtype=torch.float32)
    _common.POISON_OUTPUTS = True
    try:
        for m in (1, 33, 300):
            x = torch.randn(m, 512, device="cuda", dtype=torch.bfloat16)
            with torch.no_grad():
                y = mod(x)
            gs = t4.compute_global_scale(x) if fmt == "nvfp4" else None
            a_hat = t4.fp4_quantized_values(x, gs, block, backend="reference").float()
            alpha = t4.nvfp4_alpha(gs, mod.weight_global_scale) if fmt == "nvfp4" else 1.0
            assert_mm_within_bound(y, a_hat, w_hat, alpha)
    finally:
        _common.POISON_OUTPUTS = False
