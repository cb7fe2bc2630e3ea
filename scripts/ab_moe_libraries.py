"""A/B of builds of the cuda kernel libraries under fused_moe, in one process, on an sm_90 GPU:

    python scripts/ab_moe_libraries.py TAG=NAME:PATH[,NAME:PATH...] TAG=NAME:PATH[,...]

Each TAG a set of built libraries swapped in together (e.g. wgmma0_0 and wgmma1_0, the grouped
GEMMs below 128-row blocks on row-major and "sm90" experts; build them as scripts/ab_overlay.sh
does). Per model and batch: fused_moe W4A16 (NVFP4, auto) on row-major and "sm90" experts under
each set, medians of five interleaved rounds of graph replays, and a check that every set gives
the first set's bits (scripts/ab_libraries.py does the same for mm_fp4)."""
import sys

import torch

from ab_libraries import compare
from torch_fp4 import ops
from torch_fp4.bench import moe as B
from torch_fp4.bench.timing import graph_time_us
from torch_fp4.kernels.cuda import native

CASES = (("Mixtral-8x7B", (128, 256)), ("Qwen3-30B-A3B", (512, 1024)), ("DeepSeek-V3", (1024, 2048)))


def main(builds: dict[str, dict[str, native.Library]]) -> None:
    dev = torch.device("cuda")
    for name, tokens_list in CASES:
        m = next(x for x in B.MODELS if x.name == name)
        experts = B._experts_that_fit(m, dev, max(tokens_list))
        gen = torch.Generator(device=dev).manual_seed(0)
        w1, w2 = B.model_experts(m, experts, dev, gen)
        layouts = (("row", (*w1, *w2)), ("sm90", B.sm90_experts((*w1, *w2))))
        for t in tokens_list:
            x, ids, tw = B.routed_tokens(m, experts, t, dev, gen)
            for lay, ws in layouts:
                if ws is None:
                    continue
                f = lambda: ops.fused_moe(x, *ws, ids, tw, local_expert_offset=0, num_local_experts=experts,
                                          weight_layout=lay)
                compare(f"{name} E={experts} T={t} {lay}", builds, dev.index or 0, f, lambda: graph_time_us(f, [()]))


if __name__ == "__main__":
    sets = (a.split("=", 1) for a in sys.argv[1:])
    main({tag: {nm: native.Library(nm, p) for nm, p in (x.split(":", 1) for x in libs.split(","))}
          for tag, libs in sets})
