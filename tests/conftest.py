import os

import pytest
import torch
from hypothesis import HealthCheck, settings

settings.register_profile("ci", deadline=None, max_examples=40, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", deadline=None, max_examples=40,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _fresh_dispatch_decisions():
    """Each test decides dispatch afresh (tests patch requirement tables and device facts)."""
    from torch_fp4.ops import _registry

    _registry.clear_decisions()
    yield
    _registry.clear_decisions()


@pytest.fixture
def poisoned_fresh_tactics(tmp_path, monkeypatch):
    """Outputs poisoned at allocation (an element a kernel forgets to write shows as a mismatch)
    and an empty tactic cache in the test's temporary directory."""
    from torch_fp4 import tactics
    from torch_fp4.kernels import _common

    monkeypatch.setenv("TORCH_FP4_CACHE_DIR", str(tmp_path))
    tactics.forget()
    _common.POISON_OUTPUTS = True
    yield
    _common.POISON_OUTPUTS = False
    tactics.forget()
