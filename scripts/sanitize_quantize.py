"""One small, odd-shaped call of every quantize-family kernel of every installed GPU backend;
run under compute-sanitizer by scripts/sanitize_quantize.sh (out-of-bounds and misaligned
accesses, uninitialised reads, races)."""
import torch

import torch_fp4 as t4
from torch_fp4.backends import Backend

torch.manual_seed(0)
x = torch.randn(129, 96, device="cuda", dtype=torch.bfloat16)
x3 = torch.randn(3, 9, 64, device="cuda", dtype=torch.float16)
for backend in (Backend.TRITON, Backend.CUTE_DSL, Backend.CUDA):
    reason = t4.unsupported_reason("nvfp4_quantize", backend, x, torch.ones(1, device="cuda"))
    if reason is not None:
        print(f"{backend.label}: skipped ({reason})")
        continue
    gs = t4.compute_global_scale(x, backend=backend)
    for layout in ("128x4", "8x4", "linear"):
        d, s = t4.nvfp4_quantize(x, gs, layout, backend=backend)
        t4.fp4_dequantize(d, s, gs, sf_layout=layout, backend=backend)
        dm, sm = t4.mxfp4_quantize(x3, layout, backend=backend)
        t4.fp4_dequantize(dm, sm, block_size=32, sf_layout=layout, out_dtype=torch.float32,
                          backend=backend)
    torch.cuda.synchronize()
    print(f"{backend.label}: ran")
