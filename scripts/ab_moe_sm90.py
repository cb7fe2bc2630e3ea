"""Does the "sm90" weight layout pay in fused_moe's grouped Hopper GEMMs? Times the cuda
backend's grouped GEMM (kernels/cuda/moe.py `_grouped_gemm`, W4A16 bf16, NVFP4) on the same
experts row-major and prepacked, FC1 and FC2 of Mixtral-8x7B, Qwen3-30B-A3B and DeepSeek-V3 at
several routed rows per expert (every expert the same count), the tactic the cuda heuristic takes
for that count, interleaved rounds; checks both layouts give the same bits. On an sm_90 GPU:
`python scripts/ab_moe_sm90.py [ROUNDS] [ROWS_PER_EXPERT,...]`."""
import statistics
import sys

import torch

import torch_fp4 as t4
from torch_fp4.bench.mm import nvfp4_weight
from torch_fp4.bench.timing import graph_time_us
from torch_fp4.kernels.cuda import moe as K
from torch_fp4.kernels.cuda import moe_tactics as MT
from torch_fp4.problems import Problem

MODELS = (("Mixtral-8x7B", 8, 4096, 14336), ("Qwen3-30B-A3B", 128, 2048, 768), ("DeepSeek-V3", 256, 7168, 2048))
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
per_expert = [int(v) for v in sys.argv[2].split(",")] if len(sys.argv) > 2 else [16, 32, 64, 128, 256]
dev = torch.device("cuda")
where = Problem(device=dev, capability=torch.cuda.get_device_capability(dev))
print(f"{'model':<14} {'GEMM':<4} {'rows/E':>6} {'tactic':<10} {'row us':>9} {'sm90 us':>9} {'row/sm90':>8} same")
for name, e, h, inter in MODELS:
    for gemm, n, k in (("FC1", 2 * inter, h), ("FC2", h, inter)):
        data, scale, _ = nvfp4_weight(e * n, k, dev)
        w = data.view(e, n, k // 2)
        ws = scale.view(e, -1, scale.shape[1])
        packed = t4.prepack_weight(data).view(e, n, k // 2)
        alpha = torch.rand(e, device=dev) + 0.5
        for rpe in per_expert:
            bm = next((b for b in (256, 128) if rpe >= MT.BLOCK_M_FROM[b]), 64)
            ctas = 2 if bm == 64 and -(-rpe // 64) * e * -(-n // 128) > torch.cuda.get_device_properties(0).multi_processor_count else 1
            t = MT._tactic(where, bm, ctas)   # the heuristic's stages for that block and CTA count
            stages = t.stages
            blocks = -(-rpe // bm)
            rows = e * blocks * bm
            block_expert = torch.arange(e, device=dev, dtype=torch.int32).repeat_interleave(blocks)
            a = torch.randn(rows, k, device=dev, dtype=torch.bfloat16)
            runs = {False: [], True: []}
            outs = {}
            for r in range(rounds):
                for pk in ((False, True) if r % 2 == 0 else (True, False)):
                    wt = packed if pk else w
                    def fn(pk=pk, wt=wt, ws=ws, a=a, t=t, block_expert=block_expert):
                        return K._grouped_gemm(a, None, wt, ws, alpha, block_expert, False, tactic=t, packed=pk)
                    outs[pk] = fn()
                    runs[pk].append(graph_time_us(fn, [()], repeats=3))
            ru, su = statistics.median(runs[False]), statistics.median(runs[True])
            same = torch.equal(outs[False], outs[True])
            print(f"{name:<14} {gemm:<4} {rpe:>6} {f'{bm}/{stages}/{ctas}':<10} {ru:>9.1f} {su:>9.1f} {ru / su:>8.3f} {same}",
                  flush=True)
