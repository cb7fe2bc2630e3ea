"""fused_moe's grouped Hopper GEMM at 64-row blocks: two CTAs per SM (64-K stages)
against one CTA per SM (stages of two sub-tiles, scales converted once per CTA), row-major and
"sm90" experts, FC1 and FC2 of three models, every expert the same routed rows; interleaved rounds;
same bits checked. `python scripts/ab_moe_ctas.py [ROUNDS] [ROWS_PER_EXPERT,...]` on an sm_90 GPU."""
import statistics
import sys

import torch

import torch_fp4 as t4
from torch_fp4.bench.mm import nvfp4_weight
from torch_fp4.bench.timing import graph_time_us
from torch_fp4.kernels.cuda import moe as K
from torch_fp4.kernels.cuda import moe_tactics as MT
from torch_fp4.kernels.cuda import mm_wgmma_tactics as WG
from torch_fp4.problems import Problem

MODELS = (("Mixtral-8x7B", 8, 4096, 14336), ("Qwen3-30B-A3B", 128, 2048, 768), ("DeepSeek-V3", 256, 7168, 2048))
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
per_expert = [int(v) for v in sys.argv[2].split(",")] if len(sys.argv) > 2 else [16, 32, 48]
dev = torch.device("cuda")
sms = torch.cuda.get_device_properties(0).multi_processor_count
where = Problem(device=dev, capability=torch.cuda.get_device_capability(dev))
print(f"{'model':<14} {'GEMM':<4} {'rows/E':>6} {'layout':<6} {'2 CTAs us':>9} {'1 CTA us':>9} {'1/2':>6} same", flush=True)
for name, e, h, inter in MODELS:
    for gemm, n, k in (("FC1", 2 * inter, h), ("FC2", h, inter)):
        data, scale, _ = nvfp4_weight(e * n, k, dev)
        w = data.view(e, n, k // 2)
        ws = scale.view(e, -1, scale.shape[1])
        packed = t4.prepack_weight(data).view(e, n, k // 2)
        alpha = torch.rand(e, device=dev) + 0.5
        for rpe in per_expert:
            blocks = -(-rpe // 64)
            if blocks * e * -(-n // 128) <= sms:
                continue  # the heuristic takes one CTA per SM here already
            rows = e * blocks * 64
            block_expert = torch.arange(e, device=dev, dtype=torch.int32).repeat_interleave(blocks)
            a = torch.randn(rows, k, device=dev, dtype=torch.bfloat16)
            for pk in (False, True):
                wt = packed if pk else w
                ts = {c: MT.WgmmaMoeTactic(64, WG.max_stages(64, WG.smem_limit(where, c), True, ctas_per_sm=c, packed=pk), c)
                      for c in (2, 1)}
                runs, outs = {2: [], 1: []}, {}
                for r in range(rounds):
                    for c in ((2, 1) if r % 2 == 0 else (1, 2)):
                        def fn(t=ts[c], wt=wt, ws=ws, pk=pk, a=a, block_expert=block_expert):
                            return K._grouped_gemm(a, None, wt, ws, alpha, block_expert, False, tactic=t, packed=pk)
                        outs[c] = fn()
                        runs[c].append(graph_time_us(fn, [()], repeats=3))
                two, one = statistics.median(runs[2]), statistics.median(runs[1])
                print(f"{name:<14} {gemm:<4} {rpe:>6} {'sm90' if pk else 'row':<6} st {ts[2].stages}/{ts[1].stages} {two:>9.1f} {one:>9.1f} {one / two:>6.3f} "
                      f"{torch.equal(outs[2], outs[1])}", flush=True)
        del data, scale, w, ws, packed
        torch.cuda.empty_cache()
