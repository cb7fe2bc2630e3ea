"""`bench mm` (torch_fp4/bench/mm.py) without a GPU: with the timer replaced by one that runs each
input once, every column cycles through `timing.rotation` copies of its operands, the weight
copies in memory of their own (no call finds its weights cached by the one before), and the
columns are timed in interleaved rounds (every other one reversed), each reporting its median."""
import pytest
import torch

import torch_fp4.bench.mm as B


def test_every_column_cycles_through_rotation_copies_of_its_operands(monkeypatch):
    timed, names = [], []

    def run_each_input(fn, inputs, *args, **kwargs):
        for call_args in inputs:
            fn(*call_args)
        timed.append(inputs)
        names.append(fn.__qualname__)
        return float(len(timed))  # the timing's place in the run

    monkeypatch.setattr(B, "graph_time_us", run_each_input)
    monkeypatch.setattr(B, "rotation", lambda nbytes, device: 3)
    monkeypatch.setattr(B, "copy_bandwidth_gbs", lambda device: 1000.0)
    monkeypatch.setattr(B, "SHAPES", ((256, 128),))
    monkeypatch.setattr(B, "quack_w4a16", lambda w_data, w_scale, n, k: (lambda a: a.sum()))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "cpu")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    rows = B.run(ms=(2,), device=torch.device("cpu"), rounds=3)
    assert len(rows) == 1
    # W4A16 row-major and "sm90", W4A4, W4A4 codes, bf16, fp8, quack: three inputs each, in turn,
    # three rounds, the second in reverse order; each column reports its median (column i of 7:
    # places i + 1, 14 - i and 15 + i in the run, so its second round's).
    assert len(timed) == 21 and all(len(inputs) == 3 for inputs in timed)
    assert len(set(names[:7])) == 7 and names[:7] == names[7:14][::-1] == names[14:]
    assert rows[0]["w4a16_us"] == 14.0 and rows[0]["sm90_us"] == 13.0 and rows[0]["quack_us"] == 8.0
    problems = [inputs[0] for inputs in timed[0]]
    assert len({p.w_data.data_ptr() for p in problems}) == 3
    assert len({p.a.data_ptr() for p in problems}) == 3
    assert all(torch.equal(p.w_data, problems[0].w_data) for p in problems)


def test_rounds_below_one_is_refused_by_name():
    with pytest.raises(ValueError, match="rounds must be at least 1, got 0"):
        B.run(ms=(2,), device=torch.device("cpu"), rounds=0)


def test_rotated_operands_are_copies_in_memory_of_their_own(monkeypatch):
    """bench.mm.rotated (the A/B scripts' operands): timing.rotation copies of one weight, each with
    its Problem (activations of its own) and its "sm90" prepack, and as many bf16 weight copies."""
    monkeypatch.setattr(B, "rotation", lambda nbytes, device: 3)
    r = B.rotated(2, 256, 128, torch.device("cpu"))
    assert len(r.weights) == len(r.problems) == len(r.packs) == len(r.bf16) == 3
    assert len({w[0].data_ptr() for w in r.weights}) == 3 and len({b.data_ptr() for b in r.bf16}) == 3
    assert all(torch.equal(w[0], r.weights[0][0]) for w in r.weights)
    assert all(p.w_data is w[0] for p, w in zip(r.problems, r.weights))
    assert len({p.a.data_ptr() for p in r.problems}) == 3
    assert all(torch.equal(pk, B.ops.prepack_weight(w[0])) for pk, w in zip(r.packs, r.weights))
    assert all(torch.equal(b, r.bf16[0]) and b.shape == (256, 128) for b in r.bf16)
