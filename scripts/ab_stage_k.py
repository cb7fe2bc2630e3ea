"""Same-process A/B of the Hopper GEMM's 128-K stages against 64-K stages, on an sm_90 GPU:
python scripts/ab_stage_k.py [NxK,...] [M,...]  (default: the three Llama-3.1-70B shapes, 4096 x 14336 and
4096 x 4096 at M = 32, 64, 128).

The script builds a timing copy of csrc/ (in a temporary folder; the tree is not touched) whose
mm_wgmma.cu also compiles every block_m <= 128 kernel with one 64-K sub-tile per stage, chosen at
launch by the environment variable TFP4_SUBS=1. For each problem and weight layout ("sm90" and
row-major) it takes auto's tactic where that runs 128-K stages, and the same tactic with as many
64-K stages as fit, and times both in interleaved rounds (min of three, one graph-replay timer).
"""
import dataclasses
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch

from torch_fp4.kernels.cuda import build


def timing_source(src: str) -> str:
    """mm_wgmma.cu with Config's sub-tile count a template parameter and launch_tile dispatching to
    one-sub-tile configs under TFP4_SUBS=1."""
    def rep(text: str, old: str, new: str) -> str:
        if old not in text:
            raise SystemExit(f"ab_stage_k: mm_wgmma.cu changed; cannot find {old[:60]!r}")
        return text.replace(old, new, 1)
    s = rep(src, "#include <algorithm>", "#include <algorithm>\n#include <cstdlib>")
    s = rep(s, "int kCtas_ = 1, int kKG_ = 1>\nstruct Config {",
            "int kCtas_ = 1, int kKG_ = 1, int kSubs_ = stage_subs(kBM_, kCtas_, kPacked_)>\nstruct Config {")
    s = rep(s, "static constexpr int kSubs = stage_subs(kBM_, kCtas_, kPacked_);", "static constexpr int kSubs = kSubs_;")
    s = rep(s, "inline Schedule schedule_of(const WgmmaMmArgs& a) {",
            "inline int subs_env() { const char* e = getenv(\"TFP4_SUBS\"); return e ? atoi(e) : 0; }\n"
            "inline Schedule schedule_of(const WgmmaMmArgs& a) {")
    s = rep(s, "const int sk = kBK * stage_subs(a.block_m, a.ctas_per_sm, a.packed);",
            "const int sk = subs_env() == 1 ? kBK : kBK * stage_subs(a.block_m, a.ctas_per_sm, a.packed);")
    i = s.index("template <bool kFp16, bool kMx, bool kPacked>\nbool launch_tile(")
    j = s.index("\n}\n", i) + 3
    one = s[i:j].replace("bool launch_tile(", "bool launch_tile_s1(")
    for bm in (32, 64, 128):
        one = one.replace(f"Config<{bm}, kFp16, kMx, kPacked, 1, 2>", f"Config<{bm}, kFp16, kMx, kPacked, 1, 2, 1>")
        one = one.replace(f"Config<{bm}, kFp16, kMx, kPacked, 2>", f"Config<{bm}, kFp16, kMx, kPacked, 2, 1, 1>")
        one = one.replace(f"Config<{bm}, kFp16, kMx, kPacked>", f"Config<{bm}, kFp16, kMx, kPacked, 1, 1, 1>")
    two = s[i:j].replace(
        "bool launch_tile(const WgmmaMmArgs& a, cudaStream_t stream, bool pdl) {",
        "bool launch_tile(const WgmmaMmArgs& a, cudaStream_t stream, bool pdl) {\n"
        "  if (subs_env() == 1 && a.block_m <= 128) return launch_tile_s1<kFp16, kMx, kPacked>(a, stream, pdl);")
    return s[:i] + one + "\n" + two + s[j:]


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="torch_fp4_ab_stage_k_"))
    shutil.copytree(build.CSRC, tmp / "csrc")
    (tmp / "csrc" / "mm_wgmma.cu").write_text(timing_source((build.CSRC / "mm_wgmma.cu").read_text()))
    build.CSRC = tmp / "csrc"   # before any library is built or looked up

    from torch_fp4 import formats as F
    from torch_fp4 import ops, tactics
    from torch_fp4.bench.mm import Problem, nvfp4_weight
    from torch_fp4.bench.timing import graph_time_us
    from torch_fp4.kernels.cuda import mm_wgmma_tactics as WT
    from torch_fp4.problems import MmProblem

    stage_k = WT.stage_k

    def variant(subs: int) -> None:   # the launcher and the tactics' smem and split checks agree
        if subs == 1:
            os.environ["TFP4_SUBS"] = "1"
            WT.stage_k = lambda block_m, ctas_per_sm, packed: WT.BLOCK_K
        else:
            os.environ.pop("TFP4_SUBS", None)
            WT.stage_k = stage_k

    shapes = [tuple(int(x) for x in s.split("x")) for s in
              (sys.argv[1] if len(sys.argv) > 1 else "8192x28672,28672x8192,8192x8192,4096x14336,4096x4096").split(",")]
    ms = [int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "32,64,128").split(",")]
    dev = torch.device("cuda")
    for n, k in shapes:
        w = nvfp4_weight(n, k, dev)
        packed = ops.prepack_weight(w[0])
        for m in ms:
            p = Problem(m, n, k, w, dev)
            for layout in ("sm90", "row"):
                args = (p.a, packed.T if layout == "sm90" else w[0].T, None, p.w_scale.T, p.alpha)
                prob = MmProblem.of(*args, torch.bfloat16, F.NVFP4, F.SfLayout.LAYOUT_128x4, F.WeightLayout.parse(layout))
                variant(2)
                t2 = WT.default(prob)
                if stage_k(t2.block_m, t2.ctas_per_sm, prob.packed) == WT.BLOCK_K:
                    continue   # the tree runs 64-K stages here
                variant(1)
                t1 = dataclasses.replace(t2, stages=WT.max_stages(
                    t2.block_m, WT.smem_limit(prob, t2.ctas_per_sm), t2.persistent, t2.k_groups,
                    ctas_per_sm=t2.ctas_per_sm, packed=prob.packed))
                times = {1: [], 2: []}
                for _ in range(3):
                    for subs, t in ((2, t2), (1, t1)):
                        variant(subs)

                        def call(t=t):
                            with tactics.use_tactic(t):
                                return ops.mm_fp4(*args, weight_layout=layout)
                        times[subs].append(graph_time_us(call, [()]))
                variant(2)
                a1, a2 = min(times[1]), min(times[2])
                print(f"{n}x{k} M={m:4d} {layout:4s} 64K({t1.stages}) {a1:8.2f}  128K({t2.stages}) {a2:8.2f}  "
                      f"{a2 / a1 - 1:+6.1%}  spread {max(times[1]) / a1 - 1:.0%}/{max(times[2]) / a2 - 1:.0%}  "
                      f"{t2.label()}", flush=True)
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
