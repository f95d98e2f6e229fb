"""Train tiny capsule jobs and register them on a real MLflow server, as a sweep's rank-0 worker does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from helpers.jobs import tiny_job
from pipelines.config.schema import flatten
from pipelines.tracking import TrialTracker
from pipelines.training.loop import run


def train_capsule(output_dir: Path, task: str, seed: int, model: str = "tiny-t5", **train: Any) -> dict[str, Any]:
    """A finished CaPT job of `task` on generated data (seconds); its result dict."""
    config = tiny_job(output_dir, model, "capt", f"seed={seed}", task={"name": task},
                      train={"max_epochs": 3, "eval_every_steps": 3, **train})
    return run(config)


def track(uri: str, result: dict[str, Any], experiment: str) -> str:
    """Log a finished job and register its capsule (idempotent: same state dir, same run); the run id."""
    key = f"{result['task']}/{result['model_slug']}/{result['method']}/s{result['seed']}"
    tags = {"task": result["task"], "model": result["model_slug"], "method": result["method"],
            "seed": result["seed"], "sweep": "test"}
    tracker = TrialTracker(uri, experiment, key, tags, Path(result["artifact_dir"]).parent, system_metrics=False)
    tracker.start()
    tracker.log_params(flatten(result["config"]))
    for record in result["history"]:
        tracker.log_metrics(record, step=record["step"])
    tracker.finish(result, result["artifact_dir"], register=result["method"] == "capt")
    return tracker.run_id
