"""Tile sweep of the Triton fused MoE (W4A16) for decode batches of the bench moe models: FC1
tiles with FC2 at its default, then FC2 tiles (with split-K) with FC1 at its default; prints
the default and the best of each. Usage: python scripts/sweep_moe.py [T ...] (default 1 16)."""
import itertools
import sys

import torch

from torch_fp4.bench import moe as B
from torch_fp4.bench.timing import graph_time_us
from torch_fp4.kernels.triton import moe_fused as MF
from torch_fp4.kernels.triton import moe_gemm as MG

TILES = [MG.GemmTile(bn, bk, w, s) for bn, bk, w, s in itertools.product(
    (32, 64, 128), (128,), (4, 8), (3, 5)) if not (bn == 32 and w == 8)]


def sweep(m: B.Model, tokens: int) -> None:
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    experts = m.experts
    w1, w2, x, ids, tw = B.routed_batch(m, experts, tokens, dev, gen)
    base = MG.default_config(tokens, m.top_k, experts, m.hidden, m.inter)

    def t(cfg):
        try:
            return graph_time_us(lambda: MF.fused_moe(x, *w1, *w2, ids, tw, None, None, 0,
                                                      torch.bfloat16, config=cfg), [()])
        except Exception:   # a tile that does not compile or launch here
            return float("inf")
    t0 = t(base)
    fc1 = sorted((t(MG.MoeConfig(base.block_m, True, tile, base.fc2, base.fc2_split)), tile) for tile in TILES)
    fc2 = sorted((t(MG.MoeConfig(base.block_m, True, base.fc1, tile, split)), tile, split)
                 for tile in TILES for split in (1, 2, 4))
    print(f"{m.name:<14} T={tokens:<3} default {t0:7.1f} us {base.label()}", flush=True)
    print("   fc1 best: " + "; ".join(f"{us:.1f} {tl.block_n}x{tl.block_k}w{tl.num_warps}s{tl.num_stages}"
                                      for us, tl in fc1[:4]), flush=True)
    print("   fc2 best: " + "; ".join(f"{us:.1f} {tl.block_n}x{tl.block_k}w{tl.num_warps}s{tl.num_stages}k{sp}"
                                      for us, tl, sp in fc2[:4]), flush=True)
    torch.cuda.empty_cache()


if __name__ == "__main__":
    for tokens in [int(a) for a in sys.argv[1:]] or [1, 16]:
        for m in B.MODELS:
            sweep(m, tokens)
