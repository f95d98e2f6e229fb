"""Shared fixtures of the `capt.tasks` tests: real data (through CAPT_DATA_DIR only) and tokenisers."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from capt.tasks import DataConfig, load_split  # noqa: E402
from capt.tasks.records import Example  # noqa: E402

NO_DATA = "CAPT_DATA_DIR is not set: real SuperGLUE/CSQA files are not available (see shared/data/SOURCES.md)"


def real_data_dir() -> Path | None:
    """The real data directory from the environment, or None."""
    value = os.environ.get("CAPT_DATA_DIR")
    return Path(value) if value else None


@functools.cache
def real_official(task: str, split: str) -> tuple[Example, ...]:
    """One official split of the real data, loaded once per test session."""
    return tuple(load_split(task, split, DataConfig(source="local", data_dir=str(real_data_dir()))))


@pytest.fixture
def data_dir() -> Path:
    """The real data directory; skips the test when CAPT_DATA_DIR is unset."""
    path = real_data_dir()
    if path is None:
        pytest.skip(NO_DATA)
    return path


@pytest.fixture
def official(data_dir: Path):
    """`official(task, split)`: a cached official split of the real data (skips without CAPT_DATA_DIR)."""
    return real_official


@pytest.fixture(scope="session")
def t5_tokenizer():
    from capt.tasks.tokenizers import test_tokenizer

    return test_tokenizer("t5")


@pytest.fixture(scope="session")
def decoder_tokenizer():
    from capt.tasks.tokenizers import test_tokenizer

    return test_tokenizer("decoder")


@pytest.fixture(scope="session")
def encoder_tokenizer():
    from capt.tasks.tokenizers import test_tokenizer

    return test_tokenizer("encoder")


@pytest.fixture(scope="session")
def tokenizers_by_family(t5_tokenizer, decoder_tokenizer, encoder_tokenizer):
    return {"t5": t5_tokenizer, "decoder": decoder_tokenizer, "encoder": encoder_tokenizer}
