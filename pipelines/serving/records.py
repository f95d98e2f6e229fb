"""What a replica knows of each capsule: `ServedCapsule` (what to load, from a registry source or a caller),
`ServedRecord` (what the engine keeps while serving it) and `Answer` (what one request gets back)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from capt.tasks import Collator


@dataclass(frozen=True, slots=True)
class ServedCapsule:
    """A capsule to serve: where its files are and which registry version they are. The engine reads it while the
    capsule loads and keeps its `ServedRecord` instead; a caller may still hold many (a list given to a
    replica), so it is kept small: slots, and the folder as a string."""

    name: str
    """Its name in the bank and in requests (the task name; the benchmark serves copies under other names)."""
    task: str
    """The task whose rows it reads."""
    model_name: str
    """Registered model it came from (``capt-<model-slug>-<task>``), or a label for local capsules."""
    version: int
    """Registry version."""
    capsule_dir: str
    """Capsule artifact folder (safetensors + JSON). A `Path` given is kept as its string: a Path holds each of its
    parts as a string of its own, about 500 bytes more per capsule of a 1,000-capsule bank."""
    result: Mapping[str, Any] = field(repr=False)
    """The job's result.json (base model, method options, evaluation mode)."""
    digest: str | None = None
    """SHA-256 of the artifact's digest manifest once the source verified it (GET /tasks shows it); None until the
    registry source records one."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "capsule_dir", os.fspath(self.capsule_dir))


@dataclass
class Answer:
    """What one request gets back."""

    labels: list[str]
    scores: list[list[float]] | None
    """Per row, the log-likelihood of each label (rank mode; encoder classifiers: the head's log-softmax); None
    when generated."""
    label_names: list[str]
    model_name: str
    version: int


@dataclass(frozen=True, slots=True)
class ServedRecord:
    """What the engine knows of a capsule it serves: its registry identity and how its rows are read. Not the
    `ServedCapsule`'s job result, which is read only while the capsule loads: parsed, a result.json is about 16 KB,
    more than a MiniLM capsule's values."""

    task: str
    """The task whose rows it reads."""
    model_name: str
    """Registered model it came from."""
    version: int
    """Registry version."""
    digest: str | None
    """SHA-256 of the artifact's digest manifest (None: not verified by a registry source)."""
    collator: Collator
    """Tokenizes its rows (shared by the capsules of one max_length, slot count and input format)."""
    mode: str
    """How it answers: "rank" or "generate" (the job's eval_mode)."""
    max_new_tokens: int
    """Most tokens it generates."""
