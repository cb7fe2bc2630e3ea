"""A/B of two builds of one cuda kernel library in one process, on an sm_90 GPU:

    python scripts/ab_libraries.py NAME TAG=PATH TAG=PATH [M,N,K ...]     (AB_LAYOUT=row: row-major weights)

NAME: the library (e.g. wgmma1_1: the Hopper GEMM at block_m >= 128, bf16 activations, "sm90" NVFP4 weights); each
TAG=PATH a built copy of it (build it from each tree with `python -c "import torch; from
torch_fp4.kernels.cuda import build; print(build.build(torch.cuda.get_device_capability(),
['wgmma1_1'])['wgmma1_1'])"` and copy the file). Per problem: auto's W4A16 tactic under each build
and torch bf16 over rotating operands, medians of five interleaved rounds, and a check that every
build gives the first build's bits. Both builds run in the same process, so the clock and the
host are the same for both (processes of one tree differ by several percent)."""
import os
import sys

import torch

from torch_fp4.bench.mm import rotated
from torch_fp4.bench.timing import interleaved_medians
from torch_fp4.kernels.cuda import native

ROW = os.environ.get("AB_LAYOUT") == "row"


def use(index: int, libs: dict[str, native.Library]) -> None:
    """Serve the next calls on device `index` from these builds (library name -> built copy)."""
    for name, lib in libs.items():
        native._LOADED[(index, name)] = lib


def compare(label: str, builds: dict[str, dict[str, native.Library]], index: int, call, time_call,
            extra: dict | None = None) -> None:
    """One line: each build's output of `call` against the first build's bits, and the medians of
    five interleaved rounds of `time_call` (a measurement in us) under every build, beside the
    `extra` timers, with each build's time over the first's."""
    def under(tag, fn):
        use(index, builds[tag])
        return fn()

    outs = {tag: under(tag, call) for tag in builds}
    first = next(iter(outs.values()))
    same = all(torch.equal(o, first) for o in outs.values())
    cols = {tag: (lambda tag=tag: under(tag, time_call)) for tag in builds}
    cols.update(extra or {})
    us = interleaved_medians(cols, 5)
    base, *others = builds
    print(f"{label}: " + "  ".join(f"{c} {v:.2f}" for c, v in us.items()) + "  " +
          "  ".join(f"{t}/{base} {us[t] / us[base]:.3f}" for t in others) + f"  same bits: {same}", flush=True)


def main(name: str, builds: dict[str, str], problems: list[tuple[int, int, int]]) -> None:
    dev = torch.device("cuda")
    libs = {tag: {name: native.Library(name, path)} for tag, path in builds.items()}
    for m, n, k in problems:
        r = rotated(m, n, k, dev)
        ps, packs = r.problems, r.packs
        call = (lambda p, pk: p.w4a16()) if ROW else (lambda p, pk: p.w4a16_sm90(pk))
        compare(f"M={m} N={n} K={k}", libs, dev.index or 0, lambda: call(ps[0], packs[0]),
                lambda: r.time_sm90(call), {"bf16": r.time_bf16})
        del r, ps, packs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    builds = dict(a.split("=", 1) for a in sys.argv[2:] if "=" in a)
    specs = [a for a in sys.argv[2:] if "=" not in a]
    main(sys.argv[1], builds, [tuple(int(v) for v in s.split(",")) for s in specs])
