"""The cuda launchers' allocator (kernels/_common.cuda_empty) on the CPU: the caching allocator's
direct entry point is replaced by its CPU twin, and every shape gets torch.empty's strides (which
torch.compile's generated code checks on custom-op outputs, empty ones included)."""
import pytest
import torch
from torch._C._dynamo.guards import _empty_strided_cpu

from torch_fp4.kernels import _common


@pytest.mark.parametrize("shape", [(3, 5), (0, 5), (3, 0), (0, 0), (1, 1), (7,), (0,)], ids=str)
def test_direct_entry_point_gives_torch_empty_strides(monkeypatch, shape):
    monkeypatch.setattr(_common, "_empty_strided_cuda", _empty_strided_cpu)
    monkeypatch.setattr(_common, "_current_device", lambda: -1)   # a CPU tensor's get_device()
    out = _common.cuda_empty(shape, torch.bfloat16, torch.empty(1))
    ref = torch.empty(shape, dtype=torch.bfloat16)
    assert (out.shape, out.stride(), out.dtype) == (ref.shape, ref.stride(), ref.dtype)


def test_another_device_falls_back_to_torch_empty(monkeypatch):
    calls = []
    monkeypatch.setattr(_common, "_empty_strided_cuda", lambda *a: calls.append(a))
    monkeypatch.setattr(_common, "_current_device", lambda: 5)
    out = _common.cuda_empty((2, 3), torch.float32, torch.empty(1))
    assert not calls and out.shape == (2, 3) and out.dtype == torch.float32 and out.device.type == "cpu"
