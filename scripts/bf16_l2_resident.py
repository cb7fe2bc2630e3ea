"""torch bf16 matmul timed on one weight reused call after call (which stays in the L2 when it fits
there) against the same matmul over rotating weight copies (bench.mm.bf16_timer, 3x the L2), in
interleaved rounds, on a GPU:

    python scripts/bf16_l2_resident.py [--shapes N,K;N,K] [--ms 1,16,64] [--rounds 3]

The second is the peer `bench mm` and the A/B scripts time (a model's layers each read weights of
their own); the first is what the A/B scripts' bf16 column timed before it rotated its weights."""
import argparse
import statistics

import torch

from torch_fp4.bench.mm import weight_copies, bf16_timer, parse_shapes
from torch_fp4.bench.timing import l2_bytes


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1024,4096;2048,4096;2048,8192;4096,4096;4608,4096;8192,8192")
    ap.add_argument("--ms", default="1,16,64")
    ap.add_argument("--rounds", type=int, default=3)
    opt = ap.parse_args()
    dev = torch.device("cuda")
    print(f"{torch.cuda.get_device_name(dev)}; L2 {l2_bytes(dev) / 2**20:.0f} MiB", flush=True)
    for n, k in parse_shapes(opt.shapes):
        w16 = weight_copies(torch.randn(n, k, device=dev, dtype=torch.bfloat16))
        for m in map(int, opt.ms.split(",")):
            a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            timers = {"resident": bf16_timer(a, w16[:1]), "rotating": bf16_timer(a, w16)}
            us = {c: [] for c in timers}
            for r in range(opt.rounds):
                for c in (list(timers) if r % 2 == 0 else list(timers)[::-1]):
                    us[c].append(timers[c]())
            res, rot = (statistics.median(us[c]) for c in ("resident", "rotating"))
            print(f"N={n:5d} K={k:5d} M={m:4d} weight {n * k * 2 / 2**20:6.1f} MiB x{len(w16):2d}  "
                  f"bf16 resident {res:7.2f} us  rotating {rot:7.2f} us  rotating/resident {rot / res:5.2f}",
                  flush=True)
        del w16
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
