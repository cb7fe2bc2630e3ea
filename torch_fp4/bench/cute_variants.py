"""`python -m torch_fp4.bench.cute_variants [FMT:DTYPE:K[:LOW:HIGH] ...]`: the CuTe DSL quantize
kernels (vector loads vs TMA producer/consumer) against each other and a device copy, for
M*K = 2^LOW .. 2^HIGH. The crossover it shows sets kernels/cute/launch.TMA_MIN_ELEMENTS."""
from __future__ import annotations

import sys

import torch

import torch_fp4 as t4
from torch_fp4.bench.timing import graph_time_us
from torch_fp4.kernels.cute import launch as L

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32,
          "e4m3": torch.float8_e4m3fn}


def crossover(k: int = 4096, fmt: str = "nvfp4", dtype=torch.bfloat16, low: int = 16,
              high: int = 28) -> None:
    print(f"{torch.cuda.get_device_name()}: {fmt} from {dtype}, K={k}; frac = bytes moved / time "
          f"/ copy bandwidth of the input's bytes", flush=True)
    print(f"{'M*K':>6} {'copy TB/s':>9} {'vector us':>10} {'frac':>5} {'tma us':>8} {'frac':>5}  faster")
    gs = torch.full((1,), 10.0, device="cuda")
    for log2 in range(low, high + 1):
        x = torch.randn(max(1, (1 << log2) // k), k, device="cuda").to(dtype)
        src = x.view(torch.uint8).reshape(-1)
        dst = torch.empty_like(src)
        copy_bw = 2 * src.numel() / graph_time_us(lambda: dst.copy_(src), [()]) / 1e6
        moved = src.numel() + x.numel() // 2 + x.numel() // (16 if fmt == "nvfp4" else 32)
        times = {}
        for variant in ("vector", "tma"):
            L.FORCE_VARIANT = variant
            try:
                if fmt == "nvfp4":
                    times[variant] = graph_time_us(lambda: t4.nvfp4_quantize(x, gs, backend="cute-dsl"), [()])
                else:
                    times[variant] = graph_time_us(lambda: t4.mxfp4_quantize(x, backend="cute-dsl"), [()])
            finally:
                L.FORCE_VARIANT = None
        line = f"{'2^%d' % log2:>6} {copy_bw:>9.2f}"
        for variant in ("vector", "tma"):
            line += f" {times[variant]:>10.2f} {moved / times[variant] / 1e6 / copy_bw:>5.2f}"
        print(line + "  " + min(times, key=times.get), flush=True)
        del x, src, dst


if __name__ == "__main__":
    for spec in sys.argv[1:] or ["nvfp4:bf16:4096"]:
        fmt, dt, k, *bounds = spec.split(":")
        crossover(int(k), fmt, DTYPES[dt], *map(int, bounds))
