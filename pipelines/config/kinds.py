"""Which command a config file is for: a job's sections (model, task, method, ...) or a sweep's grid (tasks,
models, methods, seeds, job). A file given to the other command gets one sentence naming the right one, before
its keys are listed as unknown."""

from __future__ import annotations

from typing import Any, Literal

JOB_KEYS = ("model", "task", "method", "optim", "train")
"""Sections only a job config has at its top level."""
SWEEP_KEYS = ("tasks", "models", "methods", "seeds", "job")
"""Keys only a sweep config has at its top level."""
RUN = {"job": "python -m pipelines.train --config FILE",
       "sweep": "python pipelines/sweep.py --config FILE (a sweep runs one job per grid point; its `job:` section "
                "holds what every job shares)"}


def other_kind_hint(raw: Any, expected: Literal["job", "sweep"]) -> str | None:
    """A sentence when `raw` (a config's top-level mapping, given where a `expected` config goes) has the keys of the
    other kind and none of its own; None otherwise."""
    if not isinstance(raw, dict):
        return None
    own, other = (JOB_KEYS, SWEEP_KEYS) if expected == "job" else (SWEEP_KEYS, JOB_KEYS)
    found = [key for key in other if key in raw]
    if len(found) < 2 or any(key in raw for key in own):
        return None
    kind = "sweep" if expected == "job" else "job"
    return f"this is a {kind} config, not a {expected} config (it has {', '.join(found)}): run it with {RUN[kind]}"
