"""Field rules of a sweep config, checked by pydantic with every other problem: no empty or repeated grid
axis, no two models sharing a slug, and sweep names and row labels that stay inside the storage root; and
the rule of `data_source: real`, checked on the expanded trials."""

from __future__ import annotations

import os
import re
from collections import Counter
from typing import Annotated

from pydantic import AfterValidator

from pipelines.config.schema import model_slug


def _safe(pattern: str, allowed: str):
    """A validator for names that become folder names under the storage root: no `/`, no `..`, not empty."""
    def check(value: str) -> str:
        if not re.fullmatch(pattern, value) or ".." in value:
            raise ValueError(f"{value!r} is not allowed: it names a folder under the storage root, so use {allowed}, "
                             "starting with a letter or digit, without '..'")
        return value
    return check


def _non_empty(values: list) -> list:
    if not values:
        raise ValueError("empty: give at least one value (an empty axis leaves the sweep without trials)")
    return values


def _distinct(values: list) -> list:
    repeated = sorted((str(v) for v, n in Counter(values).items() if n > 1))
    if repeated:
        raise ValueError(f"{', '.join(repeated)} given more than once: each grid point would run (and write its "
                         "folder) twice; give each value once")
    return values


def _distinct_slugs(models: list[str]) -> list[str]:
    by_slug: dict[str, list[str]] = {}
    for name in models:
        by_slug.setdefault(model_slug(name), []).append(name)
    clashes = [f"{' and '.join(names)} -> {slug!r}" for slug, names in by_slug.items() if len(names) > 1]
    if clashes:
        raise ValueError(f"models {'; '.join(clashes)}: they would share output folders, MLflow run names and "
                         "registered model names; keep one of them, or copy one to a folder of another name")
    return models


def _distinct_labels(entries: list) -> list:
    labels = [entry.key for entry in entries]
    repeated = sorted(label for label, n in Counter(labels).items() if n > 1)
    if repeated:
        raise ValueError(f"rows labelled {', '.join(repeated)} repeat (a row's label defaults to its method name): "
                         "give each row a distinct label")
    return entries


NON_EMPTY = AfterValidator(_non_empty)
DISTINCT = AfterValidator(_distinct)
DISTINCT_SLUGS = AfterValidator(_distinct_slugs)
DISTINCT_LABELS = AfterValidator(_distinct_labels)
SweepName = Annotated[str, AfterValidator(_safe(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}",
                                                 "1-100 letters, digits, '.', '_' or '-'"))]
"""A sweep name: it becomes the folder <storage_path>/<name>."""
RowLabel = Annotated[str, AfterValidator(_safe(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,99}",
                                                "1-100 letters, digits, '.', '_', '+' or '-'"))]
"""A method row label: it becomes part of every trial folder name."""


def real_data_problems(data_source: str, trial_sources: list[tuple[str, str | None]]) -> list[str]:
    """With `data_source: real`: no trial on generated data, and a place to read real data from.

    `trial_sources`: (trial name, its job's task.source) for every trial.
    """
    if data_source != "real":
        return []
    problems = []
    generated = [name for name, source in trial_sources if source == "generated"]
    if generated:
        problems.append(f"data_source='real' but {len(generated)} trial(s) ({', '.join(generated[:3])}) set "
                        "task.source='generated' (in job, model_overrides or task_overrides): the paper's protocol "
                        "runs on the real tasks only; remove that override, or set data_source=generated for a "
                        "trial run")
    hub_off = "1" in (os.environ.get("HF_HUB_OFFLINE"), os.environ.get("HF_DATASETS_OFFLINE"))
    if not os.environ.get("CAPT_DATA_DIR") and hub_off:
        problems.append("data_source='real' needs the real task data: CAPT_DATA_DIR is not set and the hub is off "
                        "(HF_HUB_OFFLINE=1 or HF_DATASETS_OFFLINE=1). Set CAPT_DATA_DIR to a folder holding "
                        "<task>/{train,val}.jsonl (the official release layout), or allow the hub; generated data "
                        "is not the paper's protocol (data_source=generated runs on it anyway, for a trial run)")
    return problems


def local_data_problems(trial_tasks: list[tuple[str, dict]]) -> list[str]:
    """Every local data file the trials will read, found before anything starts: a missing data folder, task folder
    or split file is one line naming the trials it stops (a trial would otherwise fail on it, and be retried, only
    after Ray and MLflow started).

    `trial_tasks`: (trial name, its job's `task` section) for every trial.
    """
    from capt.tasks.errors import TaskDataError
    from capt.tasks.loading import DATA_DIR_ENV, find_split_file

    by_problem: dict[str, dict[str, None]] = {}  # a problem's text -> the trials it stops, in order
    for name, task in trial_tasks:
        if task.get("source") != "local":
            continue
        data_dir = task.get("data_dir") or os.environ.get(DATA_DIR_ENV)
        for split in ("train", "val"):
            try:
                find_split_file(data_dir, task["name"], split)
            except TaskDataError as err:
                by_problem.setdefault(str(err), {})[name] = None
    return [f"{len(names)} trial(s) ({', '.join(list(names)[:3])}{' and more' if len(names) > 3 else ''}) cannot "
            f"read their data: {problem}" for problem, names in by_problem.items()]
