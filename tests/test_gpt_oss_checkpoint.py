"""gpt-oss MXFP4 expert tensors <-> MXFP4Experts (torch_fp4/gpt_oss_checkpoint.py)."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

from torch_fp4.gpt_oss_checkpoint import GPT_OSS_NAMES, load_gpt_oss_experts, save_gpt_oss_experts
from torch_fp4.testing import gpt_oss_decode, gpt_oss_expert_tensors


@pytest.mark.parametrize("h", [96, 2880])
def test_load_is_the_checkpoint_in_torch_fp4_layout_and_save_inverts_it(h):
    e, i, prefix = 2, 64, "model.layers.3.mlp.experts"
    t = gpt_oss_expert_tensors(e, h, i, prefix=prefix)
    x = load_gpt_oss_experts(t, prefix)
    assert (x.num_experts, x.hidden_size, x.intermediate_size) == (e, h, i)
    w1, w2 = x.dequantize()
    fc1 = gpt_oss_decode(t[f"{prefix}.gate_up_proj_blocks"], t[f"{prefix}.gate_up_proj_scales"])   # [E, 2I, H] interleaved
    gate, up = fc1[:, 0::2], fc1[:, 1::2]
    assert torch.equal(w1.double(), torch.cat([gate, up], dim=1))
    assert torch.equal(w2.double(), gpt_oss_decode(t[f"{prefix}.down_proj_blocks"], t[f"{prefix}.down_proj_scales"]))
    bias = t[f"{prefix}.gate_up_proj_bias"]
    assert torch.equal(x.w1_bias, torch.cat([bias[:, 0::2], bias[:, 1::2]], dim=1))
    back = save_gpt_oss_experts(x, prefix)
    assert back.keys() == t.keys()
    for k in t:
        assert back[k].dtype == t[k].dtype and torch.equal(back[k], t[k]), k


def test_matches_transformers_own_decode():
    mxfp4 = pytest.importorskip("transformers.integrations.mxfp4")
    e, h, i, prefix = 2, 96, 64, "x"
    t = gpt_oss_expert_tensors(e, h, i, prefix=prefix)
    x = load_gpt_oss_experts(t, prefix)
    # transformers' dense gate_up_proj is [E, H, 2I] with gate and up interleaved on the last dim
    dense = mxfp4.convert_moe_packed_tensors(t["x.gate_up_proj_blocks"], t["x.gate_up_proj_scales"],
                                            dtype=torch.float32)
    gate, up = dense[..., 0::2].transpose(1, 2), dense[..., 1::2].transpose(1, 2)
    w1, w2 = x.dequantize()
    assert torch.equal(w1, torch.cat([gate, up], dim=1))
    down = mxfp4.convert_moe_packed_tensors(t["x.down_proj_blocks"], t["x.down_proj_scales"], dtype=torch.float32)
    assert torch.equal(w2, down.transpose(1, 2))


@settings(max_examples=25, deadline=None)
@given(e=st.integers(1, 3), hb=st.integers(1, 5), ib=st.integers(1, 4), seed=st.integers(0, 2**16),
       bias=st.sampled_from([torch.bfloat16, torch.float32]))
def test_round_trip_any_shape(e, hb, ib, seed, bias):
    t = gpt_oss_expert_tensors(e, 32 * hb, 32 * ib, seed=seed, prefix="", bias_dtype=bias)
    t = {k.lstrip("."): v for k, v in t.items()}
    back = save_gpt_oss_experts(load_gpt_oss_experts(t, ""), "")
    assert all(torch.equal(back[k], t[k]) and back[k].dtype == t[k].dtype for k in t)


def test_errors_name_the_tensor():
    prefix = "m.experts"
    t = gpt_oss_expert_tensors(2, 64, 32, prefix=prefix)
    for name in GPT_OSS_NAMES:
        missing = {k: v for k, v in t.items() if k != f"{prefix}.{name}"}
        with pytest.raises(ValueError, match=f"{prefix}.{name}"):
            load_gpt_oss_experts(missing, prefix)
    bad = dict(t, **{f"{prefix}.gate_up_proj_scales": t[f"{prefix}.gate_up_proj_scales"].float()})
    with pytest.raises(TypeError, match="gate_up_proj_scales"):
        load_gpt_oss_experts(bad, prefix)
    bad = dict(t, **{f"{prefix}.down_proj_blocks": t[f"{prefix}.down_proj_blocks"][:, :, :0]})
    with pytest.raises(ValueError, match="down_proj_blocks"):
        load_gpt_oss_experts(bad, prefix)
    bad = dict(t, **{f"{prefix}.down_proj_bias": t[f"{prefix}.down_proj_bias"][:, :3]})
    with pytest.raises(ValueError, match="down_proj_bias"):
        load_gpt_oss_experts(bad, prefix)
    with pytest.raises(TypeError, match="MXFP4Experts"):
        save_gpt_oss_experts(t, prefix)
