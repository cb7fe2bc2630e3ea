"""Shared by every GPU backend: requirement checks, device facts, output allocation."""
from __future__ import annotations

import dataclasses
import functools
import importlib.util
import threading
from typing import Optional

import torch

from .. import formats as F
from ..problems import MmProblem, Problem

# Programmatic dependent launch (sm_90+), off by default; torch_fp4.set_pdl() sets it. When on,
# every kernel of every backend is launched so it may start while the previous kernel on the
# stream finishes, and waits for that kernel's memory (griddepcontrol.wait) before touching any.
PDL = False
MAX_GRID_Z = 65535   # CUDA's grid z limit: the batch entries of one quantize launch


def use_pdl(device: torch.device) -> bool:
    """Whether launches on `device` use programmatic dependent launch."""
    return PDL and torch.cuda.get_device_capability(device)[0] >= 9


def formed_alpha(alpha: Optional[torch.Tensor], a_global_scale: Optional[torch.Tensor],
                 b_global_scale: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """mm_fp4's alpha as a tensor, for a launcher whose kernels take alpha only: alpha itself, or
    with b_global_scale formats.nvfp4_alpha(a_global_scale, b_global_scale) (torch launches)."""
    return alpha if b_global_scale is None else F.nvfp4_alpha(a_global_scale, b_global_scale)


def with_bias(gemm, problem: Optional[MmProblem], out_dtype: torch.dtype,
              bias: Optional[torch.Tensor]) -> torch.Tensor:
    """mm_fp4's bias for a launcher whose kernels take none: gemm(out_dtype, problem) when bias is
    None; else the spec's RN_out(RN_fp32(v + bias)) from the GEMM's fp32 output v = RN_fp32(alpha *
    acc) (its problem with an fp32 output; two more torch launches)."""
    if bias is None:
        return gemm(out_dtype, problem)
    p32 = None if problem is None else dataclasses.replace(problem, out_dtype=torch.float32)
    v = gemm(torch.float32, p32)
    return (v + bias.float()).to(out_dtype)


# Tests set this to True so every freshly allocated output starts as 0xFF bytes: an element a
# kernel forgets to write then shows up as a mismatch against the reference.
POISON_OUTPUTS = False


try:  # the allocator inductor's generated code calls: no argument parsing (torch >= 2.3)
    from torch._C._dynamo.guards import _empty_strided_cuda
except ImportError:  # pragma: no cover
    _empty_strided_cuda = None
_current_device = getattr(torch._C, "_cuda_getDevice", None)   # absent from CPU builds
if _current_device is None:
    _empty_strided_cuda = None


def cuda_empty(shape: tuple[int, ...], dtype: torch.dtype, like: torch.Tensor) -> torch.Tensor:
    """An uninitialized contiguous 1-D or 2-D tensor on `like`'s CUDA device: from the caching
    allocator's direct entry point when `like` is on the current device (about a third of
    torch.empty's host time), else by torch.empty."""
    if _empty_strided_cuda is not None and like.get_device() == _current_device():
        return _empty_strided_cuda(shape, (max(shape[1], 1), 1) if len(shape) == 2 else (1,), dtype)
    return torch.empty(shape, dtype=dtype, device=like.device)


def prepare_outputs(*tensors: torch.Tensor):
    """Outputs allocated by a launcher (from torch_fp4.meta); poisoned when POISON_OUTPUTS."""
    if POISON_OUTPUTS:
        for t in tensors:
            t.view(torch.uint8).fill_(0xFF) if t.element_size() == 1 else t.fill_(float("nan"))
    return tensors if len(tensors) > 1 else tensors[0]


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (asked once per device)."""
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _installed(module: str) -> bool:
    """Whether `module` can be imported (asked once per process: this runs on every op call)."""
    return importlib.util.find_spec(module) is not None


def cuda_requirement(p: Problem, module: str, min_capability: tuple[int, int]) -> Optional[str]:
    """None when the problem is on a CUDA device of at least `min_capability` and `module` can be
    imported; otherwise the reason."""
    if not p.is_cuda:
        return f"needs CUDA tensors (got {p.device})"
    cap = p.capability
    if cap < min_capability:
        return f"needs compute capability >= {min_capability[0]}.{min_capability[1]} (device has {cap[0]}.{cap[1]})"
    if not _installed(module):
        return f"needs the Python package {module!r}, which is not installed"
    return None


_WORKSPACES: dict[tuple[int, int], torch.Tensor] = {}


def _zeros_outside_graph_pools(n: int, device: torch.device) -> torch.Tensor:
    """int32 zeros from the ordinary allocator, made on a short-lived thread: torch.compile's
    CUDA graph trees route every allocation of the calling thread to a graph's memory pool during
    warm-up (not only during capture), and a tensor kept from such a pool breaks the graph."""
    box: list[torch.Tensor] = []

    def make():
        with torch.cuda.device(device):
            box.append(torch.zeros(n, dtype=torch.int32, device=device))
            torch.cuda.current_stream().synchronize()
    worker = threading.Thread(target=make)
    worker.start()
    worker.join()
    if not box:
        raise RuntimeError(f"could not allocate a workspace on {device}")
    return box[0]


def global_scale_workspace(device: torch.device) -> torch.Tensor:
    """compute_global_scale's two int32 words (amax bits, finished-program count), zero between
    launches (the kernel's last program resets them), one per (device, stream) so concurrent
    streams never share one. One needed during CUDA-graph capture belongs to the graph (its zero
    fill is captured with it) and is not kept."""
    key = (device.index, torch.cuda.current_stream(device).cuda_stream)
    ws = _WORKSPACES.get(key)
    if ws is None:
        if torch.cuda.is_current_stream_capturing():
            return torch.zeros(2, dtype=torch.int32, device=device)
        ws = _WORKSPACES[key] = _zeros_outside_graph_pools(2, device)
    return ws


def mm_key(p: MmProblem, m_bucket: int) -> str:
    """The tactic-cache key of an mm_fp4 problem whose M falls in the bucket `m_bucket`."""
    a_kind = f"fp4:{p.sf_layout.value}" if p.w4a4 else str(p.a_dtype).removeprefix("torch.")
    w_kind = "" if p.weight_layout is F.WeightLayout.ROW else f",w:{p.weight_layout.value}"
    return (f"M<={m_bucket},N={p.n},K={p.k},{p.fmt.name},{a_kind},"
            f"{str(p.out_dtype).removeprefix('torch.')}{w_kind}")


# ---- device facts the GEMM tactic spaces size their launches by (defaults off CUDA) ----
def problem_sm_count(p: Problem, default: int = 132) -> int:
    """SMs of the problem's device (`default` off CUDA)."""
    return sm_count(p.device) if p.is_cuda else default


def problem_smem_per_block(p: Problem, default: int) -> int:
    """Opt-in shared memory per block of the problem's device (`default` off CUDA)."""
    if p.is_cuda:
        return torch.cuda.get_device_properties(p.device).shared_memory_per_block_optin
    return default


def problem_smem_per_sm(p: Problem, default: int) -> int:
    """Shared memory per SM of the problem's device (`default` off CUDA)."""
    if p.is_cuda:
        return torch.cuda.get_device_properties(p.device).shared_memory_per_multiprocessor
    return default


def empty_k_slice(split: int, steps: int) -> bool:
    """Whether splitting `steps` K steps into slices of ceil(steps / split) leaves one empty."""
    return split > 1 and (split - 1) * -(-steps // split) >= steps


def largest_split(split: int, steps: int) -> int:
    """`split`, lowered until no K slice is empty."""
    while empty_k_slice(split, steps):
        split -= 1
    return split


def smem_reason(smem: int, limit: int):
    """Why a launch of `smem` bytes of shared memory cannot run under `limit`, or None."""
    if smem > limit:
        return (f"needs {smem / 1024:.1f} KiB of shared memory (more than the {limit // 1024} KiB "
                f"per block of this GPU)")
    return None


def tactic_or_default(tactic, space, p: Problem, op: str = "mm_fp4"):
    """A launcher's tactic: the one it was given (dispatch checked it), else the space's
    heuristic, checked (a direct call)."""
    if tactic is not None:
        return tactic
    t = space.default(p)
    reason = space.why_not(t, p)
    if reason is not None:
        raise ValueError(f"{op}: tactic {t.label()} cannot run this problem: {reason}")
    return t
