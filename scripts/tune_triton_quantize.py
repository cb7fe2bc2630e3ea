"""Times the Triton NVFP4 quantize kernel over tile shapes and warp counts on the current GPU and
prints the fraction of copy bandwidth per shape (used to set TILE_ELEMENTS / TILE_COLUMNS /
num_warps in torch_fp4/kernels/triton/quantize.py)."""
import itertools

import torch

import torch_fp4 as t4
from torch_fp4.bench.quantize import _moved_bytes
from torch_fp4.bench.timing import copy_bandwidth_gbs, graph_time_us, rotation
from torch_fp4.kernels.triton import quantize as Q

SHAPES = [(32768, 16384), (8192, 4096), (2048, 4096), (128, 4096), (16384, 1024)]


def main():
    dev = torch.device("cuda")
    bw = copy_bandwidth_gbs(dev)
    print(f"{torch.cuda.get_device_name(dev)}; copy {bw:.0f} GB/s")
    data = {}
    for m, k in SHAPES:
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        gs = t4.compute_global_scale(x)
        data[(m, k)] = [(x, gs)] + [(torch.randn_like(x), gs) for _ in range(rotation(m * k * 2, dev) - 1)]
    print(f"{'elems':>6} {'cols':>5} {'warps':>5} " + " ".join(f"{m}x{k:>6}" for m, k in SHAPES))
    for elems, cols, warps in itertools.product((4096, 8192, 16384, 32768), (128, 256, 512), (4, 8)):
        Q.TILE_ELEMENTS, Q.TILE_COLUMNS = elems, cols
        Q._LAUNCH["num_warps"] = warps
        fr = []
        for (m, k), inputs in data.items():
            us = graph_time_us(lambda x, gs: Q.nvfp4_quantize(x, gs, t4.SfLayout.LAYOUT_128x4), inputs)
            fr.append(_moved_bytes(m, k, t4.NVFP4) / us / 1e3 / bw)
        print(f"{elems:>6} {cols:>5} {warps:>5} " + " ".join(f"{100 * f:>11.0f}%" for f in fr), flush=True)


if __name__ == "__main__":
    main()
