"""Seconds to build cuda kernel libraries from scratch, of two trees on one machine, in turn:

    python scripts/ab_build_time.py OTHER_TREE "LIB ..." "LIB ..." [ROUNDS]

OTHER_TREE: a folder holding another checkout's torch_fp4/. Its libraries (the first list) and this
checkout's (the second; ALL: every library of the tree, in one parallel build, as `precompile`
does) are each built alone into a fresh cache folder, in a process of its own
(its torch_fp4 imported from its tree), ROUNDS (default 2) times in turn; the time is build.build's
alone (the import of torch is not counted). Compile hosts differ by tens of percent, so only
builds on one machine compare."""
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ONE = ("import sys, time, torch\n"
       "from torch_fp4.kernels.cuda import build\n"
       "t = time.perf_counter()\n"
       "names = list(build.LIBRARIES) if sys.argv[1] == 'ALL' else [sys.argv[1]]\n"
       "build.build(torch.cuda.get_device_capability(), names, progress=None)\n"
       "print(f'{time.perf_counter() - t:.2f}')\n")


def build_seconds(tree: str, lib: str) -> float:
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, TORCH_FP4_CACHE_DIR=cache, PYTHONPATH=tree)
        done = subprocess.run([sys.executable, "-c", ONE, lib], env=env, capture_output=True, text=True,
                              cwd=tempfile.gettempdir())
        if done.returncode != 0:
            raise SystemExit(f"building {lib} from {tree} failed:\n{done.stderr[-2000:]}")
        return float(done.stdout.split()[-1])


def main(other: str, theirs: list[str], ours: list[str], rounds: int) -> None:
    here, other = str(Path(__file__).resolve().parents[1]), str(Path(other).resolve())
    for r in range(rounds):
        for tag, tree, libs in (("other", other, theirs), ("this", here, ours)):
            for lib in libs:
                print(f"round {r + 1} {tag:<5} {lib:<14} {build_seconds(tree, lib):6.2f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2].split(), sys.argv[3].split(), int(sys.argv[4]) if len(sys.argv) > 4 else 2)
