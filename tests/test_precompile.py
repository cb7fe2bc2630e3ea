"""`python -m torch_fp4 precompile` on the CPU: the shapes file, its errors, and a run over tiny
shapes that goes through every step (mm_fp4 W4A16 / W4A4 per batch size, route + fused_moe W4A16 /
W4A4) with progress lines."""
import io
import json
import re

import pytest

from torch_fp4 import precompile as P
from torch_fp4.__main__ import main


def test_default_shapes_and_file(tmp_path):
    assert P.load_shapes(None) == P.DEFAULT
    f = tmp_path / "s.json"
    f.write_text(json.dumps({"linear": [[256, 128]], "batches": [1, 3]}))
    s = P.load_shapes(str(f))
    assert s.linear == ((256, 128),) and s.batches == (1, 3) and s.moe == P.DEFAULT.moe


@pytest.mark.parametrize("data,msg", [
    ({"linear": [[256]]}, "linear[0] (N, K): expected 2 positive integers"),
    ({"linear": [[256, 100]]}, "K must be a multiple of 32"),
    ({"moe": [[4, 64, 32]]}, "moe[0] (experts, hidden, intermediate, top_k): expected 4"),
    ({"batches": [0]}, "batches: expected a list of positive integers"),
    ({"layers": []}, "expected an object with keys"),
])
def test_bad_shapes_files_name_the_entry(tmp_path, data, msg):
    f = tmp_path / "s.json"
    f.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=re.escape(msg)):
        P.load_shapes(str(f))


def test_cli_rejects_an_unreadable_file(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["precompile", "--shapes", str(tmp_path / "missing.json")])
    assert "cannot read" in capsys.readouterr().err


def test_run_on_the_cpu_reports_every_step():
    shapes = P.Shapes(linear=((128, 64),), moe=(P.MoeShape(4, 64, 32, 2),), batches=(1, 3))
    out = io.StringIO()
    P.run(shapes, "cpu", out=out)
    lines = [line for line in out.getvalue().splitlines() if "] " in line]
    assert len(lines) == 2 * 2 + 2 * 2
    assert lines[0].startswith("precompile: [1/8] mm_fp4 W4A16 row N=128 K=64 M=1")
    assert "fused_moe W4A4 E=4 H=64 I=32 k=2 T=3" in lines[-1]
    assert "8 problems on cpu" in out.getvalue()


def test_cli_runs_a_shapes_file_on_the_cpu(tmp_path, capsys):
    f = tmp_path / "s.json"
    f.write_text(json.dumps({"linear": [[128, 64]], "moe": [], "batches": [2]}))
    assert main(["precompile", "--shapes", str(f), "--device", "cpu"]) == 0
    err = capsys.readouterr().err
    assert "[2/2] mm_fp4 W4A4 row N=128 K=64 M=2" in err and "2 problems on cpu" in err
