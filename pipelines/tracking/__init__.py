"""MLflow tracking: runs, metrics, artifacts, the capsule pyfunc and the Model Registry.

This package is the ONLY part of the project that imports mlflow; `promote`, `report` and the sweep go through the
functions and classes re-exported here. Conventions: one run per trial named ``<task>/<model-slug>/<method>/s<seed>``;
params: the resolved config fields (no empty values, paths as tags); tags from the caller (task, model, method, seed,
sweep, source and git commit); metrics grouped as MLflow charts them (``train/``, ``validation/`` per validation,
``test/`` and ``perf/`` once, at step 0), the per-run summary as tags, system metrics on; the run's dataset as an MLflow
dataset input. Each CaPT trial logs the model ``capsule-<model-slug>-<task>`` (linked to its metrics) and registers it
as a new version of ``capt-<model-slug>-<task>`` (a pyfunc predicting label names for raw task rows), tagged
``validation_status=pending`` and described with its scores and a loading snippet.

Resilience (README, "MLflow down"): every call retries with backoff (30 s budget by default); when the server stays
down the operation is spooled in the trial's folder with the tracking URI it was meant for (`spool`), the tracker
replays it once the server answers again, and ``python -m pipelines.tracking sync`` replays whatever is left, touching
only what it was given (`scope`, `sync`).

Modules: `client` (MLflow clients, transient errors, HTTP retry settings, tag of a trial's key), `spool` (the on-disk
operation log, retries, run records), `scope` (what a sync may touch), `run_content` (metric names, params, run tags,
summary tags), `operations` (apply and replay of spooled operations, among them what a finished trial logs), `tracker`
(`TrialTracker` and its background metric uploader), `sync` (`sync_pending` and its summary), `__main__` (the
``sync`` command), `experiment` (the sweep's description, source tags, runs-view URLs, `experiment_runs`),
`sweep_run` (the sweep's parent run, its close kept for sync, the runs a stopped sweep left), `pyfunc`
(`CapsulePyfunc`, its registration and a version's description; `capsule_model` is its models-from-code file),
`bundle` (the project code a version carries and its digest), `registry` (`Registry`, `VersionInfo`, a version's
files downloaded and verified, `load_capsule_model`), `promotion` (the champion policy of `pipelines.promote`).
`jobs` (a job's or a pack member's run around its training callbacks: `tracked_job`, `tracked_pack`) and
`job_cli` (`python -m pipelines.train`'s tracking flags and closing lines) import no mlflow until a run is tracked.
"""

from __future__ import annotations

import importlib
from typing import Any

# The re-exports are imported on first use (PEP 562): `pipelines.tracking.jobs`, which `python -m pipelines.train` and
# every trial import, must not import mlflow for a job that is not tracked.
_EXPORTS = {
    "main": "__main__", "TRIAL_KEY_TAG": "client", "TrackingError": "client", "is_transient": "client",
    "CapsulePyfunc": "pyfunc", "Registry": "registry", "VersionInfo": "registry", "experiment_runs": "experiment",
    "RetryPolicy": "spool", "TrackingUnavailable": "spool", "FolderSync": "sync", "SyncSummary": "sync",
    "sync_pending": "sync", "TrialTracker": "tracker", "load_capsule_model": "registry",
    "download_verified_model": "registry",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
