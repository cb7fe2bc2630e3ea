"""The C entry points of the cuda backend's kernel libraries (csrc/capi.h, built by build.py),
called through ctypes with raw pointers, sizes and the current raw CUDA stream.

`library(index, name)` loads a library once per process (building it first when the cache lacks
it); afterwards it is one dict lookup. Each entry point returns a status that `check` turns into
an exception naming the call.
"""
from __future__ import annotations

import ctypes
import os
import threading

import torch

from . import build

_P, _I, _L = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
_HEAD = (_I, _P, _I)                                              # device, stream, pdl
_MM = (_P, _P, _P, _P, _P, _P, _P, _L, _L, _L, _L, _I, _I, _I, _I)  # make_mm_operands (mm_operands.h)
_BIAS = (_P, _I)     # a dense GEMM's bias [N] and its DTYPE_CODES code (null, 0: none)
_QUANTIZE = (_P, _P, _L, _P, _P, _L, _L, _L, _L, _L, _I, _I)
# (result, arguments) of every entry point, by name (without the torch_fp4_ prefix); the test
# tests/test_cuda_capi.py compares them with the C declarations.
SIGNATURES = {
    "nvfp4_quantize": (_I, _HEAD + _QUANTIZE),
    "mxfp4_quantize": (_I, _HEAD + _QUANTIZE),
    "exact_values": (_I, _HEAD + (_P, _P, _L, _P, _L, _L, _L, _I, _I, _P, _L)),
    "moe_swiglu": (_I, _HEAD + (_P, _I, _P, _I, _P, _L, _L, _L, _I, _L, _L, _I, _P, _L, _P)),
    "dequantize": (_I, _HEAD + (_P, _P, _P, _L, _P, _L, _L, _L, _L, _L, _I, _I, _I)),
    "global_scale": (_I, _HEAD + (_P, _L, _I, _P, _P)),
    "mm_small_m": (_I, _HEAD + _MM + _BIAS + (_I,) * 5),
    "mm_wgmma": (_I, _HEAD + _MM + _BIAS + (_I,) * 7 + (_P,)),
    "mm_wgmma_workspace_bytes": (_L, (_I,) + _MM + (_I,) * 7),
    "mm_wgmma_grouped": (_I, _HEAD + _MM + (_I,) * 5 + (_P, _L, _L, _L)),
    "moe_decode_workspace_bytes": (_L, (_P,)),
    "moe_decode": (_I, _HEAD + (_P,) * 17),
    "moe_decode_graph_create": (_P, (_I,)),
    "moe_decode_graph_destroy": (_I, (_I, _P)),
    "moe_decode_graph_state": (_I, (_P,)),
    "error_string": (ctypes.c_char_p, (_I,)),
}



class MoeDecodePlan(ctypes.Structure):
    """csrc/moe_decode.h's MoeDecodePlan: fused_moe's decode path, fixed per problem."""
    _fields_ = [(name, _L) for name in (
        "tokens", "hidden", "inter", "experts", "top_k", "local_offset", "strict", "act_fp16", "out_dtype",
        "block_m", "warps", "tiles_per_warp", "block_k", "stages", "fc1_split", "fc2_split", "w1_kp", "w2_kp",
        "w1_s_expert", "w2_s_expert", "a2_gs_stride", "mx", "bias1_dtype", "bias2_dtype", "activation", "swiglu_alpha_bits",
        "swiglu_limit_bits", "act_mx", "packed")]


# launch.h's DType codes.
DTYPE_CODES = {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2, torch.float8_e4m3fn: 3}


class Library:
    """One loaded kernel library: its entry points as attributes (nvfp4_quantize, mm_wgmma, ...)."""

    def __init__(self, name: str, path: os.PathLike):
        self.name = name
        self._dll = ctypes.CDLL(os.fspath(path), mode=os.RTLD_LOCAL)
        for entry, (result, args) in SIGNATURES.items():
            fn = getattr(self._dll, f"torch_fp4_{entry}", None)
            if fn is not None:
                fn.restype, fn.argtypes = result, args
                setattr(self, entry, fn)

    def check(self, status: int, what: str) -> None:
        """Raises when an entry point's status is not 0 (capi.h's conventions)."""
        if status:
            raise RuntimeError(f"torch_fp4 cuda backend ({self.name}): {what}: "
                               f"{self.error_string(status).decode()} (status {status})")


_LOCK = threading.Lock()
_LOADED: dict[tuple[int, str], Library] = {}


def library(index: int, name: str) -> Library:
    """Library `name` for CUDA device `index` (built on first use; then a dict lookup)."""
    lib = _LOADED.get((index, name))
    if lib is None:
        capability = torch.cuda.get_device_capability(index)
        with _LOCK:
            lib = _LOADED.get((index, name))
            if lib is None:
                lib = _LOADED[(index, name)] = Library(name, build.build(capability, [name])[name])
    return lib


def load_all(index: int, names=None) -> list[Library]:
    """Builds (in one parallel build) and loads the libraries `names` (default: every one)."""
    names = list(build.LIBRARIES) if names is None else list(names)
    build.build(torch.cuda.get_device_capability(index), names)
    return [library(index, n) for n in names]


def raw_stream(index: int) -> int:
    """The current CUDA stream of device `index` as a raw handle (0: the legacy default stream)."""
    return torch._C._cuda_getCurrentRawStream(index)
