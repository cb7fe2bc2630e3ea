"""The reference backend on CUDA tensors: identical bits to the CPU reference for quantization,
identical GEMM/MoE results (both sum products exactly in fp64), no host synchronization
(CUDA-graph capture + replay equals eager)."""
import pytest
import torch

import torch_fp4 as t4
from torch_fp4 import testing as T

pytestmark = pytest.mark.gpu
CUDA = "cuda"


def _bits(t):
    return t.view(torch.uint8) if t.element_size() == 1 else t


def _edge_values(m, k):
    """Random rows over 60 binades, then (where rows exist) a zero block, NaN, +-Inf, denormals."""
    x = torch.randn(m, k) * torch.exp2(torch.randint(-30, 30, (m, 1)).float())
    edits = ((0, slice(0, 16), 0.0), (1, 3, float("nan")), (2, 5, float("inf")),
             (3, slice(None), 1e-40), (4, 7, -float("inf")))
    for row, col, value in edits[:m]:
        x[row, col] = value
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", ["128x4", "8x4", "linear"])
@pytest.mark.parametrize("shape", [(1, 64), (129, 96), (3, 40, 32)])
def test_quantize_cuda_equals_cpu(dtype, layout, shape):
    x = _edge_values(shape[-2] * (shape[0] if len(shape) == 3 else 1), shape[-1]).reshape(shape).to(dtype)
    gs = torch.tensor([37.5])
    gs_c = gs.to(CUDA)
    for cpu, gpu in ((t4.nvfp4_quantize(x, gs, layout), t4.nvfp4_quantize(x.to(CUDA), gs_c, layout)),
                     (t4.mxfp4_quantize(x, layout), t4.mxfp4_quantize(x.to(CUDA), layout))):
        for c, g in zip(cpu, gpu):
            assert torch.equal(_bits(c), _bits(g).cpu())
    d, s = t4.nvfp4_quantize(x, gs, layout)
    deq = t4.fp4_dequantize(d, s, gs, sf_layout=layout, out_dtype=torch.float32)
    deq_c = t4.fp4_dequantize(d.to(CUDA), s.to(CUDA), gs_c, sf_layout=layout, out_dtype=torch.float32)
    assert torch.equal(deq.nan_to_num(7.0), deq_c.cpu().nan_to_num(7.0))


@pytest.mark.parametrize("scale", [1.0, 1e-30, 1e30, float("inf"), 0.0])
def test_compute_global_scale_cuda_equals_cpu(scale):
    x = torch.randn(300, 70) * scale
    assert torch.equal(t4.compute_global_scale(x), t4.compute_global_scale(x.to(CUDA)).cpu())


@pytest.mark.parametrize("fmt", [t4.NVFP4, t4.MXFP4])
def test_mm_fp4_cuda_equals_cpu_and_bound(fmt):
    a_q, a_s, a_hat = T.grid_exact_operand(33, 256, fmt)
    b_q, b_s, b_hat = T.grid_exact_operand(72, 256, fmt)
    out = t4.mm_fp4(a_q.to(CUDA), b_q.to(CUDA).T, a_s.to(CUDA), b_s.to(CUDA).T,
                    out_dtype=torch.float32, block_size=fmt.block_size)
    ref, _ = T.mm_reference(a_hat, b_hat)
    assert torch.equal(out.cpu().double(), ref)
    x = torch.randn(17, 128, dtype=torch.bfloat16)
    wq, ws, wgs = T.quantized_weight(40, 128, fmt)
    alpha = t4.nvfp4_alpha(None, wgs) if wgs is not None else None
    cpu = t4.mm_fp4(x, wq.T, None, ws.T, alpha, block_size=fmt.block_size)
    gpu = t4.mm_fp4(x.to(CUDA), wq.to(CUDA).T, None, ws.to(CUDA).T,
                    None if alpha is None else alpha.to(CUDA), block_size=fmt.block_size)
    assert torch.equal(cpu, gpu.cpu())


def test_fused_moe_cuda_equals_cpu():
    kw = T.moe_problem(tokens=20, experts=6, top_k=3)
    cpu = t4.fused_moe(**kw)
    gpu = t4.fused_moe(**{k: v.to(CUDA) for k, v in kw.items()}, backend="reference")
    assert torch.equal(cpu, gpu.cpu())


def test_route_cuda_equals_cpu():
    logits = torch.randn(64, 32)
    bias = torch.randn(32) * 0.1
    for kw in (dict(method="softmax", renormalize=True), dict(method="renormalize"),
               dict(method="deepseek_v3", bias=bias, n_group=4, topk_group=2, routed_scaling_factor=2.5)):
        cpu = t4.route(logits, 4, **kw)
        gpu = t4.route(logits.to(CUDA), 4, backend="reference",
                       **{k: (v.to(CUDA) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()})
        assert torch.equal(cpu[0], gpu[0].cpu())
        torch.testing.assert_close(cpu[1], gpu[1].cpu(), rtol=2e-6, atol=1e-7)


def test_cuda_graph_capture_replay_equals_eager():
    x = torch.randn(64, 256, dtype=torch.bfloat16, device=CUDA)
    wq, ws, wgs = T.quantized_weight(96, 256, device=CUDA)
    moe = {k: v.to(CUDA) for k, v in T.moe_problem(tokens=64, hidden=256).items()}
    moe["x"] = x

    def step():
        gs = t4.compute_global_scale(x)
        xq, xs = t4.nvfp4_quantize(x, gs)
        y = t4.mm_fp4(xq, wq.T, xs, ws.T, t4.nvfp4_alpha(gs, wgs))
        return y, t4.fused_moe(**moe)

    eager = step()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # warm-up on a side stream, as CUDA graph capture requires
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    x.copy_(torch.randn_like(x))
    graph.replay()
    new_eager = step()
    for c, e in zip(captured, new_eager):
        assert torch.equal(c, e)
    assert not torch.equal(eager[0], new_eager[0])
