"""`pipelines.tracking.jobs`: the one way a job runs tracked, for `python -m pipelines.train` and a sweep's trials.

Real tiny jobs; MLflow here is a SQLite store in the test's folder (no server). The HTTP server cases are in
tests/integration/test_train_tracking.py."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from helpers.jobs import tiny_job

from pipelines.services import ServiceError, free_port
from pipelines.tracking.job_cli import NOT_TRACKED, job_plan, tracking_line
from pipelines.tracking.jobs import RunPlan, job_run_name, job_run_tags, tracked_job
from pipelines.training.loop import run

STEPS = {"max_steps": 4, "eval_every_steps": 2, "resume": True}


def _job(config):
    return lambda report, log: run(config, report, log=log)


def test_a_sweep_trials_tracking_dict_is_a_run_plan() -> None:
    tracking = {"uri": "http://mlflow:5000", "experiment": "capt-smoke", "run_name": "rte/tiny-t5/capt/s0",
                "retry_s": 5.0, "system_metrics_interval_s": 1.0, "register": True, "tags": {"sweep": "smoke"},
                "ui_uri": None, "moved_from": ["http://127.0.0.1:1"]}
    plan = RunPlan.from_dict(tracking)
    assert (plan.uri, plan.experiment, plan.run_name, plan.retry_s, plan.register) == (
        "http://mlflow:5000", "capt-smoke", "rte/tiny-t5/capt/s0", 5.0, True)
    assert plan.ui_uri is None and plan.moved_from == ("http://127.0.0.1:1",) and plan.tags == {"sweep": "smoke"}
    assert RunPlan.from_dict({**tracking, "uri": None}).uri is None, "tracking off"


def test_an_untracked_job_runs_reports_numbers_and_reuses_its_result(tmp_path: Path) -> None:
    config = tiny_job(tmp_path, train=STEPS)
    reports: list[dict] = []
    first = tracked_job(config, RunPlan(None), _job(config), reports.append)
    assert not first.reused and first.run_id is None and first.run_url is None
    assert [r["step"] for r in reports] == [2, 4] and all(isinstance(v, float) for r in reports for v in r.values())
    assert not list(tmp_path.glob("mlflow_*")), "no run record without a server"
    again = tracked_job(config, RunPlan(None), _job(config))
    assert again.reused and again.result["result_digest"] == first.result["result_digest"]


def test_a_tracked_job_is_one_run_and_its_reuse_adds_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow import MlflowClient

    monkeypatch.chdir(tmp_path)  # the SQLite store's artifacts go under ./mlruns
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    config = tiny_job(tmp_path / "job", train=STEPS)
    plan = RunPlan(uri, "jobs", job_run_name(config), job_run_tags(config), system_metrics_interval_s=60.0)
    first = tracked_job(config, plan, _job(config))
    again = tracked_job(config, plan, _job(config))
    client = MlflowClient(uri)
    [logged] = client.search_runs([client.get_experiment_by_name("jobs").experiment_id])
    assert first.run_id == again.run_id == logged.info.run_id and again.reused and not first.reused
    assert logged.info.status == "FINISHED" and logged.info.run_name == "rte/tiny-t5/capt/s0"
    assert logged.data.tags["config_hash"] == first.result["config_hash"] and logged.data.tags["seed"] == "0"
    assert first.run_url is None, "a SQLite store has no web page"
    assert tracking_line(plan, again, tmp_path).startswith(f"MLflow run: {logged.info.run_id} (experiment 'jobs'")


def test_the_cli_plan_is_untracked_without_a_server_and_refuses_one_that_does_not_answer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tiny_job(tmp_path / "job")
    args = argparse.Namespace(tracking_uri=None, experiment="capt-jobs", register=False, config=None)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    plan = job_plan(args, config)
    assert plan.uri is None and tracking_line(plan, None, tmp_path) == NOT_TRACKED
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{free_port()}")
    with pytest.raises(ServiceError, match="MLFLOW_TRACKING_URI"):
        job_plan(args, config)
    args.tracking_uri = "http://me:secret@127.0.0.1:5000"
    with pytest.raises(ServiceError, match=r"--tracking-uri holds credentials \(http://127.0.0.1:5000 ") as refused:
        job_plan(args, config)
    assert "secret" not in str(refused.value)
    assert not (tmp_path / "job").exists()
