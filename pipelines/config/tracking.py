"""The `tracking:` section, shared by the entry points that talk to MLflow (`pipelines/sweep.py`, `pipelines.serve`)."""

from __future__ import annotations

from pydantic.dataclasses import dataclass

from pipelines.config.schema import STRICT, PositiveFloat


@dataclass(config=STRICT)
class TrackingSection:
    """MLflow settings."""

    enabled: bool = True
    """Track the sweep in MLflow (false: Tune's own results only, no server)."""
    uri: str | None = None
    """Tracking server (default: env MLFLOW_TRACKING_URI, else a local server the sweep starts)."""
    experiment: str | None = None
    """Experiment name (default: capt-<sweep name>)."""
    register: bool = True
    """Register every finished capsule in the Model Registry."""
    retry_s: PositiveFloat = 30.0
    """How long a worker, or the sweep for its own run, retries an unreachable server before keeping the call for
    `sync` / --resume (a trial's run) or going on without it (the sweep's run)."""
    promote: bool = True
    """At the end, give the best version per (model, task) the alias champion."""
    local_dir: str = "outputs/mlflow"
    """Where the local server keeps its SQLite database and artifacts."""
    system_metrics_interval_s: PositiveFloat = 10.0
    """Seconds between system metric samples (CPU, memory, GPU) of a run; short runs want a short interval."""
