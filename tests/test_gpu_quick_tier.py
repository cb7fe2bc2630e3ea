"""The GPU quick tier names its cases by id (QUICK = {test name: {case ids}} in a GPU module,
tests/conftest.py): every id named there must be a collected case, or the case it meant silently
never runs in the quick tier. Collection needs no GPU."""
import importlib
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_quick_id_names_a_collected_case():
    modules = sorted(f[:-3] for f in os.listdir(os.path.join(ROOT, "tests"))
                     if f.startswith("test_gpu") and f.endswith(".py"))
    quick = {m: getattr(importlib.import_module(m), "QUICK", {}) for m in modules}
    quick = {m: q for m, q in quick.items() if q}
    assert quick, "no GPU module names a quick tier"
    res = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          *(f"tests/{m}.py" for m in quick)], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    collected = set(re.findall(r"tests/(\w+)\.py::(\w+)\[([^\]]+)\]", res.stdout))
    missing = [(m, name, case) for m, q in quick.items() for name, cases in q.items() for case in cases
               if (m, name, case) not in collected]
    assert not missing, f"QUICK names cases that are not collected: {missing}"
