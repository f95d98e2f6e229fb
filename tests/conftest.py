"""Shared test fixtures. Tests never touch the network."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from helpers.xdist_groups import assign_xdist_groups  # noqa: E402
from tiny_models import BUILDERS  # noqa: E402

if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    # Each xdist worker gets its share of the CPUs for torch's intra-op pool: with the default (every CPU per
    # worker) two workers on two CPUs oversubscribe, and the tiny models' small ops run several times slower.
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook, which reads the groups
def pytest_collection_modifyitems(config, items) -> None:
    """Group the tests that share a costly fixture for pytest-xdist; skip `gpu`-marked tests, with the reason,
    where torch sees no CUDA device."""
    assign_xdist_groups(items, config)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU: torch.cuda.is_available() is False here")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def one_thread():
    """torch on one thread for the test, its thread count restored afterwards: a result compared bit for bit (or to
    a tight tolerance) with another computation needs the same reduction order, which the thread count changes."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(params=sorted(BUILDERS))
def kind(request) -> str:
    """Each tiny architecture in turn: bert, llama, qwen2, t5."""
    return request.param
