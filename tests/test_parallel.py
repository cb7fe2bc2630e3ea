"""Tensor- and expert-parallel FP4 modules (torch_fp4/nn/parallel.py) on the CPU: gloo process
groups of 2 and 4 processes spawned by the test (bounded in time), each rank checking its result
against the single-process module it was cut from."""
import copy
import os
import tempfile
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import torch_fp4 as t4
from torch_fp4 import testing as T
from torch_fp4.nn import FP4Linear, FP4MoE
from torch_fp4.nn import parallel as P

BF16 = torch.bfloat16
TIMEOUT_S = 240


DEV = torch.device("cpu")           # this rank's device: the CPU (gloo) or its GPU (NCCL)


def _worker(rank: int, world: int, store: str, check: str, backend: str) -> None:
    global DEV
    if backend == "nccl":
        DEV = torch.device("cuda", rank)
        torch.cuda.set_device(DEV)
    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)          # every rank builds the same whole module
        globals()[check](rank, world)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _spawn(world: int, check: str, backend: str = "gloo") -> None:
    """Run check(rank, world) in `world` spawned processes of one process group (gloo on the CPU,
    or NCCL with one GPU each); a failure in any rank fails the test, as does running past
    TIMEOUT_S."""
    with tempfile.TemporaryDirectory() as tmp:
        ctx = mp.start_processes(_worker, args=(world, os.path.join(tmp, "store"), check, backend),
                                 nprocs=world, join=False, start_method="spawn")
        deadline = time.monotonic() + TIMEOUT_S
        while not ctx.join(timeout=5):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    p.kill()
                raise AssertionError(f"{check} on {world} ranks ran past {TIMEOUT_S} s")


def _linear(fmt="nvfp4", activations="bf16", n=96, k=128, bias=True) -> FP4Linear:
    dense = torch.nn.Linear(k, n, bias=bias).to(BF16).to(DEV)
    return FP4Linear.from_linear(dense, fmt, activations)


def _randn(*shape) -> torch.Tensor:
    return torch.randn(*shape).to(BF16).to(DEV)


# ---------------------------------------------------------------------------------------------
# Checks run in every rank
# ---------------------------------------------------------------------------------------------
def check_column_parallel_equals_whole_layer(rank, world):
    x = _randn(5, 128)
    for fmt, act in (("nvfp4", "bf16"), ("mxfp4", "bf16"), ("nvfp4", "fp4"), ("mxfp4", "fp4")):
        whole = _linear(fmt, act)
        tp = P.TensorParallelFP4Linear(whole, "column", gather_output=True)
        assert torch.equal(tp(x), whole(x)), (fmt, act)    # each output column is the same GEMM
        part = P.TensorParallelFP4Linear(whole, "column")(x)
        assert torch.equal(part, whole(x)[:, rank * 96 // world:(rank + 1) * 96 // world])


def check_row_parallel_within_bound_and_exact_on_grid(rank, world):
    x = _randn(5, 128)
    for fmt in ("nvfp4", "mxfp4"):
        whole = _linear(fmt, "bf16", bias=False)
        tp = P.TensorParallelFP4Linear(whole, "row", input_is_parallel=False)
        out = tp(x)
        w_hat = t4.fp4_dequantize(whole.weight, whole.weight_scale, whole.weight_global_scale
                                  if fmt == "nvfp4" else None, block_size=16 if fmt == "nvfp4" else 32,
                                  out_dtype=torch.float32)
        T.assert_mm_within_bound(out, x.float(), w_hat)
        # the same with this rank's K slice as input
        part = 128 // world
        assert torch.equal(P.TensorParallelFP4Linear(whole, "row")(x[:, rank * part:(rank + 1) * part]), out)
    # grid-exact operands: every partial sum is exact, so the result is the whole layer's, bit for bit
    g = torch.Generator().manual_seed(3)
    data, scale, _ = T.grid_exact_operand(64, 128, t4.NVFP4, generator=g)
    whole = FP4Linear(128, 64, bias=True)
    whole.set_quantized(data, scale, torch.ones(1))
    whole.bias.data.copy_(torch.arange(64).to(BF16))
    whole = whole.to(DEV)
    xg = torch.randint(-3, 4, (5, 128)).to(BF16).to(DEV)
    assert torch.equal(P.TensorParallelFP4Linear(whole, "row", input_is_parallel=False)(xg), whole(xg))
    # W4A4 with a fixed activation scale: every rank quantizes its K slice with the same scale
    w4a4 = _linear("nvfp4", "fp4", bias=True)
    w4a4.calibrate(x)
    out = P.TensorParallelFP4Linear(w4a4, "row", input_is_parallel=False)(x)
    assert (out.float() - w4a4(x).float()).abs().max() <= 0.02 * w4a4(x).float().abs().max()


def check_refusals(rank, world):
    whole = _linear("nvfp4", "bf16", n=96, k=48)     # K shard of 48 / world: not whole blocks
    with pytest.raises(ValueError, match="in_features"):
        P.TensorParallelFP4Linear(whole, "row")
    with pytest.raises(ValueError, match="fixed activation scale"):
        P.TensorParallelFP4Linear(_linear("nvfp4", "fp4"), "row")      # per-call scale
    with pytest.raises(ValueError, match="style"):
        P.shard_fp4_linear(_linear(), "diagonal", rank, world)


def check_shards_are_the_shards_quantization(rank, world):
    """Sharding the quantized weight gives the bytes of quantizing the shard with the same
    global scale (NVFP4) or by itself (MXFP4)."""
    w = torch.randn(96, 128).to(BF16)
    gs = t4.compute_global_scale(w)
    whole = FP4Linear(128, 96, bias=False)
    whole.set_weight(w)
    n, k = 96 // world, 128 // world
    for style, w_part in (("column", w[rank * n:(rank + 1) * n]), ("row", w[:, rank * k:(rank + 1) * k])):
        shard = P.shard_fp4_linear(whole, style, rank, world)
        data, scale = t4.nvfp4_quantize(w_part.contiguous(), gs)
        assert torch.equal(shard.weight, F_row(shard)), style
        assert torch.equal(F_row(shard), data.view(torch.uint8)), style
        assert torch.equal(shard.weight_scale, scale.view(torch.uint8)), style
        assert torch.equal(shard.weight_global_scale, gs)


def F_row(layer):
    from torch_fp4 import formats as F
    return F.from_weight_layout(layer.weight, layer.weight_layout)


def _moe(activations="bf16", experts=8, top_k=2) -> FP4MoE:
    h, i = 64, 64
    router = torch.nn.Linear(h, experts, bias=False).to(BF16).to(DEV)
    w1 = (torch.randn(experts, 2 * i, h) / 8).to(BF16).to(DEV)
    w2 = (torch.randn(experts, h, i) / 8).to(BF16).to(DEV)
    calib = _randn(32, h) if activations == "fp4" else None
    return FP4MoE.from_experts(router, w1, w2, top_k=top_k, renormalize=True, activations=activations,
                               calibration=calib)


def check_expert_parallel_moe(rank, world):
    x = _randn(3, 7, 64)
    for act in ("bf16", "fp4"):
        whole = _moe(act)
        ep = P.ExpertParallelFP4MoE(whole, )
        assert ep.local_experts == 8 // world and ep.offset == rank * 8 // world
        got, want = ep(x), whole(x)
        if world == 2:   # a token's two slots land on at most two ranks: the fp32 sum is the same
            assert torch.equal(got, want), act
        else:
            assert (got.float() - want.float()).abs().max() <= 0.01 * want.float().abs().max(), act
    # traced whole by torch.compile (functional collectives, no graph break)
    torch._dynamo.reset()
    compiled = torch.compile(ep, fullgraph=True, backend="eager")
    assert torch.equal(compiled(x), ep(x))


def check_expert_parallel_gpt_oss(rank, world):
    """A gpt-oss layer (MXFP4 experts, biases on both GEMMs, the clamped SwiGLU) split over the
    ranks: each rank's experts keep their biases, and the all-reduced sum is the whole layer's."""
    e, h, i = 8, 64, 32
    moe = FP4MoE(h, i, e, 2, "renormalize", fmt="mxfp4", expert_bias=True, activation="clamped_swiglu",
                 device=DEV)
    moe.router = torch.nn.Linear(h, e, bias=True).to(BF16).to(DEV)
    moe.set_weights((torch.randn(e, 2 * i, h) / 8).to(DEV), (torch.randn(e, h, i) / 8).to(DEV))
    moe.w1_bias.copy_(torch.randn(e, 2 * i).to(DEV))
    moe.w2_bias.copy_(torch.randn(e, h).to(DEV))
    ep = P.ExpertParallelFP4MoE(moe)
    lo = rank * e // world
    assert torch.equal(ep.moe.w2_bias, moe.w2_bias[lo:lo + e // world])
    x = _randn(5, h)
    got, want = ep(x), moe(x)
    if world == 2:
        assert torch.equal(got, want)
    else:
        assert (got.float() - want.float()).abs().max() <= 0.01 * want.float().abs().max()


def check_expert_parallel_sharded_tokens(rank, world):
    """Each rank's own tokens through the expert-parallel MoE (gather, local experts,
    reduce-scatter) give what the whole FP4MoE gives for them."""
    whole = _moe()
    torch.manual_seed(100 + rank)                 # different tokens on every rank, same count
    x = _randn(2, 5, 64)
    got = P.ExpertParallelFP4MoE(whole, tokens="sharded")(x)
    want = whole(x)
    if world == 2:
        assert torch.equal(got, want)
    else:
        assert (got.float() - want.float()).abs().max() <= 0.01 * want.float().abs().max()
    with pytest.raises(ValueError, match="tokens"):
        P.ExpertParallelFP4MoE(whole, tokens="scattered")


def check_tensor_parallel_moe(rank, world):
    x = _randn(9, 64)
    for act in ("bf16", "fp4"):
        whole = _moe(act)
        tp = P.TensorParallelFP4MoE(whole)
        got, want = tp(x).float(), whole(x).float()
        # each rank's FC2 output rounds a partial sum over its intermediate slice to bf16
        assert (got - want).norm() <= 0.02 * want.norm(), act
    _sm90_experts_split_like_row_major(rank, world)
    with pytest.raises(ValueError, match="intermediate_size"):
        P.TensorParallelFP4MoE(FP4MoE(64, 48, 4, 2, device=DEV))   # 48 / world: not whole blocks


def check_transformers_blocks(rank, world):
    """A quantized transformers MoE block (Mixtral: returns (hidden, router logits); DeepSeek-V3:
    routed plus shared experts) split over the ranks keeps its forward: expert-parallel equals the
    whole block bit for bit (top-2 over two ranks), tensor-parallel within rounding."""
    from torch_fp4.examples.hf_generate import random_model
    for family in ("mixtral", "deepseek_v3"):
        model = random_model(family, 0, DEV, size="tiny")
        t4.quantize_model(model, t4.QuantConfig())
        block = next(m for m in model.modules() if isinstance(m, FP4MoE))
        h = _randn(2, 5, model.config.hidden_size)
        want = block(h)
        got = P.ExpertParallelFP4MoE(block)(h)
        tp = P.TensorParallelFP4MoE(block)(h)
        if family == "mixtral":
            assert torch.equal(got[1], want[1]) and torch.equal(tp[1], want[1])    # router logits
            got, tp, want = got[0], tp[0], want[0]
        assert torch.equal(got, want), family
        assert (tp.float() - want.float()).norm() <= 0.02 * want.float().norm(), family


def check_cuda_graph_replay_equals_eager(rank, world):
    """On GPUs: the expert-parallel MoE and a row-parallel layer captured in one CUDA graph (NCCL
    all-reduces inside), replayed on new inputs, give the eager results."""
    moe = P.ExpertParallelFP4MoE(_moe())
    row = P.TensorParallelFP4Linear(_linear(bias=False), "row", input_is_parallel=False)
    x, xl = _randn(6, 64), _randn(6, 128)
    for _ in range(2):                      # warm-up (kernel builds, NCCL setup)
        moe(x), row(xl)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y_moe, y_row = moe(x), row(xl)
    for seed in (1, 2):
        torch.manual_seed(seed)
        x.copy_(_randn(6, 64))
        xl.copy_(_randn(6, 128))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y_moe, moe(x)) and torch.equal(y_row, row(xl)), seed


# ---------------------------------------------------------------------------------------------
def _sm90_experts_split_like_row_major(rank, world):
    """An FP4MoE keeping "sm90" experts splits as its row-major twin: expert parallelism keeps each
    rank's whole experts in that layout (state_dict row-major), tensor parallelism slices the
    row-major bytes; the outputs are the twin's parallel outputs."""
    h, i, e = 128, 256, 8
    router = torch.nn.Linear(h, e, bias=False).to(BF16).to(DEV)
    w1, w2 = (torch.randn(e, 2 * i, h) / 8).to(DEV), (torch.randn(e, h, i) / 8).to(DEV)
    row = FP4MoE.from_experts(router, w1, w2, top_k=2, renormalize=True)
    sm90 = copy.deepcopy(row)
    sm90.set_weight_layout("sm90")
    x = _randn(6, h)
    ep_row, ep = P.ExpertParallelFP4MoE(row), P.ExpertParallelFP4MoE(sm90)
    assert ep.moe.weight_layout == "sm90" and torch.equal(ep(x), ep_row(x))
    assert torch.equal(ep.moe.state_dict()["w1"], ep_row.moe.w1)
    tp_row, tp = P.TensorParallelFP4MoE(row), P.TensorParallelFP4MoE(sm90)
    assert tp.moe.weight_layout == "row" and torch.equal(tp.moe.w1, tp_row.moe.w1)
    assert torch.equal(tp(x), tp_row(x))


# The tests
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("check", ["check_column_parallel_equals_whole_layer",
                                   "check_row_parallel_within_bound_and_exact_on_grid",
                                   "check_refusals", "check_shards_are_the_shards_quantization",
                                   "check_expert_parallel_moe", "check_expert_parallel_sharded_tokens",
                                   "check_tensor_parallel_moe", "check_expert_parallel_gpt_oss"])
def test_two_ranks(check):
    _spawn(2, check)


def test_two_ranks_transformers_blocks():
    transformers = pytest.importorskip("transformers")
    if not (4, 57) <= tuple(int(v) for v in transformers.__version__.split(".")[:2]) < (5, 0):
        pytest.skip(f"transformers {transformers.__version__} is outside the tested range >=4.57,<5")
    _spawn(2, "check_transformers_blocks")


@pytest.mark.parametrize("check", ["check_expert_parallel_moe", "check_expert_parallel_sharded_tokens",
                                   "check_row_parallel_within_bound_and_exact_on_grid"])
def test_four_ranks(check):
    _spawn(4, check)


@pytest.mark.gpu
@pytest.mark.parametrize("check", ["check_column_parallel_equals_whole_layer",
                                   "check_row_parallel_within_bound_and_exact_on_grid",
                                   "check_expert_parallel_moe", "check_expert_parallel_sharded_tokens",
                                   "check_tensor_parallel_moe", "check_cuda_graph_replay_equals_eager"])
def test_two_gpus_nccl(check):
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 GPUs, found {torch.cuda.device_count()}")
    _spawn(2, check, "nccl")


def test_needs_a_process_group():
    if dist.is_initialized():
        pytest.skip("a process group exists in this process")
    with pytest.raises(RuntimeError, match="process group"):
        P.ExpertParallelFP4MoE(_moe())
