"""Reference levels a trained model has to beat, measured on the labels of the split it is scored on.

- Majority class: the score of always predicting the most frequent label of the training split (ties: the
  lowest label id). For multiple-choice tasks (COPA, CSQA) the "label" is the position of the right choice.
- Chance: the expected score of guessing a label uniformly at random for every example, estimated as the mean
  over `CHANCE_DRAWS` seeded draws (accuracy alone would be exactly 100 / classes; macro-F1, F1a and EM
  have no such closed form, so every metric is estimated the same way).

Both go through `compute_metrics`, so they are on the same scale (percent, the task score) as the model's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from capt.tasks.metrics import SCORE, compute_metrics
from capt.tasks.records import Example
from capt.tasks.registry import get

CHANCE_DRAWS = 200
"""Random-guess draws averaged for the chance level."""
_CHANCE_SEED = 0


def majority_label(train: Sequence[Example]) -> int:
    """The most frequent label of `train` (ties: the lowest label id)."""
    if not train:
        raise ValueError("No training examples to take the majority label from.")
    counts = Counter(e.label for e in train)
    return min(counts, key=lambda label: (-counts[label], label))


def _groups(examples: Sequence[Example]) -> list[str] | None:
    return [e.group for e in examples] if any(e.group is not None for e in examples) else None


def majority_score(train: Sequence[Example], examples: Sequence[Example]) -> float:
    """Task score on `examples` of always predicting the majority label of `train`."""
    label = majority_label(train)
    task = examples[0].task
    return compute_metrics(task, [label] * len(examples), [e.label for e in examples], _groups(examples))[SCORE]


def chance_score(examples: Sequence[Example], draws: int = CHANCE_DRAWS) -> float:
    """Expected task score on `examples` of uniform random guessing (mean of `draws` seeded draws)."""
    task = examples[0].task
    labels, groups = [e.label for e in examples], _groups(examples)
    rng = np.random.default_rng(_CHANCE_SEED)
    classes = get(task).num_labels
    scores = [compute_metrics(task, rng.integers(0, classes, len(labels)).tolist(), labels, groups)[SCORE]
              for _ in range(draws)]
    return float(np.mean(scores))


def reference_levels(train: Sequence[Example], examples: Sequence[Example]) -> dict[str, float]:
    """``{"majority_score": ..., "chance_score": ...}`` on `examples` (module docstring)."""
    return {"majority_score": majority_score(train, examples), "chance_score": chance_score(examples)}
