"""Fake for mm_fp4."""
from __future__ import annotations

import torch


def mm_fp4(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype)
