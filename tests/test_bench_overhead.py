"""CPU checks of `bench overhead`'s timing (torch_fp4/bench/overhead.py): rounds interleave the
cases, and each op's "over empty" pairs it with the empty op of the same round."""
import torch

from torch_fp4.bench import overhead as O


def test_rounds_time_every_case_once_in_order():
    order = []
    fns = [lambda i=i: order.append(i) for i in range(3)]
    samples = O.interleaved_us(fns, torch.device("cpu"), calls=2, rounds=4)
    assert [len(s) for s in samples] == [4, 4, 4]
    assert all(v >= 0 for s in samples for v in s)
    timed = order[30:]   # after 10 warm-up calls of each
    assert timed == [i for _ in range(4) for i in range(3) for _ in range(2)]


def test_over_empty_is_the_median_of_same_round_differences(monkeypatch):
    # per round: F.linear, the empty ops, then the ops; the host slows down in rounds 2 and 3
    monkeypatch.setattr(O, "interleaved_us", lambda fns, dev: [
        [10.0 * f for f in (1, 1, 3, 3, 1)] if i == 0 else
        [5.0 * f for f in (1, 1, 3, 3, 1)] if O.cases(dev)[i].name.startswith("empty") else
        [5.0 * f + 4.0 for f in (1, 1, 3, 3, 1)] for i in range(len(fns))])
    rows = O.run("cpu")
    fp4 = [r for r in rows if r["over_empty_us"] is not None]
    assert fp4 and all(abs(r["over_empty_us"] - 4.0) < 1e-9 for r in fp4)
    assert all(r["rounds"] == 5 for r in rows)
