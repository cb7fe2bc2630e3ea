"""scripts/ncu_stall_regions.py on a small ncu source-page CSV, on the CPU: the main loop is found
from the most-executed HGMMAs and the loop's back edge, and each region's samples, instructions and
shared wavefronts are its own."""
import csv
import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "ncu_stall_regions.py"
HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed",
          "L1 Wavefronts Shared", "L1 Wavefronts Shared Ideal", "stall_barrier", "stall_wait",
          "stall_barrier (Not Issued)"]


def _module():
    spec = importlib.util.spec_from_file_location("ncu_stall_regions", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _write(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Kernel Name", "k"])
        w.writerow(HEADER)
        for i, (src, samples, executed, wf, barrier, wait) in enumerate(rows):
            w.writerow([hex(0x1000 + 16 * i), src, samples, executed, wf, wf, barrier, wait, barrier])


def test_main_loop_and_regions(tmp_path, capsys):
    rows = [
        ("LDC R1, c[0x0][0x28]", 2, 10, 0, 0, 2),                      # 0: set-up
        ("HGMMA.64x256x16.F32.BF16 R24, R1, gdesc[UR4], R24", 1, 10, 16, 0, 1),  # 1: a peeled HGMMA
        ("LDS R2, [R3]", 3, 400, 400, 0, 3),                           # 2: loop head (0x1020)
        ("HGMMA.64x256x16.F32.BF16 R24, R2, gdesc[UR4], R24", 4, 400, 6400, 0, 4),
        ("WARPGROUP.DEPBAR.LE gsb0, 0x3", 20, 400, 0, 20, 0),
        ("HGMMA.64x256x16.F32.BF16 R24, R4, gdesc[UR4], R24", 4, 400, 6400, 0, 4),
        ("@!P0 BRA 0x1020", 1, 400, 0, 0, 1),                          # 6: the back edge
        ("STG.E [R4], R5", 5, 20, 0, 1, 4),                            # 7: epilogue
    ]
    path = tmp_path / "k.csv"
    _write(path, rows)
    mod = _module()
    (k,) = mod.kernels(str(path))
    assert mod.main_loop(k["ins"]) == (2, 7)
    mod.report(k, top=2, cuts=[])
    out = capsys.readouterr().out
    assert "40 samples" in out
    loop = next(line for line in out.splitlines() if line.lstrip().startswith("main loop"))
    assert "samples      32" in loop and "( 80.0%)" in loop and "shared wavefronts   0.01 M" in loop
    assert "barrier 62%" in loop  # 20 of the loop's 32 samples
    mod.report(k, top=0, cuts=[2, 7])
    regions = [line for line in capsys.readouterr().out.splitlines() if "region" in line]
    assert [r.split("samples")[1].split()[0] for r in regions] == ["3", "32", "5"]


def test_no_hgmma_means_no_loop(tmp_path):
    path = tmp_path / "k.csv"
    _write(path, [("LDS R2, [R3]", 1, 1, 1, 0, 1)])
    mod = _module()
    assert mod.main_loop(mod.kernels(str(path))[0]["ins"]) == (0, 0)
