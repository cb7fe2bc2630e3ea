import os

import pytest
import torch
from hypothesis import HealthCheck, settings

settings.register_profile("ci", deadline=None, max_examples=40, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", deadline=None, max_examples=40,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


def pytest_addoption(parser):
    parser.addoption("--full", action="store_true",
                     help="also run the full GPU sweep (tests and cases marked `full`)")


def _prebuild_wanted(config) -> bool:
    """TORCH_FP4_TEST_PREBUILD=1 / 0 asks for it or not; by default a run with pytest-xdist
    workers (`-n N`) prebuilds, a single process builds each library when a test first needs it."""
    flag = os.environ.get("TORCH_FP4_TEST_PREBUILD")
    if flag is not None:
        return flag == "1"
    return bool(getattr(config.option, "numprocesses", None))


def pytest_sessionstart(session):
    """On a CUDA machine with nvcc (see _prebuild_wanted): every cuda kernel library is built once,
    all their units in parallel, before any test runs (and before pytest-xdist starts its
    workers), instead of by whichever worker first needs each library while the others wait."""
    if hasattr(session.config, "workerinput") or not _prebuild_wanted(session.config):
        return
    if not torch.cuda.is_available():
        return
    from torch_fp4.kernels.cuda import build

    if build.nvcc() is None:
        return
    build.build(torch.cuda.get_device_capability(0), list(build.LIBRARIES))


def _in_quick_tier(item) -> bool:
    """A GPU test module may name, in QUICK = {test name: {case ids}}, the cases of a
    parametrized test that the quick tier runs; its other cases belong to the full sweep."""
    quick = getattr(item.module, "QUICK", {})
    name = getattr(item, "originalname", item.name)
    if name not in quick or not hasattr(item, "callspec"):
        return True
    return item.callspec.id in quick[name]


def pytest_collection_modifyitems(config, items):
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA device")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
        return
    if config.getoption("--full"):
        return
    skip = pytest.mark.skip(reason="the full GPU sweep: run with --full")
    for item in items:
        if "full" in item.keywords or ("gpu" in item.keywords and not _in_quick_tier(item)):
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
    and an empty tactic cache in the test's temporary directory. Only the tactic cache moves:
    the built cuda libraries stay in the shared cache ($TORCH_FP4_CACHE_DIR/cuda), so no test
    builds them again."""
    from torch_fp4 import tactics
    from torch_fp4.kernels import _common

    monkeypatch.setattr(tactics, "cache_path", lambda: tmp_path / "tactics.json")
    tactics.forget()
    _common.POISON_OUTPUTS = True
    yield
    _common.POISON_OUTPUTS = False
    tactics.forget()


_DURATIONS = os.environ.get("TORCH_FP4_DURATIONS")


def pytest_runtest_logreport(report):
    """With TORCH_FP4_DURATIONS=FILE, each test phase's seconds are appended to FILE as it ends
    (`seconds phase outcome nodeid`), so a GPU run cut off by its time limit still shows where
    the time went (pytest's --durations prints only at the end)."""
    if _DURATIONS and report.when in ("setup", "call") and (report.when == "call" or report.duration > 0.5):
        with open(_DURATIONS, "a") as f:
            f.write(f"{report.duration:.2f} {report.when} {report.outcome} {report.nodeid}\n")
