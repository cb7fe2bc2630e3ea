"""`bench mm` (torch_fp4/bench/mm.py) without a GPU: with the timer replaced by one that runs each
input once, every column cycles through `timing.rotation` copies of its operands, the weight
copies in memory of their own (no call finds its weights cached by the one before)."""
import torch

import torch_fp4.bench.mm as B


def test_every_column_cycles_through_rotation_copies_of_its_operands(monkeypatch):
    timed = []

    def run_each_input(fn, inputs, *args, **kwargs):
        for call_args in inputs:
            fn(*call_args)
        timed.append(inputs)
        return 1.0

    monkeypatch.setattr(B, "graph_time_us", run_each_input)
    monkeypatch.setattr(B, "rotation", lambda nbytes, device: 3)
    monkeypatch.setattr(B, "copy_bandwidth_gbs", lambda device: 1000.0)
    monkeypatch.setattr(B, "SHAPES", ((256, 128),))
    monkeypatch.setattr(B, "quack_w4a16", lambda w_data, w_scale, n, k: (lambda a: a.sum()))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "cpu")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    rows = B.run(ms=(2,), device=torch.device("cpu"))
    assert len(rows) == 1
    # W4A16 row-major and "sm90", W4A4, W4A4 codes, bf16, fp8, quack: three inputs each.
    assert len(timed) == 7 and all(len(inputs) == 3 for inputs in timed)
    problems = [inputs[0] for inputs in timed[0]]
    assert len({p.w_data.data_ptr() for p in problems}) == 3
    assert len({p.a.data_ptr() for p in problems}) == 3
    assert all(torch.equal(p.w_data, problems[0].w_data) for p in problems)
