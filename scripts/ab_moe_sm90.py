"""fused_moe's grouped Hopper GEMMs (kernels/cuda/moe.py `_grouped_gemm`, W4A16 bf16, NVFP4) on the
experts of FC1 and FC2 of Mixtral-8x7B, Qwen3-30B-A3B and DeepSeek-V3, every expert the same
routed rows, interleaved rounds, the bits of each variant checked against the first's:
- `layout` (default): the same experts row-major and prepacked ("sm90"), at the heuristic's tactic
  for that many rows per expert;
- `ctas`: at 64-row blocks, two CTAs per SM (64-K stages) against one (stages of two sub-tiles,
  the block scales converted once per CTA), for each layout, where the tiles outnumber the SMs.
On an sm_90 GPU: `python scripts/ab_moe_sm90.py [layout|ctas] [ROUNDS] [ROWS_PER_EXPERT,...]`."""
import statistics
import sys

import torch

import torch_fp4 as t4
from torch_fp4.bench.mm import nvfp4_weight
from torch_fp4.bench.timing import graph_time_us
from torch_fp4.kernels.cuda import mm_wgmma_tactics as WG
from torch_fp4.kernels.cuda import moe as K
from torch_fp4.kernels.cuda import moe_tactics as MT
from torch_fp4.problems import Problem

MODELS = (("Mixtral-8x7B", 8, 4096, 14336), ("Qwen3-30B-A3B", 128, 2048, 768), ("DeepSeek-V3", 256, 7168, 2048))
argv = sys.argv[1:]
mode = argv.pop(0) if argv and argv[0] in ("layout", "ctas") else "layout"
rounds = int(argv[0]) if argv else 2
per_expert = ([int(v) for v in argv[1].split(",")] if len(argv) > 1
              else [16, 32, 64, 128, 256] if mode == "layout" else [16, 32, 48])
dev = torch.device("cuda")
sms = torch.cuda.get_device_properties(dev).multi_processor_count
where = Problem(device=dev, capability=torch.cuda.get_device_capability(dev))


def tactic(bm: int, ctas: int, packed: bool) -> MT.WgmmaMoeTactic:
    """A persistent launch at block_m `bm` and `ctas` CTAs per SM with as many stages as fit."""
    stages = WG.max_stages(bm, WG.smem_limit(where, ctas), True, ctas_per_sm=ctas, packed=packed)
    return MT.WgmmaMoeTactic(bm, stages, ctas)


print(f"{'model':<14} {'GEMM':<4} {'rows/E':>6} | variant (block_m/stages/CTAs per SM): us (over the first "
      "variant; in ctas mode the first of its layout) same bits as that one")
for name, e, h, inter in MODELS:
    for gemm, n, k in (("FC1", 2 * inter, h), ("FC2", h, inter)):
        data, scale, _ = nvfp4_weight(e * n, k, dev)
        w = {False: data.view(e, n, k // 2), True: t4.prepack_weight(data).view(e, n, k // 2)}
        ws = scale.view(e, -1, scale.shape[1])
        alpha = torch.rand(e, device=dev) + 0.5
        for rpe in per_expert:
            if mode == "layout":
                bm = next((b for b in (256, 128) if rpe >= MT.BLOCK_M_FROM[b]), 64)
                variants = [("row", tactic(bm, 1, False), False), ("sm90", tactic(bm, 1, True), True)]
            elif -(-rpe // 64) * e * -(-n // 128) > sms:
                bm = 64
                variants = [(f"{lay} {c} CTA", tactic(64, c, pk), pk) for lay, pk in (("row", False), ("sm90", True))
                            for c in (2, 1)]
            else:
                continue  # one wave of 64-row tiles: no second CTA per SM to compare
            blocks = -(-rpe // bm)
            block_expert = torch.arange(e, device=dev, dtype=torch.int32).repeat_interleave(blocks)
            a = torch.randn(e * blocks * bm, k, device=dev, dtype=torch.bfloat16)
            runs = {v[0]: [] for v in variants}
            outs = {}
            for r in range(rounds):
                for label, t, pk in (variants if r % 2 == 0 else variants[::-1]):
                    def fn(t=t, pk=pk, wt=w[pk], ws=ws, a=a, be=block_expert):
                        return K._grouped_gemm(a, None, wt, ws, alpha, be, False, tactic=t, packed=pk)
                    outs[label] = fn()
                    runs[label].append(graph_time_us(fn, [()], repeats=3))
            med = {label: statistics.median(v) for label, v in runs.items()}
            # each variant against the first (layout), or against the first of its layout (ctas)
            ref = {pk: next(lb for lb, _, p in variants if mode == "layout" or p == pk) for _, _, pk in variants}
            cols = [f"{label} ({t.block_m}/{t.stages}/{t.ctas_per_sm}): {med[label]:.1f} "
                    f"({med[label] / med[ref[pk]]:.3f}) {torch.equal(outs[label], outs[ref[pk]])}"
                    for label, t, pk in variants]
            print(f"{name:<14} {gemm:<4} {rpe:>6} | " + " | ".join(cols), flush=True)
        del data, scale, w, ws
        torch.cuda.empty_cache()
