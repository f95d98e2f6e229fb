"""Shared test fixtures. Tests never touch the network."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import pytest  # noqa: E402
from tiny_models import BUILDERS  # noqa: E402


@pytest.fixture(params=sorted(BUILDERS))
def kind(request) -> str:
    """Each tiny architecture in turn: bert, llama, qwen2, t5."""
    return request.param
