"""ncu (its locked clock) over scripts/ncu_one_call.py for a list of calls, one table line each, on an
sm_90 GPU with ncu on the PATH:

    python scripts/ncu_table.py [--budget SECONDS] WHICH,M,N,K[,LAYOUT] ...

WHICH: ours, quack or bf16 (as scripts/ncu_one_call.py takes them); LAYOUT: sm90 (default) or row,
for ours. Per call: the kernels it launched, the largest kernel's grid, the time and cycles summed
over them, the largest kernel's tensor-pipe active %, issue-slot % and DRAM throughput %, executed
instructions and L2 sectors summed (millions), and the largest kernel's name. Calls past the budget
are listed as skipped."""
import argparse
import csv
import io
import subprocess
import time

METRICS = (
    "gpc__cycles_elapsed.max",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__inst_issued.avg.pct_of_peak_sustained_active",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "smsp__inst_executed.sum",
    "lts__t_sectors.sum",
    "gpu__time_duration.sum",
    "launch__grid_size",
)
HEADER = "spec | kernels | grid | us | cycles | tensor % | issue % | DRAM % | instr M | L2 sectors M | kernel"


def measure(which: str, m: str, n: str, k: str, layout: str | None) -> str:
    cmd = ["ncu", "--profile-from-start", "off", "--csv", "--metrics", ",".join(METRICS),
           "python", "scripts/ncu_one_call.py", which, m, n, k] + (["--layout", layout] if layout else [])
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    lines = [line for line in r.stdout.splitlines() if line.startswith('"')]
    if not lines:
        return f"failed (rc {r.returncode}): {(r.stderr or r.stdout)[-300:]}"
    per: dict[str, dict[str, float]] = {}
    names: dict[str, str] = {}
    for row in csv.DictReader(io.StringIO("\n".join(lines))):
        per.setdefault(row["ID"], {})[row["Metric Name"]] = float(row["Metric Value"].replace(",", ""))
        names[row["ID"]] = row["Kernel Name"]
    total = lambda key: sum(v.get(key, 0.0) for v in per.values())
    big_id = max(per, key=lambda i: per[i].get(METRICS[0], 0.0))
    big = per[big_id]
    return (f"{len(per)} | {int(big['launch__grid_size'])} | {total('gpu__time_duration.sum') / 1e3:.1f} | "
            f"{int(total(METRICS[0]))} | {big[METRICS[1]]:.1f} | {big[METRICS[2]]:.1f} | {big[METRICS[3]]:.1f} | "
            f"{total('smsp__inst_executed.sum') / 1e6:.2f} | {total('lts__t_sectors.sum') / 1e6:.2f} | "
            f"{names[big_id][:48]}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=float, default=float("inf"), help="seconds for all calls")
    ap.add_argument("specs", nargs="+", help="WHICH,M,N,K[,LAYOUT]")
    args = ap.parse_args()
    t0 = time.time()
    print(HEADER, flush=True)
    for spec in args.specs:
        which, m, n, k, *rest = spec.split(",")
        layout = rest[0] if rest else None
        label = f"{which} {m} {n} {k}" + (f" {layout}" if layout else "")
        line = "skipped (time)" if time.time() - t0 > args.budget else measure(which, m, n, k, layout)
        print(f"{label} | {line}", flush=True)


if __name__ == "__main__":
    main()
