"""Task metrics, in PERCENT (0-100) everywhere, as in the paper's tables.

- accuracy: all tasks except MultiRC.
- CB: accuracy and macro-F1 (unweighted mean of per-class F1 over the classes that occur in the gold
  labels or the predictions, as scikit-learn's ``average="macro"``; an invalid prediction, -1, counts
  as wrong but is not a class).
- MultiRC: F1a (binary F1 of the positive label over all answer rows) and EM (a question counts only
  if every one of its answer rows is right; rows grouped by `Example.group`).
- Task score: the mean of the task's metrics (`TaskSpec.metrics`); the SuperGLUE-style average is the
  unweighted mean of the task scores.

Predictions are label ids; -1 marks an invalid generation (see `text_to_label`) and is always wrong.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

import numpy as np

from capt.tasks.errors import MissingMetricsError, TaskUsageError
from capt.tasks.registry import get

SCORE = "score"
"""Key of the task score in the `compute_metrics` result."""


def _arrays(predictions: Sequence[int], labels: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    preds = np.asarray(predictions, dtype=np.int64).reshape(-1)
    gold = np.asarray(labels, dtype=np.int64).reshape(-1)
    if preds.shape != gold.shape:
        raise TaskUsageError(f"{preds.size} predictions but {gold.size} labels.")
    if gold.size == 0:
        raise TaskUsageError("No examples to score.")
    return preds, gold


def accuracy(predictions: Sequence[int], labels: Sequence[int]) -> float:
    """Percentage of predictions equal to the label."""
    preds, gold = _arrays(predictions, labels)
    return float(100.0 * np.mean(preds == gold))


def f1_for_class(predictions: Sequence[int], labels: Sequence[int], positive: int = 1) -> float:
    """F1 (percent) of one class treated as positive; 0 when it has no true positives."""
    preds, gold = _arrays(predictions, labels)
    tp = int(np.sum((preds == positive) & (gold == positive)))
    fp = int(np.sum((preds == positive) & (gold != positive)))
    fn = int(np.sum((preds != positive) & (gold == positive)))
    return 0.0 if tp == 0 else 100.0 * 2 * tp / (2 * tp + fp + fn)


def macro_f1(predictions: Sequence[int], labels: Sequence[int]) -> float:
    """Unweighted mean of per-class F1 over classes seen in labels or (valid) predictions, percent."""
    preds, gold = _arrays(predictions, labels)
    classes = sorted(set(gold.tolist()) | {p for p in preds.tolist() if p >= 0})
    return float(np.mean([f1_for_class(preds, gold, c) for c in classes]))


def f1a(predictions: Sequence[int], labels: Sequence[int]) -> float:
    """MultiRC F1a: binary F1 of the positive label (1) over all answer rows, percent."""
    return f1_for_class(predictions, labels, positive=1)


def exact_match(predictions: Sequence[int], labels: Sequence[int], groups: Sequence[Hashable]) -> float:
    """MultiRC EM: percentage of groups (questions) whose rows are all predicted right."""
    preds, gold = _arrays(predictions, labels)
    if len(groups) != gold.size:
        raise TaskUsageError(f"{len(groups)} groups but {gold.size} labels.")
    right: dict[Hashable, bool] = {}
    for group, ok in zip(groups, (preds == gold).tolist(), strict=True):
        right[group] = right.get(group, True) and ok
    return 100.0 * sum(right.values()) / len(right)


def compute_metrics(task: str, predictions: Sequence[int], labels: Sequence[int],
                    groups: Sequence[Hashable] | None = None) -> dict[str, float]:
    """The task's metrics plus ``"score"`` (their mean), all in percent. MultiRC needs `groups`."""
    spec = get(task)
    values: dict[str, float] = {}
    for name in spec.metrics:
        if name == "accuracy":
            values[name] = accuracy(predictions, labels)
        elif name == "macro_f1":
            values[name] = macro_f1(predictions, labels)
        elif name == "f1a":
            values[name] = f1a(predictions, labels)
        elif name == "em":
            if groups is None:
                raise TaskUsageError(f"Task {task!r} needs the question groups for its EM metric.")
            values[name] = exact_match(predictions, labels, groups)
        else:  # pragma: no cover - the registry only names the metrics above
            raise TaskUsageError(f"Unknown metric {name!r} for task {task!r}.")
    values[SCORE] = task_score(values, task)
    return values


def task_score(metrics: Mapping[str, float], task: str) -> float:
    """Mean of the task's own metrics (named in `TaskSpec.metrics`) found in `metrics`."""
    names = get(task).metrics
    missing = [n for n in names if n not in metrics]
    if missing:
        raise MissingMetricsError(f"Metrics {missing} of task {task!r} are missing; got {sorted(metrics)}.")
    return float(np.mean([metrics[n] for n in names]))


def average_score(task_scores: Mapping[str, float]) -> float:
    """SuperGLUE-style average: unweighted mean of per-task scores (tasks validated by name)."""
    if not task_scores:
        raise TaskUsageError("No task scores to average.")
    for task in task_scores:
        get(task)
    return float(np.mean(list(task_scores.values())))
