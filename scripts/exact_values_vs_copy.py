"""The exact-values launch of W4A4 (kernels/cuda/quantize.exact_values: NVFP4, global scale given)
alone, beside an elementwise copy of the same bytes (`torch.neg`, bf16 in and out), on a GPU:
rotating inputs, medians of five interleaved rounds, us per call and GB/s (bytes read + written).

    python scripts/exact_values_vs_copy.py M[,M...]      (K = 8192 and 28672)
"""
import sys

import torch

from torch_fp4.bench.timing import graph_time_us, interleaved_medians, rotation
from torch_fp4.kernels.cuda.quantize import exact_values


def main(ms: list[int]) -> None:
    dev = torch.device("cuda")
    gs = torch.full((1,), 448.0 * 6 / 4.0, device=dev)
    print(f"{'K':>6} {'M':>5} | {'values':>7} {'neg':>7} | {'GB/s v':>7} {'GB/s n':>7}")
    for k in (8192, 28672):
        for m in ms:
            xs = [(torch.randn(m, k, device=dev, dtype=torch.bfloat16), torch.empty(m, k, device=dev, dtype=torch.bfloat16))
                  for _ in range(rotation(m * k * 4, dev))]
            us = interleaved_medians({
                "values": lambda: graph_time_us(lambda x, o: exact_values(x, gs, out=o), xs),
                "neg": lambda: graph_time_us(lambda x, o: torch.neg(x, out=o), xs)}, 5)
            kb = 4 * m * k / 1e3
            print(f"{k:>6} {m:>5} | {us['values']:>7.2f} {us['neg']:>7.2f} | {kb / us['values']:>7.0f} {kb / us['neg']:>7.0f}",
                  flush=True)


if __name__ == "__main__":
    main([int(v) for v in sys.argv[1].split(",")])
