"""Fixtures of the baseline tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True, scope="package")
def _single_thread() -> Iterator[None]:
    """Tiny models run fastest on one thread, and far faster than oversubscribed threads on a busy machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
