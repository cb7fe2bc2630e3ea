"""Where a kernel's warps spend their time, from ncu's warp-state samples per SASS instruction:

    ncu --profile-from-start off --section SourceCounters --section WarpStateStats -o REPORT \\
        python scripts/ncu_one_call.py ours 1024 8192 8192
    ncu -i REPORT.ncu-rep --page source --csv --print-source sass > REPORT.csv
    python scripts/ncu_stall_regions.py REPORT.csv [--top 20] [--cuts I,J,...]

Prints, per kernel in the file: its samples by stall reason; the main loop (the span of the
most-executed HGMMAs, widened to the loop's back edge) against the code before and after it, with
the samples, the instructions executed, the shared-memory wavefronts (and their ideal) and the
leading stall reasons of each; with --cuts, regions between those instruction indices instead; then
the --top instructions by samples. A sample is one warp's state at one sampling tick, so a
region's share of the samples is its share of the resident warps' time (idle producer warps
included)."""
import argparse
import csv
import re
from collections import Counter

SAMPLES = "Warp Stall Sampling (All Samples)"


def kernels(path: str) -> list[dict]:
    out, cur, header = [], None, None
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if not row:
                continue
            if row[0] == "Kernel Name":
                cur = {"name": row[1], "ins": []}
                out.append(cur)
            elif row[0] == "Address":
                header = row
            elif cur is not None and header is not None and row[0].startswith("0x"):
                cur["ins"].append(dict(zip(header, row)))
    return out


def value(ins: dict, key: str) -> float:
    try:
        return float(ins.get(key, "0").replace(",", ""))
    except ValueError:
        return 0.0


def reasons(ins: list[dict]) -> list[str]:
    return [k for k in ins[0] if k.startswith("stall_") and "Not Issued" not in k] if ins else []


def main_loop(ins: list[dict]) -> tuple[int, int]:
    """[first, last + 1) of the loop holding the most-executed HGMMAs (0, 0 when there are none)."""
    hg = [i for i, x in enumerate(ins) if "HGMMA" in x["Source"]]
    if not hg:
        return 0, 0
    top = max(value(ins[i], "Instructions Executed") for i in hg)
    hot = [i for i in hg if value(ins[i], "Instructions Executed") == top]
    lo, hi = min(hot), max(hot)
    start = int(ins[lo]["Address"], 16)
    for j in range(hi, len(ins)):  # the back edge: the first branch after the loop's HGMMAs to before them
        m = re.search(r"\bBRA\s+(?:\S+,\s*)?(0x[0-9a-f]+)", ins[j]["Source"])
        if m and int(m.group(1), 16) <= start:
            target = int(m.group(1), 16)
            first = next((i for i, x in enumerate(ins) if int(x["Address"], 16) >= target), lo)
            return first, j + 1
    return lo, hi + 1


def summary(ins: list[dict], a: int, b: int, total: float, why: list[str]) -> str:
    part = ins[a:b]
    s = sum(value(x, SAMPLES) for x in part)
    ex = sum(value(x, "Instructions Executed") for x in part)
    wf = sum(value(x, "L1 Wavefronts Shared") for x in part)
    ideal = sum(value(x, "L1 Wavefronts Shared Ideal") for x in part)
    by = Counter({r[6:]: sum(value(x, r) for x in part) for r in why})
    lead = " ".join(f"{r} {v / s * 100:.0f}%" for r, v in by.most_common(4) if s and v)
    return (f"[{a:5d}, {b:5d}) samples {s:7.0f} ({s / total * 100:5.1f}%)  instructions {ex / 1e6:7.2f} M  "
            f"shared wavefronts {wf / 1e6:6.2f} M (ideal {ideal / 1e6:6.2f} M)  {lead}")


def report(k: dict, top: int, cuts: list[int]) -> None:
    ins = k["ins"]
    total = sum(value(x, SAMPLES) for x in ins) or 1.0
    why = reasons(ins)
    print(f"{k['name'][:160]}\n  {len(ins)} instructions, {total:.0f} samples")
    by = Counter({r[6:]: sum(value(x, r) for x in ins) for r in why})
    print("  by reason: " + ", ".join(f"{r} {v / total * 100:.1f}%" for r, v in by.most_common(10)))
    if cuts:
        bounds = [0, *cuts, len(ins)]
        names = [f"region {i}" for i in range(len(bounds) - 1)]
    else:
        lo, hi = main_loop(ins)
        bounds, names = [0, lo, hi, len(ins)], ["before the main loop", "main loop", "after the main loop"]
    for name, a, b in zip(names, bounds, bounds[1:]):
        print(f"  {name:22s} " + summary(ins, a, b, total, why))
    order = sorted(range(len(ins)), key=lambda i: -value(ins[i], SAMPLES))[:top]
    for i in sorted(order):
        x = ins[i]
        lead = sorted(((value(x, r), r[6:]) for r in why), reverse=True)[:3]
        print(f"  {i:5d} {value(x, SAMPLES) / total * 100:5.2f}%  executed {x['Instructions Executed']:>9}  "
              f"{x['Source'].strip()[:64]:64s} " + " ".join(f"{r}:{v:.0f}" for v, r in lead if v))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--cuts", default="", help="instruction indices between regions, e.g. 905,1056,8160")
    args = ap.parse_args()
    for k in kernels(args.csv):
        report(k, args.top, [int(c) for c in args.cuts.split(",") if c])
