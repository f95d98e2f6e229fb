"""SuperGLUE (BoolQ, CB, COPA, MultiRC, RTE, WiC) and CommonsenseQA for T5, decoder-only and encoder models.

Typical use::

    from capt import tasks
    splits = tasks.load_splits("rte", tasks.DataConfig(source="local", seed=0))
    collate = tasks.Collator(tokenizer, "t5", max_length=256, capsule_slots=1)
    batch = collate(splits.train[:32])
    tasks.compute_metrics("rte", predictions, [e.label for e in splits.test])

Importing this package is light: torch (`Collator`), transformers (`tokenizers`) and `datasets` (hub
source) are imported only when used.
"""

from __future__ import annotations

from typing import Any

from capt.tasks.config import DATA_DIR_ENV, SOURCES, DataConfig
from capt.tasks.decoding import INVALID, normalize_text, rank_classify, text_to_label, texts_to_labels
from capt.tasks.errors import TaskDataError, UnknownTaskError
from capt.tasks.formats import DecoderInput, EncoderInput, T5Input, render
from capt.tasks.generated import example_rows, generate_rows, write_generated
from capt.tasks.loading import load_split, load_splits
from capt.tasks.metrics import (
    accuracy,
    average_score,
    compute_metrics,
    exact_match,
    f1a,
    macro_f1,
    task_score,
)
from capt.tasks.records import Example, Splits
from capt.tasks.registry import FAMILIES, SUPERGLUE_TASKS, TASK_NAMES, TaskSpec, get, names
from capt.tasks.splits import split_train_validation, subsample

_LAZY = {
    "Collator": ("capt.tasks.collate", "Collator"),
    "IGNORE_INDEX": ("capt.tasks.collate", "IGNORE_INDEX"),
    "test_tokenizer": ("capt.tasks.tokenizers", "test_tokenizer"),
    "minilm_tokenizer": ("capt.tasks.tokenizers", "minilm_tokenizer"),
}

__all__ = [
    "DATA_DIR_ENV", "FAMILIES", "INVALID", "SOURCES", "SUPERGLUE_TASKS", "TASK_NAMES", "Collator", "DataConfig",
    "DecoderInput", "EncoderInput", "Example", "IGNORE_INDEX", "Splits", "T5Input", "TaskDataError", "TaskSpec",
    "UnknownTaskError", "accuracy", "average_score", "compute_metrics", "exact_match", "example_rows", "f1a",
    "generate_rows", "get", "load_split", "load_splits", "macro_f1", "minilm_tokenizer", "names",
    "normalize_text", "rank_classify", "render", "split_train_validation", "subsample", "task_score",
    "test_tokenizer", "text_to_label", "texts_to_labels", "write_generated",
]


def __getattr__(name: str) -> Any:
    """Import torch/transformers-backed names on first use."""
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'capt.tasks' has no attribute {name!r}")
