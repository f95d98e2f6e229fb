"""`DataConfig`: where task data comes from and how the paper's splits are drawn."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from capt.errors import Problems

SOURCES: tuple[str, ...] = ("hub", "local", "generated")
"""Valid values of `DataConfig.source`."""

DATA_DIR_ENV = "CAPT_DATA_DIR"
"""Environment variable giving the default local data directory."""


def _env_data_dir() -> str | None:
    return os.environ.get(DATA_DIR_ENV) or None


@dataclass
class DataConfig:
    """Typed data settings; `__post_init__` rejects bad values, naming the key and what is allowed (`ConfigError`)."""

    source: str = "local"
    """Where rows come from: "hub" (`datasets`, needs network or a warm cache), "local" or "generated"."""
    data_dir: str | None = field(default_factory=_env_data_dir)
    """Local directory with ``<task>/{train,val}.{jsonl,parquet}`` (default: env CAPT_DATA_DIR)."""
    seed: int = 0
    """Seed of the 90/10 train/validation split and of any subsampling."""
    validation_fraction: float = 0.1
    """Fraction of the official train split held out for validation (stratified by label)."""
    max_train_examples: int | None = None
    """Optional cap on training examples (seeded subsample after the split; MultiRC: whole questions)."""
    max_eval_examples: int | None = None
    """Optional cap on validation and test examples each (seeded subsample; MultiRC: whole questions)."""
    generated_size: int = 200
    """Rows of the generated official train split per task (MultiRC: about this many answer rows)."""
    generated_eval_size: int = 50
    """Rows of the generated official validation split per task."""
    generated_seed: int = 0
    """Seed of the generated data itself (kept apart from `seed`, so every split seed sees the same data)."""
    hub_cache_dir: str | None = None
    """`cache_dir` passed to `datasets.load_dataset` (None: the datasets default)."""

    def __post_init__(self) -> None:
        problems = Problems("DataConfig")
        problems.require(self.source in SOURCES, "source", self.source, ", ".join(SOURCES))
        problems.require(0.0 < float(self.validation_fraction) < 1.0, "validation_fraction",
                         self.validation_fraction, "a number in (0, 1)")
        for key in ("max_train_examples", "max_eval_examples"):
            value = getattr(self, key)
            problems.require(value is None or (isinstance(value, int) and value >= 1), key, value,
                             "a positive int or None")
        for key in ("generated_size", "generated_eval_size"):
            value = getattr(self, key)
            problems.require(isinstance(value, int) and value >= 1, key, value, "a positive int")
        problems.raise_if_any()
