"""The runs of a sweep's experiment, told apart: the trials' runs and the sweep's own parent run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipelines.tracking.run_content import RUN_KIND_TAG


def trial_runs(client: Any, experiment_ids: list[str], *args: Any, **kwargs: Any) -> list[Any]:
    """`client.search_runs(...)` without the sweep's parent run."""
    return [run for run in client.search_runs(experiment_ids, *args, **kwargs) if not is_sweep_run(run)]


def sweep_runs(client: Any, experiment_ids: list[str]) -> list[Any]:
    """The sweeps' parent runs of the experiments."""
    return [run for run in client.search_runs(experiment_ids) if is_sweep_run(run)]


def is_sweep_run(run: Any) -> bool:
    """Whether `run` (an MLflow Run, or a REST record with its tags as a list) is a sweep's parent run."""
    if isinstance(run, dict):
        return any(t["key"] == RUN_KIND_TAG and t["value"] == "sweep" for t in run["data"].get("tags", []))
    return run.data.tags.get(RUN_KIND_TAG) == "sweep"


def stopped_store_client(root: Path) -> Any:
    """An MLflow client reading the SQLite database of a stopped local server's store (`LocalMlflowServer(root)`)
    directly: what a restarted server would answer, without the seconds of CPU a server start costs."""
    import mlflow

    database = root / "mlflow.db"
    assert database.is_file(), f"no MLflow store at {root}"
    return mlflow.MlflowClient(f"sqlite:///{database}")
