"""Launchers of the CuTe DSL backend, with the reference backend's signatures.

Kernels are compiled on first use and cached under a frozen KernelConfig (everything static
about a kernel: op, dtypes, format, layout, variant, TMA shape); sizes, pointers and strides
are runtime arguments, so a warmed-up config never compiles again (in particular not during
CUDA-graph capture). Every launch goes on torch.cuda.current_stream(), passed explicitly.
With programmatic dependent launch on (torch_fp4.set_pdl, sm_90+), configs carry pdl=True: the
kernel is launched with the programmatic-stream-serialization attribute (`.launch(use_pdl=True)`)
and executes griddepcontrol.wait before its first global-memory access. pdl is part of the
config key (a separately compiled kernel); with PDL off no griddepcontrol is emitted.
Inputs that are not contiguous or not 16-byte aligned are copied first (the kernels use
16-byte vector loads and TMA).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Optional

import torch

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Int32
from cutlass.cute.runtime import make_ptr
from cutlass.runtime import make_fake_stream

from ... import formats as F
from ... import meta
from .._common import global_scale_workspace, prepare_outputs, sm_count, use_pdl
from .dequantize import Dequantize
from .global_scale import THREADS as GLOBAL_SCALE_THREADS
from .global_scale import GlobalScale
from .quantize_tma import TmaQuantize, TmaShape, ctas_per_sm, tma_shape
from .quantize_vector import VectorQuantize

# (format, input dtype) pairs for which the TMA kernel was faster than the vector-load kernel
# on an H100 (torch_fp4/bench/cute_variants.py, M*K = 2^16..2^28, K = 4096), from this many input elements
# (M*K, batch included) on: MXFP4 from fp32, 1.5-10% faster from 2^24. Every other pair was
# fastest with the vector kernel at every size (NVFP4 from bf16: TMA 0.75-0.88 of its speed
# at 2^24..2^27), so it always uses that kernel.
TMA_MIN_ELEMENTS = {("mxfp4", "f32"): 1 << 24}
# Tests and benchmarks set these: FORCE_VARIANT = "vector" or "tma" forces one quantize kernel;
# TMA_SHAPE_OVERRIDE (keyword arguments of quantize_tma.tma_shape: consumer_warps, stages,
# stage_bytes, evict_first, max_cols) overrides the TMA kernel's shape.
FORCE_VARIANT: Optional[str] = None
TMA_SHAPE_OVERRIDE: dict = {}
GLOBAL_SCALE_CTAS_PER_SM = 4

_DTYPES = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32",
           torch.float8_e4m3fn: "e4m3"}


@dataclass(frozen=True)
class KernelConfig:
    op: str                 # "quantize", "dequantize", "global_scale"
    dtype: str              # input dtype (quantize, global_scale) or output dtype (dequantize)
    fmt: str = ""           # "nvfp4" or "mxfp4"
    layout: str = ""        # scale layout
    variant: str = ""       # quantize: "vector" or "tma"
    tma: Optional[TmaShape] = None  # quantize, tma: tile, warps and stages
    has_gs: bool = False    # dequantize: a global scale is applied
    pdl: bool = False       # programmatic dependent launch (launch attribute + griddepcontrol)

    def build(self):
        nv = self.fmt == "nvfp4"
        if self.op == "quantize" and self.variant == "tma":
            return TmaQuantize(self.dtype, nv, self.layout, self.tma, self.pdl)
        if self.op == "quantize":
            return VectorQuantize(self.dtype, nv, self.layout, self.pdl)
        if self.op == "dequantize":
            return Dequantize(nv, self.layout, self.dtype, self.has_gs, self.pdl)
        return GlobalScale(self.dtype, self.pdl)


_compiled: dict = {}
_lock = threading.Lock()


def _run(cfg: KernelConfig, device: torch.device, *args) -> None:
    """Compile `cfg` on first use (host only; no stream work), then launch it on `device`."""
    fn = _compiled.get(cfg)
    if fn is None:
        with _lock:
            fn = _compiled.get(cfg)
            if fn is None:
                fn = cute.compile(cfg.build(), *args)
                _compiled[cfg] = fn
    with torch.cuda.device(device):
        fn(*args)


def _ptr(t: Optional[torch.Tensor], dtype=cutlass.Uint8, align: int = 16):
    return make_ptr(dtype, 0 if t is None else t.data_ptr(), cute.AddressSpace.gmem,
                    assumed_align=align)


def _stream(device: torch.device):
    return cuda.CUstream(torch.cuda.current_stream(device).cuda_stream)


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """t itself when contiguous and 16-byte aligned, else an aligned contiguous copy."""
    t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


def _gs_stride(gs: torch.Tensor) -> int:
    return gs.stride(0) if gs.dim() == 1 and gs.numel() > 1 else 0


def compile_only(cfg: KernelConfig):
    """Compile `cfg` with placeholder arguments (no GPU needed; the target is CUTE_DSL_ARCH)
    and return the compiled function with its __ptx__ and __cubin__ (copies are also written
    to CUTE_DSL_DUMP_DIR, by default the working directory)."""
    p, f, i = _ptr(None), _ptr(None, cutlass.Float32, 4), Int32(1)
    if cfg.op == "quantize":
        tail = (i, i) if cfg.variant == "tma" else (i,)
        args = (p, f, p, _ptr(None, align=1), i, i, Int32(4), Int32(128), i, *tail)
    elif cfg.op == "dequantize":
        args = (p, _ptr(None, align=1), f, p, i, i, Int32(4), Int32(128), i, i)
    else:
        args = (p, f, _ptr(None, cutlass.Int32, 4), i, i, i)
    return cute.compile(cfg.build(), *args, make_fake_stream(), options="--keep-ptx --keep-cubin")


def quantize_variant(elements: int, fmt: str, dtype: str) -> str:
    """'tma' or 'vector' for a quantize of `elements` inputs of `dtype` ('bf16', ...) to `fmt`
    ('nvfp4' or 'mxfp4')."""
    if FORCE_VARIANT in ("vector", "tma"):
        return FORCE_VARIANT
    threshold = TMA_MIN_ELEMENTS.get((fmt, dtype))
    return "tma" if threshold is not None and elements >= threshold else "vector"


# ---------------------------------------------------------------------------------------------
# Quantize
# ---------------------------------------------------------------------------------------------
def _quantize(x: torch.Tensor, gs: Optional[torch.Tensor], fmt: F.Fp4Format,
              layout: F.SfLayout) -> tuple[torch.Tensor, torch.Tensor]:
    data, scale = prepare_outputs(*meta.quantize(x, fmt, layout))
    if x.numel() == 0:
        return data, scale
    x = _aligned(x)
    batches = x.shape[0] if x.dim() == 3 else 1
    rows, k = x.shape[-2], x.shape[-1]
    kb = k // fmt.block_size
    mp, kp = F.padded_scale_shape(rows, kb, layout)
    dtype = _DTYPES[x.dtype]
    variant = quantize_variant(x.numel(), fmt.name, dtype)
    pdl = use_pdl(x.device)
    gs_args = (_ptr(gs, cutlass.Float32, 4), Int32(_gs_stride(gs) if gs is not None else 0))
    sizes = (Int32(rows), Int32(kb), Int32(kp), Int32(mp), Int32(batches))
    if variant == "tma":
        shape = tma_shape(k, dtype, fmt.block_size, **TMA_SHAPE_OVERRIDE)
        cfg = KernelConfig("quantize", dtype, fmt.name, layout.value, "tma", shape, pdl=pdl)
        tiles = -(-batches * rows // shape.rows) * -(-k // shape.cols)
        per_sm = ctas_per_sm(shape, dtype, fmt is F.NVFP4)
        grid = max(1, min(tiles, per_sm * sm_count(x.device)))
        _run(cfg, x.device, _ptr(x), gs_args[0], _ptr(data), _ptr(scale, align=1), *sizes,
             gs_args[1], Int32(grid), _stream(x.device))
    else:
        cfg = KernelConfig("quantize", dtype, fmt.name, layout.value, "vector", pdl=pdl)
        _run(cfg, x.device, _ptr(x), gs_args[0], _ptr(data), _ptr(scale, align=1), *sizes,
             gs_args[1], _stream(x.device))
    return data, scale


def nvfp4_quantize(x: torch.Tensor, global_scale: torch.Tensor,
                   sf_layout: F.SfLayout) -> tuple[torch.Tensor, torch.Tensor]:
    return _quantize(x, global_scale, F.NVFP4, sf_layout)


def mxfp4_quantize(x: torch.Tensor, sf_layout: F.SfLayout) -> tuple[torch.Tensor, torch.Tensor]:
    return _quantize(x, None, F.MXFP4, sf_layout)


# ---------------------------------------------------------------------------------------------
# Dequantize
# ---------------------------------------------------------------------------------------------
def fp4_dequantize(data: torch.Tensor, scale: torch.Tensor, global_scale: Optional[torch.Tensor],
                   fmt: F.Fp4Format, sf_layout: F.SfLayout, out_dtype: torch.dtype) -> torch.Tensor:
    out = prepare_outputs(meta.fp4_dequantize(data, out_dtype))
    if out.numel() == 0:
        return out
    raw = _aligned(F.as_uint8(data))
    batches = data.shape[0] if data.dim() == 3 else 1
    rows, kb = data.shape[-2], data.shape[-1] * 2 // fmt.block_size
    mp, kp = F.padded_scale_shape(rows, kb, sf_layout)
    cfg = KernelConfig("dequantize", _DTYPES[out_dtype], fmt.name, sf_layout.value,
                       has_gs=global_scale is not None, pdl=use_pdl(data.device))
    gs = global_scale
    _run(cfg, data.device, _ptr(raw), _ptr(F.as_uint8(scale), align=1),
         _ptr(gs, cutlass.Float32, 4), _ptr(out), Int32(rows), Int32(kb), Int32(kp), Int32(mp),
         Int32(batches), Int32(_gs_stride(gs) if gs is not None else 0), _stream(data.device))
    return out


# ---------------------------------------------------------------------------------------------
# Global scale
# ---------------------------------------------------------------------------------------------
def compute_global_scale(x: torch.Tensor) -> torch.Tensor:
    out = prepare_outputs(meta.compute_global_scale(x))
    x = _aligned(x.reshape(-1)) if x.numel() else x.reshape(-1)
    dtype = _DTYPES[x.dtype]
    per_vector = 16 // x.element_size()
    vectors, tail = divmod(x.numel(), per_vector)
    grid = max(1, min(-(-vectors // GLOBAL_SCALE_THREADS),
                      GLOBAL_SCALE_CTAS_PER_SM * sm_count(out.device)))
    cfg = KernelConfig("global_scale", dtype, pdl=use_pdl(out.device))
    _run(cfg, out.device, _ptr(x if x.numel() else None),
         _ptr(out, cutlass.Float32, 4), _ptr(global_scale_workspace(out.device), cutlass.Int32, 4),
         Int32(vectors), Int32(tail), Int32(grid), _stream(out.device))
    return out
