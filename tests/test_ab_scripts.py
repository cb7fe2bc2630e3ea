"""The A/B and profiling scripts' parsing on the CPU: scripts/ab_tactics.py's tactic specs,
scripts/ab_tactic_rule.py's old functions (compiled together so that each calls the others' old
forms, not the module's current ones), and scripts/ncu_table.py's reading of ncu's CSV."""
import importlib.util
import types
from pathlib import Path

import pytest

from torch_fp4 import formats as F
from torch_fp4.bench.mm import meta_problem
from torch_fp4.kernels.cuda import mm_wgmma_tactics as WT

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def _script(name):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_tactic_specs_name_every_field_and_default_to_the_most_stages():
    ab = _script("ab_tactics")
    p = meta_problem(32, 28672, 8192, F.WeightLayout.SM90)
    t = ab.parse_tactic("bm32+p+kg2+sk", p)
    stages = WT.max_stages(32, WT.smem_limit(p), True, 2, ctas_per_sm=1, packed=True)
    assert t == WT.WgmmaMmTactic(32, stages, 1, True, 1, True, 2)
    assert ab.parse_tactic("bm64+s2+c2+st5", p) == WT.WgmmaMmTactic(64, 5, 2, False, 2)
    assert ab.parse_case("256,8192,8192/bm256+s2/bm128+p") == (256, 8192, 8192, ["bm256+s2", "bm128+p"])
    with pytest.raises(SystemExit, match="unknown tactic field"):
        ab.parse_tactic("bm32+fast", p)
    with pytest.raises(SystemExit, match="names no block_m"):
        ab.parse_tactic("p+sk", p)


def test_old_functions_call_each_others_old_forms(tmp_path):
    rule = _script("ab_tactic_rule")
    module = types.ModuleType("today")
    exec("SCALE = 10\ndef inner(x):\n    return 2 * x\ndef outer(x):\n    return inner(x) + SCALE\n", vars(module))
    base = tmp_path / "base.py"
    base.write_text("def inner(x):\n    return 3 * x\ndef outer(x):\n    return inner(x) + 1\n")
    old = rule.base_functions(str(base), ["outer", "inner"], module)
    assert old["outer"](1) == 4 and old["inner"](1) == 3 and module.outer(1) == 12
    alone = rule.base_functions(str(base), ["outer"], module)
    assert alone["outer"](1) == 3          # today's inner(1) = 2, plus the old outer's 1
    with pytest.raises(SystemExit, match="no function 'missing'"):
        rule.base_functions(str(base), ["missing"], module)


def test_latest_weight_builds_one_weight_per_shape_in_a_row():
    """bench.mm.LatestWeight keeps the last shape's TacticWeight and builds anew (the old one
    dropped first) when the shape changes."""
    from unittest import mock

    from torch_fp4.bench import mm

    built = []

    def fake(n, k, device, layout):
        built.append((n, k))
        return object()

    with mock.patch.object(mm, "TacticWeight", side_effect=fake):
        weight = mm.LatestWeight("cpu", F.WeightLayout.ROW)
        a, b = weight(256, 128), weight(256, 128)
        c = weight(128, 256)
        d = weight(256, 128)
    assert a is b and c is not a and d is not a
    assert built == [(256, 128), (128, 256), (256, 128)]


def test_ncu_table_sums_the_launch_and_reports_its_largest_kernel(monkeypatch):
    table = _script("ncu_table")
    values = {  # two kernels of one call: a small one, then the GEMM
        "1": dict(zip(table.METRICS, (1000, 5.0, 7.0, 80.0, 2e6, 3e6, 2000, 8))),
        "2": dict(zip(table.METRICS, (9000, 90.0, 30.0, 10.0, 4e6, 5e6, 8000, 132))),
    }
    rows = ['"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"']
    for kid, metrics in values.items():
        for name, v in metrics.items():
            rows.append(f'"{kid}","kernel_{kid}(int)","{name}","","{v:,}"')
    seen = {}

    def run(cmd, **kw):
        seen["cmd"] = cmd
        return types.SimpleNamespace(stdout="==PROF== noise\n" + "\n".join(rows), stderr="", returncode=0)

    monkeypatch.setattr(table.subprocess, "run", run)
    line = table.measure("ours", "1024", "8192", "8192", "row")
    assert line == "2 | 132 | 10.0 | 10000 | 90.0 | 30.0 | 10.0 | 6.00 | 8.00 | kernel_2(int)"
    assert seen["cmd"][-6:] == ["ours", "1024", "8192", "8192", "--layout", "row"]
    monkeypatch.setattr(table.subprocess, "run",
                        lambda cmd, **kw: types.SimpleNamespace(stdout="", stderr="ncu: not found", returncode=1))
    assert table.measure("bf16", "1", "2", "3", None).startswith("failed (rc 1): ncu: not found")


def test_build_comparison_swaps_each_set_in_and_checks_the_first_builds_bits(monkeypatch, capsys):
    import torch

    from torch_fp4.kernels.cuda import native

    ab = _script("ab_libraries")
    monkeypatch.setattr(native, "_LOADED", {})
    builds = {"new": {"wgmma0_0": "n0", "wgmma1_0": "n1"}, "old": {"wgmma0_0": "o0", "wgmma1_0": "o1"}}
    serving = lambda: (native._LOADED[(0, "wgmma0_0")], native._LOADED[(0, "wgmma1_0")])
    times = {("n0", "n1"): 2.0, ("o0", "o1"): 3.0}
    ab.compare("case", builds, 0, lambda: torch.ones(2), lambda: times[serving()], {"bf16": lambda: 4.0})
    assert capsys.readouterr().out == "case: new 2.00  old 3.00  bf16 4.00  old/new 1.500  same bits: True\n"
    ab.compare("odd", builds, 0, lambda: torch.tensor([float(serving()[0] == "n0")]), lambda: times[serving()])
    assert capsys.readouterr().out.endswith("old/new 1.500  same bits: False\n")
