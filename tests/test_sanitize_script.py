"""scripts/sanitize_kernels.py's report parsing, on the CPU: errors are attributed to the case
that launched the kernel, and launches the tool could not track are counted apart."""
import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "sanitize_kernels.py"


def _module():
    spec = importlib.util.spec_from_file_location("sanitize_kernels", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_errors_and_untracked_launches_per_case():
    log = "\n".join([
        "========= COMPUTE-SANITIZER",
        "=== case quantize/cuda",
        "=== done quantize/cuda",
        "=== case mm_fp4 sm90/cuda",
        "========= Internal Sanitizer Error: The Sanitizer encountered an error while launching k and didn't track it",
        "========= ",
        "========= Barrier error detected. Divergent thread(s) in warp",
        "=========     at k+0x10",
        "=== done mm_fp4 sm90/cuda",
        "========= ERROR SUMMARY: 2 errors",
    ])
    counts, untracked = _module()._errors_per_case(log)
    assert counts == {"quantize/cuda": 0, "mm_fp4 sm90/cuda": 1}
    assert untracked == {"mm_fp4 sm90/cuda": 1}
