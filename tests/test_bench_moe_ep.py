"""`bench moe --ep N` (torch_fp4/bench/moe_ep.py) without GPUs: the CLI refuses with a clear
message, the bf16 EP peer's per-rank expert computation summed over the ranks is the dense MoE,
and the whole layer every rank builds runs."""
import subprocess
import sys

import pytest
import torch

from torch_fp4.__main__ import main
from torch_fp4.bench import moe_ep
from torch_fp4.bench.moe import Model, _grouped_mm_works, grouped_experts_fp32

BF16 = torch.bfloat16
CPU = torch.device("cpu")
needs_grouped_mm = pytest.mark.skipif(not _grouped_mm_works(CPU),
                                      reason="torch._grouped_mm does not run on this CPU build")


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="this machine has the GPUs")
def test_cli_without_gpus_is_a_clear_error(capsys):
    found = torch.cuda.device_count()
    with pytest.raises(SystemExit) as exc:
        main(["bench", "moe", "--ep", "2", "--quick"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"bench moe --ep 2: needs 2 GPUs, found {found}" in err
    assert "Traceback" not in err


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="this machine has the GPUs")
def test_cli_subprocess_exits_with_the_message():
    proc = subprocess.run([sys.executable, "-m", "torch_fp4", "bench", "moe", "--ep", "2"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert "needs 2 GPUs, found" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("argv, message", [
    (["--ep", "1"], "expected at least 2 GPUs, got --ep 1"),
    (["--ep", "3"], "Qwen3-30B-A3B's 128 experts do not split evenly over 3 GPUs"),
    (["--ep", "2", "--models", "Mixtral-8x7B,Llama"], "expected names among"),
    (["--ep", "2", "--models", "gpt-oss-20b"], "runs NVFP4 experts only"),
])
def test_cli_refusals_before_any_gpu(argv, message, capsys):
    with pytest.raises(SystemExit):
        main(["bench", "moe", *argv])
    assert message in capsys.readouterr().err


def _dense_moe(x, ids, weights, w1, w2):
    """Every (token, slot) pair one at a time, in fp32 from the bf16 operands."""
    out = torch.zeros(x.shape[0], w2.shape[1])
    inter = w2.shape[2]
    for t in range(ids.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            h = w1[e].float() @ x[t].float()
            a = torch.nn.functional.silu(h[:inter]) * h[inter:]
            out[t] += weights[t, j] * (w2[e].float() @ a)
    return out


@needs_grouped_mm
@pytest.mark.parametrize("experts, top_k, tokens", [(8, 2, 13), (16, 4, 33), (8, 2, 1)])
def test_local_experts_summed_over_two_ranks_is_the_dense_moe(experts, top_k, tokens):
    hidden, inter, world = 64, 32, 2
    g = torch.Generator().manual_seed(experts + tokens)
    x = torch.randn(tokens, hidden, generator=g).to(BF16)
    w1 = (torch.randn(experts, 2 * inter, hidden, generator=g) / 8).to(BF16)
    w2 = (torch.randn(experts, hidden, inter, generator=g) / 8).to(BF16)
    logits = torch.randn(tokens, experts, generator=g)
    weights, ids = torch.softmax(logits, -1).topk(top_k, -1)
    ids = ids.to(torch.int32)
    per = experts // world
    parts = [grouped_experts_fp32(x, ids, weights, w1[r * per:(r + 1) * per].contiguous(),
                                  w2[r * per:(r + 1) * per].contiguous(), r * per, masked=True)
             for r in range(world)]
    for p in parts:
        assert p.dtype == torch.float32 and p.shape == (tokens, hidden) and torch.isfinite(p).all()
    want = _dense_moe(x, ids, weights, w1, w2)
    got = sum(parts)
    assert (got - want).norm() <= 0.02 * want.norm()


@needs_grouped_mm
def test_local_experts_of_a_rank_no_pair_reaches_is_zero():
    """All pairs routed to the other rank's experts: no group holds a row, everything the
    grouped GEMMs leave unwritten is dropped."""
    x = torch.randn(6, 64).to(BF16)
    w1, w2 = torch.randn(4, 64, 64).to(BF16), torch.randn(4, 64, 32).to(BF16)
    ids = torch.randint(0, 4, (6, 2), dtype=torch.int32)
    part = grouped_experts_fp32(x, ids, torch.rand(6, 2), w1, w2, offset=4, masked=True)
    assert torch.equal(part, torch.zeros(6, 64))


@pytest.mark.parametrize("model", [
    Model("tiny", 8, 64, 32, 2, "softmax", {"renormalize": True}),
    Model("tiny-deepseek", 16, 64, 32, 4, "deepseek_v3",
          {"n_group": 4, "topk_group": 2, "routed_scaling_factor": 2.5}),
])
def test_whole_layer_is_the_same_on_every_build_and_runs(model):
    a, b = moe_ep.whole_layer(model, CPU), moe_ep.whole_layer(model, CPU)
    for name, buf in a.state_dict().items():
        assert torch.equal(buf, b.state_dict()[name]), name
    assert a.method == model.method and a.top_k == model.top_k
    y = a(torch.randn(5, model.hidden).to(BF16))
    assert y.shape == (5, model.hidden) and torch.isfinite(y.float()).all()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the ranks would run the benchmark")
def test_a_failing_rank_ends_the_run_with_an_error():
    """The parent's spawn and join: ranks that cannot start (no GPU here) end the run with a
    RuntimeError naming the failure, none left running."""
    settings = moe_ep.Settings(2, (Model("tiny", 8, 64, 32, 2, "softmax"),), (1,))
    with pytest.raises(RuntimeError, match="bench moe --ep 2: a rank failed"):
        moe_ep._spawn(settings)


@needs_grouped_mm
def test_gpt_oss_peer_adds_the_biases_and_clamps():
    """bench moe's gpt-oss rows: the bf16 peer with biases and the clamped SwiGLU is the dense
    gpt-oss MoE (biases after each GEMM, gate clamped above at 7, up to [-7, 7])."""
    experts, hidden, inter, top_k, tokens = 8, 64, 32, 4, 11
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(tokens, hidden, generator=g) * 4).to(BF16)
    w1 = (torch.randn(experts, 2 * inter, hidden, generator=g) / 2).to(BF16)
    w2 = (torch.randn(experts, hidden, inter, generator=g) / 8).to(BF16)
    b1 = torch.randn(experts, 2 * inter, generator=g).to(BF16)
    b2 = torch.randn(experts, hidden, generator=g).to(BF16)
    weights, ids = torch.softmax(torch.randn(tokens, experts, generator=g), -1).topk(top_k, -1)
    ids = ids.to(torch.int32)
    want = torch.zeros(tokens, hidden)
    clamped = 0
    for t in range(tokens):
        for j in range(top_k):
            e = int(ids[t, j])
            h = w1[e].float() @ x[t].float() + b1[e].float()
            gate, up = h[:inter], h[inter:]
            clamped += int((gate > 7).sum() + (up.abs() > 7).sum())
            gate, up = gate.clamp(max=7), up.clamp(-7, 7)
            a = (up + 1) * gate * torch.sigmoid(1.702 * gate)
            want[t] += weights[t, j] * (w2[e].float() @ a + b2[e].float())
    assert clamped > 0   # the data exercises the clamp
    got = grouped_experts_fp32(x, ids, weights, w1, w2, b1=b1, b2=b2, clamped=True)
    assert (got - want).norm() <= 0.02 * want.norm()
    unclamped = grouped_experts_fp32(x, ids, weights, w1, w2, b1=b1, b2=b2)
    assert (unclamped - want).norm() > 0.05 * want.norm()


def test_gpt_oss_bench_weights_are_fused_moe_inputs():
    """bench moe's gpt-oss experts (MXFP4 codes, e8m0 128x4 scales, no global scales, biases)
    pass fused_moe's validation and give finite outputs on the reference."""
    from torch_fp4 import ops
    from torch_fp4.bench.moe import MODELS, _fp4_experts, _gpt_oss_kwargs
    m = next(m for m in MODELS if m.name == "gpt-oss-20b")
    tiny = Model("tiny-gpt-oss", 4, 96, 64, 2, m.method, m.route_kw, gpt_oss=True)
    g = torch.Generator().manual_seed(0)
    w1 = _fp4_experts(4, 2 * tiny.inter, tiny.hidden, CPU, g, tiny.block_size)
    w2 = _fp4_experts(4, tiny.hidden, tiny.inter, CPU, g, tiny.block_size)
    assert w1[2] is None and w1[1].dtype == torch.float8_e8m0fnu
    extra = _gpt_oss_kwargs(tiny, 4, CPU, g)
    x = torch.randn(3, tiny.hidden).to(BF16)
    ids, tw = ops.route(torch.randn(3, 4), 2, "softmax", renormalize=True)
    y = ops.fused_moe(x, *w1, *w2, ids, tw, **extra)
    assert y.shape == (3, tiny.hidden) and torch.isfinite(y.float()).all()
