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


def test_shapes_parse_and_refuse_by_name():
    assert B.parse_shapes("4096,4096; 1024,4096") == ((4096, 4096), (1024, 4096))
    for bad in ("4096", "4096,4100", "0,4096", "a,b", "4096,4096,1", "4096,4096;"):
        with pytest.raises(ValueError, match="--shapes expects 'N,K;N,K;...'"):
            B.parse_shapes(bad)


def test_run_times_the_shapes_it_is_given(monkeypatch):
    seen = []

    def run_once(fn, inputs, *args, **kwargs):
        fn(*inputs[0])
        seen.append(inputs[0])
        return 1.0

    monkeypatch.setattr(B, "graph_time_us", run_once)
    monkeypatch.setattr(B, "rotation", lambda nbytes, device: 1)
    monkeypatch.setattr(B, "copy_bandwidth_gbs", lambda device: 1000.0)
    monkeypatch.setattr(B, "quack_w4a16", lambda w_data, w_scale, n, k: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "cpu")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    rows = B.run(ms=(2,), device=torch.device("cpu"), rounds=1, shapes=((128, 64), (256, 32)))
    assert [(r["n"], r["k"]) for r in rows] == [(128, 64), (256, 32)]
    problems = [args[0] for args in seen if isinstance(args[0], B.Problem)]
    assert {(p.n, p.k) for p in problems} == {(128, 64), (256, 32)}


def test_bf16_peer_of_the_ab_scripts_cycles_through_weight_copies(monkeypatch):
    """TacticWeight.bf16 (the peer of interleaved_rounds) times torch's matmul over rotation copies of
    the bf16 weight, in memory of their own: one weight reused call after call would be timed from
    the L2 whenever it fits there, while the FP4 operands beside it rotate."""
    timed = []

    def run_each_input(fn, inputs, *args, **kwargs):
        for call_args in inputs:
            fn(*call_args)
        timed.append(inputs)
        return 5.0

    monkeypatch.setattr(B, "graph_time_us", run_each_input)
    monkeypatch.setattr(B, "rotation", lambda nbytes, device: 3)
    w16 = torch.randn(256, 128, dtype=torch.bfloat16)
    copies = B.weight_copies(w16)
    assert len({c.data_ptr() for c in copies}) == 3 and all(torch.equal(c, w16) for c in copies)
    timer = B.bf16_timer(torch.randn(2, 128, dtype=torch.bfloat16), copies)
    assert timer() == 5.0
    assert [w.data_ptr() for w, in timed[0]] == [c.data_ptr() for c in copies]


def test_run_tactics_reports_each_tactic_beside_bf16_and_fp8(monkeypatch):
    """`bench mm --tactics`: every tactic's time with its speed-up over torch bf16, both peers timed
    over rotating weight copies."""
    import torch_fp4.bench.tune as T

    class Fake:
        def __init__(self, name):
            self.name = name

        def label(self):
            return self.name

    peer_inputs = []

    def peer_time(fn, inputs, *args, **kwargs):
        peer_inputs.append(len(inputs))
        return 8.0

    monkeypatch.setattr(B, "graph_time_us", peer_time)
    monkeypatch.setattr(B, "rotation", lambda nbytes, device: 2)
    monkeypatch.setattr(B.ops, "mm_fp4_tactics", lambda *a: [Fake("t1"), Fake("t2")])
    monkeypatch.setattr(T, "time_tactics", lambda cands, launch, args: [(cands[0], 4.0)])
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "cpu")
    rows = B.run_tactics(2, 256, 128, None, device=torch.device("cpu"))
    assert [r["tactic"] for r in rows] == ["t1", "t2"]
    assert all(r["us"] == 4.0 and r["bf16_us"] == 8.0 and r["fp8_us"] == 8.0 and r["x_bf16"] == 2.0 for r in rows)
    assert peer_inputs == [2, 2]


def test_cli_refuses_bad_shapes_by_name(capsys):
    from torch_fp4.__main__ import main
    with pytest.raises(SystemExit) as exc:
        main(["bench", "mm", "--shapes", "4096,100"])
    assert exc.value.code == 2 and "--shapes expects 'N,K;N,K;...'" in capsys.readouterr().err


def test_tactic_weight_ab_reports_medians_and_compares_bits(monkeypatch):
    """TacticWeight.ab (the A/B scripts' row): each tactic's and bf16's median over the interleaved
    rounds, and whether the two tactics give the same bits on grid-exact operands."""
    import torch_fp4.bench.tune as T

    def rounds(cands, launch, args, n, peer):
        assert n == 3 and peer is not None
        return {cands[0]: [4.0, 5.0, 6.0], cands[1]: [2.0, 3.0, 9.0]}, [8.0, 8.0, 7.0]

    monkeypatch.setattr(T, "interleaved_rounds", rounds)
    monkeypatch.setattr(B, "rotation", lambda nbytes, device: 1)
    wt = B.TacticWeight(256, 128, torch.device("cpu"), B.F.WeightLayout.ROW)

    class Fake:
        def __init__(self, name, bump):
            self.name, self.bump = name, bump

        def label(self):
            return self.name

    old, new, odd = Fake("old", 0.0), Fake("new", 0.0), Fake("odd", 1.0)
    wt.launch = lambda *args, tactic: args[0].float().sum() + tactic.bump
    r = wt.ab(2, old, new, rounds=3)
    assert (r["old_us"], r["new_us"], r["bf16_us"], r["new_over_old"]) == (5.0, 3.0, 8.0, 0.6)
    assert r["same_bits_exact"] and (r["old"], r["new"], r["m"], r["n"], r["k"]) == ("old", "new", 2, 256, 128)
    assert not wt.ab(2, old, odd, rounds=3)["same_bits_exact"]
    assert "new/old 0.600  exact bits same" in B.ab_line(r)
