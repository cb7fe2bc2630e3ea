"""Shared by every GPU backend: requirement checks and output allocation."""
from __future__ import annotations

import functools
import importlib.util
from typing import Optional

import torch

# Programmatic dependent launch (sm_90+), off by default; torch_fp4.set_pdl() sets it. When on,
# every kernel of every backend is launched so it may start while the previous kernel on the
# stream finishes, and waits for that kernel's memory (griddepcontrol.wait) before touching any.
PDL = False


def use_pdl(device: torch.device) -> bool:
    """Whether launches on `device` use programmatic dependent launch."""
    return PDL and torch.cuda.get_device_capability(device)[0] >= 9


# Tests set this to True so every freshly allocated output starts as 0xFF bytes: an element a
# kernel forgets to write then shows up as a mismatch against the reference.
POISON_OUTPUTS = False


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


def cuda_requirement(args: tuple, module: str, min_capability: tuple[int, int]) -> Optional[str]:
    """None when the first tensor argument is on a CUDA device of at least `min_capability` and
    `module` can be imported; otherwise the reason."""
    t = next((a for a in args if isinstance(a, torch.Tensor)), None)
    if t is None or t.device.type != "cuda":
        return f"needs CUDA tensors (got {'no tensor' if t is None else t.device})"
    cap = torch.cuda.get_device_capability(t.device)
    if cap < min_capability:
        return f"needs compute capability >= {min_capability[0]}.{min_capability[1]} (device has {cap[0]}.{cap[1]})"
    if not _installed(module):
        return f"needs the Python package {module!r}, which is not installed"
    return None
