"""`select:` in a sweep: candidate values of job keys, a trial per value and seed, and the choice on validation.

`select: {optim.lr: [0.01, 0.1, 0.3]}` in a sweep (every method row) or in one method row (that row only;
its keys win over the sweep's) expands each (task, model, method) into one trial per combination of
values and per seed. The reports (the sweep's results table, `python -m pipelines.report`) then keep, for
each (task, model, method), the combination with the best mean validation score over seeds
(`best_validation_score`, the validation score of each trial's best checkpoint) and show the test scores of
that combination only: the test split never chooses. Trials carry their combination as the MLflow tag
`select` (`select_label`), which is how the report finds it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping
from typing import Any

SELECT_TAG = "select"
"""MLflow tag of a trial's combination of `select:` values (empty when the sweep selects nothing)."""
GRID_KEYS = ("model.name", "task.name", "method.name", "seed", "output_dir")
"""Job keys that the sweep's grid itself sets (or derives): they cannot be selected."""


def job_key(key: str) -> str:
    """A select key as a dotted job key: `job.optim.lr` and `optim.lr` both name `optim.lr`."""
    return key.removeprefix("job.")


def select_space(sweep_select: Mapping[str, list[Any]], row_select: Mapping[str, list[Any]]) -> dict[str, list[Any]]:
    """The candidate values of one method row: the sweep's, with the row's own keys winning."""
    return {**{job_key(k): v for k, v in sweep_select.items()}, **{job_key(k): v for k, v in row_select.items()}}


def combinations(space: Mapping[str, list[Any]]) -> list[dict[str, Any]]:
    """Every combination of the candidate values (keys sorted); `[{}]` when nothing is selected."""
    keys = sorted(space)
    return [dict(zip(keys, values, strict=True)) for values in itertools.product(*(space[k] for k in keys))]


def select_label(values: Mapping[str, Any]) -> str:
    """`optim.lr=0.1,train.max_steps=60` (keys sorted); empty for no values."""
    return ",".join(f"{key}={value}" for key, value in sorted(values.items()))


def select_problems(where: str, space: Mapping[str, Any], search: Mapping[str, Any]) -> list[str]:
    """Keys the grid sets, keys also searched by Tune, and candidate lists that are empty or repeat a value."""
    problems = []
    for key, values in space.items():
        name = f"{where}.{key}"
        if job_key(key) in GRID_KEYS:
            problems.append(f"{name}: the sweep's grid sets this key (tasks, models, methods, seeds); select other "
                            "job keys, e.g. optim.lr")
        elif job_key(key) in search:
            problems.append(f"{name}: also in search:, which Tune samples; give the key in one of them")
        elif not isinstance(values, list) or not values:
            problems.append(f"{name}={values!r}: give a non-empty list of candidate values")
        elif len({repr(v) for v in values}) != len(values):
            problems.append(f"{name}={values!r}: a value is given twice; give each candidate once")
    return problems


def chosen_labels(rows: Iterable[Mapping[str, Any]], keys: tuple[str, ...] = ("model", "task", "method"),
                  label: str = SELECT_TAG, score: str = "validation") -> dict[tuple, str]:
    """For each group of `rows` (by `keys`), the `label` whose finite `score`s have the best mean.

    Rows without a finite score (failed trials) do not count; a group with none has no entry. Ties go to
    the label that sorts first.
    """
    scores: dict[tuple, dict[str, list[float]]] = {}
    for row in rows:
        value = row.get(score)
        if isinstance(value, int | float) and math.isfinite(value):
            scores.setdefault(tuple(row[k] for k in keys), {}).setdefault(row.get(label) or "", []).append(value)
    return {group: max(sorted(by_label), key=lambda name, b=by_label: sum(b[name]) / len(b[name]))
            for group, by_label in scores.items()}
