"""The problem objects (torch_fp4/problems.py): frozen, keyword-only, built from validated
arguments."""
import dataclasses

import pytest
import torch

from torch_fp4 import formats as F
from torch_fp4 import testing as T
from torch_fp4.problems import NO_GPU, MmProblem, alignment


def test_problems_are_frozen_and_hashable():
    wq, ws, _ = T.quantized_weight(128, 64)
    p = MmProblem.of(torch.randn(2, 64, dtype=torch.bfloat16), wq.T, None, ws.T, None, torch.float32, F.NVFP4,
                     F.SfLayout.LAYOUT_128x4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.m = 3
    assert hash(p) == hash(dataclasses.replace(p)) and p == dataclasses.replace(p)
    assert p.on((9, 0)).capability == (9, 0) and p.capability == NO_GPU
    with pytest.raises(TypeError):   # keyword-only: no positional tuple again
        MmProblem(torch.device("cpu"), NO_GPU)


def test_alignment_of_a_view():
    buf = torch.zeros(64, dtype=torch.uint8)
    assert alignment(buf) == 16
    assert [alignment(buf[i:]) for i in (1, 2, 4, 8, 12)] == [1, 2, 4, 8, 4]
