"""The cuda backend's quantize-family kernels on a GPU: bit-exactness spot checks beyond
tests/test_gpu_quantize_backends.py, then bandwidth against a device-to-device copy.

    PYTHONPATH=. python3 scripts/bench_cuda_quantize.py [--skip-checks] [--skip-bench]

Timing: `reps` calls captured in one CUDA graph (no Python or launch gaps between kernels),
replayed `trials` times, CUDA events around each replay, median per call. Bandwidth counts the
bytes each kernel must read plus the bytes it must write; a copy of N bytes moves 2N. The fraction
is the kernel's bandwidth over that of a copy of its input's bytes (same size, same caching).
"""
from __future__ import annotations

import argparse

import torch

import torch_fp4 as t4
from torch_fp4 import formats as F
from torch_fp4.bench.timing import graph_time_us
from torch_fp4.kernels import _common

_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32}


def _bits(t: torch.Tensor) -> torch.Tensor:
    if t.element_size() == 1:
        return t.view(torch.uint8)
    return torch.where(torch.isnan(t), torch.full_like(t, float("nan")), t).view(_INT_VIEW[t.element_size()])


def _same(got, want, what: str, failures: list) -> None:
    got = got if isinstance(got, (tuple, list)) else (got,)
    want = want if isinstance(want, (tuple, list)) else (want,)
    for i, (g, w) in enumerate(zip(got, want)):
        if g.shape != w.shape or g.dtype != w.dtype or not torch.equal(_bits(g), _bits(w)):
            n = "shape/dtype" if g.shape != w.shape or g.dtype != w.dtype else int((_bits(g) != _bits(w)).sum())
            failures.append(f"{what}: output {i}: {n} differ")


def _edge(shape, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(shape, device="cuda", generator=g)
    flat = x.view(-1, shape[-1])
    flat *= torch.exp2(torch.randint(-30, 30, (flat.shape[0], 1), device="cuda", generator=g).float())
    specials = [float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-40, -1e-45, 6.0, -5.0, 2.5]
    for i, v in enumerate(specials):
        if i < flat.shape[0]:
            flat[i, (7 * i) % shape[-1]] = v
    if dtype == torch.float8_e4m3fn:
        x = torch.where(torch.isinf(x), torch.full_like(x, 448.0), x.clamp(-448, 448))
    return x.to(dtype)


def run_checks() -> list:
    failures: list = []
    _common.POISON_OUTPUTS = True
    dtypes = (torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn)

    # Global scales the test suite does not use: negative, zero, infinite, NaN, tiny, huge.
    odd_gs = (-3.0, 0.0, float("inf"), -float("inf"), float("nan"), 1e-38, 1e38, 3e-45, 1e-30)
    for dtype in (torch.bfloat16, torch.float32):
        x = _edge((64, 256), dtype, 1)
        for value in odd_gs:
            gs = torch.full((1,), value, device="cuda")
            for layout in ("128x4", "linear"):
                _same(t4.nvfp4_quantize(x, gs, layout, backend="cuda"),
                      t4.nvfp4_quantize(x, gs, layout, backend="reference"), f"nvfp4 gs={value} {dtype} {layout}", failures)
    xb = _edge((len(odd_gs), 40, 64), torch.bfloat16, 2)
    gsb = torch.tensor(odd_gs, device="cuda", dtype=torch.float32)
    _same(t4.nvfp4_quantize(xb, gsb, "8x4", backend="cuda"),
          t4.nvfp4_quantize(xb, gsb, "8x4", backend="reference"), "nvfp4 per-batch odd gs", failures)
    gs_strided = torch.stack([gsb, gsb], 1)[:, 0]
    _same(t4.nvfp4_quantize(xb, gs_strided, "8x4", backend="cuda"),
          t4.nvfp4_quantize(xb, gsb, "8x4", backend="reference"), "nvfp4 strided gs", failures)

    # Sources whose data pointer is not 16-byte aligned (element loads instead of vectors).
    for dtype in dtypes:
        base = _edge((33 * 128 + 1,), dtype, 3)
        x = base[1:].view(33, 128)
        gs = torch.full((1,), 7.0, device="cuda")
        for layout in ("128x4", "8x4", "linear"):
            _same(t4.nvfp4_quantize(x, gs, layout, backend="cuda"),
                  t4.nvfp4_quantize(x.clone(), gs, layout, backend="reference"), f"nvfp4 unaligned {dtype} {layout}", failures)
            _same(t4.mxfp4_quantize(x, layout, backend="cuda"),
                  t4.mxfp4_quantize(x.clone(), layout, backend="reference"), f"mxfp4 unaligned {dtype} {layout}", failures)
        _same(t4.compute_global_scale(x, backend="cuda"), t4.compute_global_scale(x, backend="reference"),
              f"global scale unaligned {dtype}", failures)

    # Dequantize from unaligned data, with odd global scales.
    g = torch.Generator(device="cuda").manual_seed(4)
    for block in (16, 32):
        raw = torch.randint(0, 256, (3 * 70 * 64 + 1,), dtype=torch.uint8, device="cuda", generator=g)
        data = raw[1:].view(3, 70, 64)
        for layout in ("128x4", "8x4", "linear"):
            shape = F.scale_shape((3, 70, 128), block, layout)
            scale = torch.randint(0, 256, shape, dtype=torch.uint8, device="cuda", generator=g)
            gs_list = [None] if block == 32 else [None, torch.tensor([-2.0, 0.0, float("inf")], device="cuda"),
                                                 torch.tensor([float("nan"), 1e-38, 3e38], device="cuda")]
            for gs in gs_list:
                for out_dtype in (torch.bfloat16, torch.float16, torch.float32):
                    args = (data, scale, gs, block, layout, out_dtype)
                    _same(t4.fp4_dequantize(*args, backend="cuda"),
                          t4.fp4_dequantize(data.clone(), *args[1:], backend="reference"),
                          f"dequantize unaligned block={block} {layout} gs={gs} {out_dtype}", failures)

    # Global scale: non-contiguous, odd sizes, NaN in the tail, 0-d, empty.
    for dtype in dtypes:
        for n in (1, 3, 17, 1000, 4099, 1 << 20 | 5):
            x = _edge((n, 1), dtype, n)[:, 0]
            _same(t4.compute_global_scale(x, backend="cuda"), t4.compute_global_scale(x, backend="reference"),
                  f"global scale n={n} {dtype}", failures)
        x = _edge((300, 64), dtype, 5)
        _same(t4.compute_global_scale(x.t(), backend="cuda"), t4.compute_global_scale(x.t(), backend="reference"),
              f"global scale transposed {dtype}", failures)
    x = torch.randn(4097, device="cuda")
    x[-1] = float("nan")
    _same(t4.compute_global_scale(x, backend="cuda"), t4.compute_global_scale(x, backend="reference"), "gs NaN tail", failures)
    for x in (torch.tensor(3.0, device="cuda"), torch.empty(0, 16, device="cuda")):
        _same(t4.compute_global_scale(x, backend="cuda"), t4.compute_global_scale(x, backend="reference"),
              f"global scale shape {tuple(x.shape)}", failures)

    # More batch entries than a grid's y dimension holds (65535).
    x = _edge((70000, 1, 32), torch.bfloat16, 6)
    gs = torch.rand(70000, device="cuda") * 100 + 0.1
    _same(t4.nvfp4_quantize(x, gs, "128x4", backend="cuda"),
          t4.nvfp4_quantize(x, gs, "128x4", backend="reference"), "nvfp4 batch 70000", failures)
    _same(t4.mxfp4_quantize(x, "8x4", backend="cuda"), t4.mxfp4_quantize(x, "8x4", backend="reference"),
          "mxfp4 batch 70000", failures)
    d, s = t4.nvfp4_quantize(x, gs, "128x4", backend="reference")
    _same(t4.fp4_dequantize(d, s, gs, 16, "128x4", torch.bfloat16, backend="cuda"),
          t4.fp4_dequantize(d, s, gs, 16, "128x4", torch.bfloat16, backend="reference"), "dequantize batch 70000", failures)

    # Large tensors in every input dtype.
    for dtype in dtypes:
        x = _edge((8192, 4096), dtype, 7)
        gs = t4.compute_global_scale(x, backend="reference")
        _same(t4.compute_global_scale(x, backend="cuda"), gs, f"global scale 2^25 {dtype}", failures)
        _same(t4.nvfp4_quantize(x, gs, backend="cuda"), t4.nvfp4_quantize(x, gs, backend="reference"),
              f"nvfp4 2^25 {dtype}", failures)
        _same(t4.mxfp4_quantize(x, backend="cuda"), t4.mxfp4_quantize(x, backend="reference"),
              f"mxfp4 2^25 {dtype}", failures)
    _common.POISON_OUTPUTS = False
    return failures


def graph_seconds(fn) -> float:
    """Seconds per call of fn, from CUDA-graph replays (torch_fp4.bench.timing)."""
    return graph_time_us(fn, [()]) * 1e-6


def copy_bandwidth(nbytes: int) -> float:
    src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * nbytes / graph_seconds(lambda: dst.copy_(src))


def run_bench(shapes, dtypes) -> None:
    big = copy_bandwidth(1 << 30)
    print(f"device {torch.cuda.get_device_name()}: copy of 1 GiB moves {big / 1e9:.0f} GB/s (read + write)")
    print(f"{'op':<22}{'dtype':<10}{'M x K':>14}{'us':>10}{'GB/s':>8}{'copy GB/s':>11}{'frac':>7}{'of 1GiB':>9}")
    for dtype in dtypes:
        for m, k in shapes:
            x = (torch.randn(m, k, device="cuda") * 3).to(dtype)
            n = m * k
            esize = x.element_size()
            copy_bw = copy_bandwidth(n * esize)
            gs = t4.compute_global_scale(x, backend="cuda")
            dn, sn = t4.nvfp4_quantize(x, gs, backend="cuda")
            dm, sm = t4.mxfp4_quantize(x, backend="cuda")
            cases = [
                ("compute_global_scale", lambda: t4.compute_global_scale(x, backend="cuda"), n * esize),
                ("nvfp4_quantize", lambda: t4.nvfp4_quantize(x, gs, backend="cuda"),
                 n * esize + n // 2 + sn.numel()),
                ("mxfp4_quantize", lambda: t4.mxfp4_quantize(x, backend="cuda"),
                 n * esize + n // 2 + sm.numel()),
            ]
            if dtype == torch.bfloat16:
                cases += [
                    ("dequantize nvfp4>bf16", lambda: t4.fp4_dequantize(dn, sn, gs, 16, backend="cuda"),
                     n // 2 + sn.numel() + 2 * n),
                    ("dequantize mxfp4>bf16", lambda: t4.fp4_dequantize(dm, sm, None, 32, backend="cuda"),
                     n // 2 + sm.numel() + 2 * n),
                ]
            for name, fn, nbytes in cases:
                sec = graph_seconds(fn)
                bw = nbytes / sec
                print(f"{name:<22}{str(dtype).replace('torch.', ''):<10}{f'{m}x{k}':>14}{sec * 1e6:>10.1f}"
                      f"{bw / 1e9:>8.0f}{copy_bw / 1e9:>11.0f}{bw / copy_bw:>7.2f}{bw / big:>9.2f}")
            del x, dn, sn, dm, sm
            torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--skip-checks", action="store_true")
    parser.add_argument("--skip-bench", action="store_true")
    args = parser.parse_args()
    if not args.skip_checks:
        failures = run_checks()
        print(f"spot checks: {len(failures)} failures")
        for f in failures[:40]:
            print("  FAIL", f)
    if not args.skip_bench:
        shapes = [(1024, 1024), (128, 4096), (8192, 4096), (32768, 4096)]
        run_bench(shapes, (torch.bfloat16,))
        run_bench([(8192, 4096)], (torch.float16, torch.float32, torch.float8_e4m3fn))


if __name__ == "__main__":
    main()
