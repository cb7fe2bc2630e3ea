"""A/B of builds of the cuda kernel libraries under fused_moe, in one process, on an sm_90 GPU:

    python scripts/ab_moe_libraries.py TAG=NAME:PATH[,NAME:PATH...] TAG=NAME:PATH[,...]

Each TAG a set of built libraries swapped in together (e.g. wgmma0_0 and wgmma1_0, the grouped
GEMMs below 128-row blocks on row-major and "sm90" experts; build them as scripts/ab_overlay.sh
does). Per model and batch: fused_moe W4A16 (NVFP4, auto) on row-major and "sm90" experts under
each set, medians of five interleaved rounds of graph replays, and a check that every set gives
the first set's bits (scripts/ab_libraries.py does the same for mm_fp4)."""
import sys
import torch
from torch_fp4 import ops
from torch_fp4.bench import moe as B
from torch_fp4.bench.timing import graph_time_us, interleaved_medians
from torch_fp4.kernels.cuda import native

dev = torch.device("cuda")
builds = {}
for arg in sys.argv[1:]:
    tag, libs = arg.split("=", 1)
    builds[tag] = {nm: native.Library(nm, p) for nm, p in (x.split(":", 1) for x in libs.split(","))}


def under(tag, fn):
    for nm, lib in builds[tag].items():
        native._LOADED[(0, nm)] = lib
    return fn()


CASES = (("Mixtral-8x7B", (128, 256)), ("Qwen3-30B-A3B", (512, 1024)), ("DeepSeek-V3", (1024, 2048)))
for name, tokens_list in CASES:
    m = next(x for x in B.MODELS if x.name == name)
    experts = B._experts_that_fit(m, dev, max(tokens_list))
    gen = torch.Generator(device=dev).manual_seed(0)
    w = (*B._fp4_experts(experts, 2 * m.inter, m.hidden, dev, gen), *B._fp4_experts(experts, m.hidden, m.inter, dev, gen))
    packed = B.sm90_experts(w)
    for t in tokens_list:
        x = torch.randn(t, m.hidden, device=dev, dtype=torch.bfloat16, generator=gen)
        kw = dict(m.route_kw)
        if m.method == "deepseek_v3":
            kw["bias"] = torch.randn(experts, device=dev, generator=gen) * 0.01
        ids, tw = ops.route(torch.randn(t, experts, device=dev, generator=gen), m.top_k, m.method, **kw)
        for lay, ws in (("row", w), ("sm90", packed)):
            if ws is None:
                continue
            f = lambda: ops.fused_moe(x, *ws, ids, tw, local_expert_offset=0, num_local_experts=experts,
                                      weight_layout=lay)
            outs = {tag: under(tag, f) for tag in builds}
            first = next(iter(outs.values()))
            same = all(torch.equal(o, first) for o in outs.values())
            cols = {tag: (lambda tag=tag: under(tag, lambda: graph_time_us(f, [()]))) for tag in builds}
            us = interleaved_medians(cols, 5)
            base = next(iter(builds))
            print(f"{name} E={experts} T={t} {lay}: " + "  ".join(f"{c} {v:.2f}" for c, v in us.items()) + "  " +
                  "  ".join(f"{c}/{base} {us[c] / us[base]:.3f}" for c in us if c != base) + f"  same bits: {same}",
                  flush=True)
