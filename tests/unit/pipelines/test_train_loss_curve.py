"""`train.log_every_steps` gives the training loss its curve: a point every that many steps (the mean loss over
them, with the learning rate), in result.json and, for a tracked trial, in the MLflow run's ``train/loss``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from helpers.jobs import tiny_job

from pipelines.training.loop import run

STEPS = 23
"""Not a multiple of the window: the last point covers the 3 steps after the last full window."""


def _curve(folder: Path, every: int) -> tuple[list[dict], dict]:
    points: list[dict] = []
    config = tiny_job(folder, train={"max_steps": STEPS, "eval_every_steps": 10, "log_every_steps": every})
    return points, run(config, log=points.append)


def test_a_point_every_log_every_steps_with_the_mean_loss_over_those_steps(tmp_path: Path) -> None:
    each_step, _ = _curve(tmp_path / "every1", 1)
    points, result = _curve(tmp_path / "every5", 5)

    assert [p["step"] for p in points] == [5, 10, 15, 20, 23]
    assert result["curve"] == points
    assert json.loads((tmp_path / "every5" / "result.json").read_text())["curve"] == points
    assert [p["step"] for p in each_step] == list(range(1, STEPS + 1))
    losses = [p["train_loss"] for p in each_step]  # log_every_steps changes no training: the same losses
    for point, start in zip(points, (0, 5, 10, 15, 20), strict=True):
        window = losses[start:point["step"]]
        assert math.isclose(point["train_loss"], sum(window) / len(window), rel_tol=1e-9)
    assert points[0]["train_lr"] > points[-1]["train_lr"] >= 0, "the learning rate follows its schedule"


def test_the_tracked_run_draws_train_loss_from_the_curve_not_from_the_validations(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow import MlflowClient

    from pipelines.sweeps.trial import tracked_job

    monkeypatch.chdir(tmp_path)  # the SQLite store's artifacts go under ./mlruns
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    config = tiny_job(tmp_path / "job", train={"max_steps": STEPS, "eval_every_steps": 10, "log_every_steps": 5})
    tracking = {"uri": uri, "experiment": "curve", "run_name": "curve", "retry_s": 5.0, "register": False,
                "system_metrics_interval_s": 60.0, "tags": {}}
    reports: list[dict] = []
    tracked_job({"job": config.to_dict(), "tracking": tracking}, reports.append, is_main=True)

    client = MlflowClient(uri)
    run_id = client.search_runs([client.get_experiment_by_name("curve").experiment_id])[0].info.run_id
    loss = client.get_metric_history(run_id, "train/loss")
    assert sorted(m.step for m in loss) == [5, 10, 15, 20, 23]
    assert len(client.get_metric_history(run_id, "train/lr")) == 5
    assert sorted(m.step for m in client.get_metric_history(run_id, "validation/score")) == [10, 20, 23]
    assert [r["step"] for r in reports if "validation_score" in r and "train_loss" in r][:3] == [10, 20, 23]
