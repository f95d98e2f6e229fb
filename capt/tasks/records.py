"""The normalised record every source (hub, local files, generated) yields, and the three splits."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

GENERATED_PREFIX = "gen:"
"""uid prefix of every record the project generated itself (see `capt.tasks.generated`)."""
GENERATED_KEY = "generated"
"""Raw-row key (value ``true``) that marks a generated row; the normaliser turns it into the uid prefix."""


@dataclass(frozen=True)
class Example:
    """One labelled example of one task, independent of where it was loaded from.

    uids look like ``rte/train/17`` (official split name ``train`` or ``val``, then the official idx; for
    MultiRC ``<paragraph>-<question>-<answer>``, for CSQA the question id); generated records start with
    ``gen:``. MultiRC is flattened to one example per (paragraph, question, answer) and `group` is the
    question id (``multirc/train/<paragraph>-<question>``), which the EM metric and the splits use.
    """

    task: str
    """Registry name of the task."""
    uid: str
    """Unique id within the task (see the class docstring)."""
    fields: dict[str, str] = field(hash=False)
    """The task's text fields (`TaskSpec.fields`); treat as read-only."""
    label: int
    """Label id (index into `TaskSpec.label_names`)."""
    group: str | None = None
    """Question group (MultiRC only), else None."""

    @property
    def is_generated(self) -> bool:
        """True for records the project generated itself (not real benchmark data)."""
        return self.uid.startswith(GENERATED_PREFIX)


@dataclass(frozen=True)
class Splits:
    """The paper's three splits: 90 % / 10 % of the official train split, and the official validation."""

    train: tuple[Example, ...]
    """Training examples (90 % of the official train split, stratified by label)."""
    validation: tuple[Example, ...]
    """Model-selection examples (the other 10 %)."""
    test: tuple[Example, ...]
    """Reported examples: the official validation split."""

    def sizes(self) -> dict[str, int]:
        """Number of examples per split."""
        return {"train": len(self.train), "validation": len(self.validation), "test": len(self.test)}

    def label_counts(self) -> dict[str, dict[int, int]]:
        """Label histogram per split (the dataset card MLflow shows with each run)."""
        return {name: dict(sorted(Counter(e.label for e in rows).items()))
                for name, rows in (("train", self.train), ("validation", self.validation),
                                   ("test", self.test))}
