"""`python -m pipelines.train --tracking-uri URI`: a single job logs one MLflow run as a sweep's trial does, against a
real MLflow server, with real tiny training jobs (tiny-t5, generated data) run as subprocesses."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from mlflow import MlflowClient

from pipelines import report
from pipelines.reporting import KEPT_NOTE
from pipelines.services import LocalMlflowServer, free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
JOB = ["model.name=tiny-t5", "task.name=cb", "seed=7", "task.source=generated", "task.generated_size=24",
       "train.batch_size=4", "train.max_epochs=1", "train.max_steps=4", "train.eval_every_steps=2",
       "train.log_every_steps=1", "train.resume=true"]
JOB_SETTINGS = "batch_size=4 max_epochs=1 max_steps=4"
"""What JOB sets away from CaPT's own settings, as a run name lists it (after the lr)."""
RUN_URL = re.compile(r"^MLflow run: (\S+/#/experiments/(\d+)/runs/(\w+))", re.MULTILINE)


def _train(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    if env is None or "MLFLOW_TRACKING_URI" not in env:
        environment.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.run([sys.executable, "-m", "pipelines.train", *args], cwd=ROOT, env=environment,
                          capture_output=True, text=True, timeout=300)


def _runs(client: MlflowClient, experiment: str) -> list[Any]:
    found = client.get_experiment_by_name(experiment)
    return [] if found is None else client.search_runs([found.experiment_id])


def _tracked_runs(client: MlflowClient, tracked_job: dict[str, Any]) -> list[Any]:
    """The runs of the tracked job's own config (the hyper-parameter test adds other jobs to its experiment)."""
    config_hash = tracked_job["result"]["config_hash"]
    return [run for run in _runs(client, tracked_job["experiment"]) if run.data.tags.get("config_hash") == config_hash]


@pytest.fixture(scope="module")
def tracked_job(mlflow_server: LocalMlflowServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One job run with --tracking-uri: its output, result and experiment."""
    folder, experiment = tmp_path_factory.mktemp("tracked-job"), f"test-train-job-{uuid.uuid4().hex[:8]}"
    done = _train(*JOB, f"output_dir={folder}", "--tracking-uri", mlflow_server.uri, "--experiment", experiment)
    assert done.returncode == 0, done.stderr[-4000:]
    return {"done": done, "folder": folder, "experiment": experiment,
            "result": json.loads((folder / "result.json").read_text())}


def test_a_tracked_job_logs_one_finished_run_like_a_trial(mlflow_server: LocalMlflowServer,
                                                           tracked_job: dict[str, Any]) -> None:
    client, result = MlflowClient(mlflow_server.uri), tracked_job["result"]
    [run] = _tracked_runs(client, tracked_job)
    url = RUN_URL.search(tracked_job["done"].stderr)
    assert url and url.group(1).startswith(mlflow_server.uri) and url.group(3) == run.info.run_id, "its URL is printed"
    lr = result["config"]["optim"]["lr"]  # then what JOB sets away from CaPT's own settings
    assert run.info.status == "FINISHED" and run.info.run_name == f"cb/tiny-t5/capt/s7 lr={lr:g} {JOB_SETTINGS}"
    assert {k: run.data.tags[k] for k in ("task", "model", "method", "seed", "run_kind")} == {
        "task": "cb", "model": "tiny-t5", "method": "capt", "seed": "7", "run_kind": "job"}
    assert run.data.tags["config_hash"] == result["config_hash"]
    assert run.data.tags["artifact_digest"] == result["artifact_digest"]
    params = run.data.params  # the resolved config: the defaults the job filled in, never "None"
    assert params["train.max_steps"] == "4" and params["optim.name"] == result["config"]["optim"]["name"]
    assert float(params["optim.lr"]) == result["config"]["optim"]["lr"]
    history = client.get_metric_history(run.info.run_id, "validation/score")
    assert [m.step for m in history] == [h["step"] for h in result["history"]] == [2, 4]
    curve = client.get_metric_history(run.info.run_id, "train/loss")
    assert [m.step for m in curve] == [p["step"] for p in result["curve"]] == [1, 2, 3, 4]
    assert run.data.metrics["test/score"] == pytest.approx(result["metrics"]["test_score"])
    assert [d.dataset.digest for d in run.inputs.dataset_inputs] == [result["dataset"]["digest"]]
    files = {f.path for f in client.list_artifacts(run.info.run_id, "artifact")}
    assert {"artifact/capsule.safetensors", "artifact/capsule.json"} <= files
    assert "result.json" in {f.path for f in client.list_artifacts(run.info.run_id)}


def test_the_same_job_again_reuses_its_result_and_adds_no_run(mlflow_server: LocalMlflowServer,
                                                              tracked_job: dict[str, Any]) -> None:
    client = MlflowClient(mlflow_server.uri)
    before = _runs(client, tracked_job["experiment"])
    [tracked] = _tracked_runs(client, tracked_job)
    # the same job, the server from MLFLOW_TRACKING_URI this time
    again = _train(*JOB, f"output_dir={tracked_job['folder']}", "--experiment", tracked_job["experiment"],
                   env={"MLFLOW_TRACKING_URI": mlflow_server.uri})
    assert again.returncode == 0, again.stderr[-4000:]
    assert "reused, not trained again" in again.stderr
    url = RUN_URL.search(again.stderr)
    assert url and url.group(3) == tracked.info.run_id, "it names the run of the result it reused"
    after = _runs(client, tracked_job["experiment"])
    assert [(r.info.run_id, r.info.end_time) for r in after] == [(r.info.run_id, r.info.end_time) for r in before]
    assert len(client.get_metric_history(tracked.info.run_id, "validation/score")) == 2


def test_jobs_differing_in_one_hyper_parameter_have_distinct_run_names_and_the_report_says_which_it_kept(
        mlflow_server: LocalMlflowServer, tracked_job: dict[str, Any], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Three single jobs in one experiment, the same but for optim.lr or train.batch_size (the tracked job at CaPT's
    own lr, two more at lr 0.05, one of them at batch size 2): their runs are told apart by name, and the report, which
    tabulates one run per (task, model, method, seed), names the run it kept (best validation) and the ones it left
    out."""
    experiment, own_lr = tracked_job["experiment"], tracked_job["result"]["config"]["optim"]["lr"]
    assert own_lr != 0.05, "the tracked job must differ from the others in its lr"
    tracked_name = f"cb/tiny-t5/capt/s7 lr={own_lr:g} {JOB_SETTINGS}"
    assert f"run {tracked_name!r}" in tracked_job["done"].stderr, "the run's name is said before it trains"
    validation = {tracked_name: tracked_job["result"]["metrics"]["best_validation_score"]}
    jobs = {"lr-0.05": ("optim.lr=0.05",), "batch-2": ("optim.lr=0.05", "train.batch_size=2")}
    names = {"lr-0.05": f"cb/tiny-t5/capt/s7 lr=0.05 {JOB_SETTINGS}",
             "batch-2": f"cb/tiny-t5/capt/s7 lr=0.05 {JOB_SETTINGS.replace('batch_size=4', 'batch_size=2')}"}
    for folder, overrides in jobs.items():
        done = _train(*JOB, *overrides, f"output_dir={tmp_path / folder}", "--tracking-uri", mlflow_server.uri,
                      "--experiment", experiment)
        assert done.returncode == 0, done.stderr[-4000:]
        assert f"run {names[folder]!r}" in done.stderr, "the run's name is said before it trains"
        result = json.loads((tmp_path / folder / "result.json").read_text())
        validation[names[folder]] = result["metrics"]["best_validation_score"]
    runs = _runs(MlflowClient(mlflow_server.uri), experiment)
    assert sorted(run.info.run_name for run in runs) == sorted(validation)

    capsys.readouterr()
    assert report.main(["--experiment", experiment, "--tracking-uri", mlflow_server.uri, "--out",
                        str(tmp_path / "report")]) == 0
    text = capsys.readouterr().out
    *left_out, kept = sorted(validation, key=lambda name: (validation[name], name))  # the report's own order
    others = ", ".join(f"`{name}` ({validation[name]:.2f})" for name in left_out)
    tie = " (a tie: the name sorting last)" if validation[kept] == max(validation[n] for n in left_out) else ""
    assert KEPT_NOTE in text, text
    assert (f"- cb / capt / seed 7: kept `{kept}` (best_validation_score {validation[kept]:.2f}) over {others}"
            f"{tie}") in text.splitlines(), text


def test_an_unreachable_server_stops_the_job_before_it_writes_anything(tmp_path: Path) -> None:
    uri = f"http://127.0.0.1:{free_port()}"
    done = _train(*JOB, f"output_dir={tmp_path / 'job'}", env={"MLFLOW_TRACKING_URI": uri})
    assert done.returncode == 2, done.stderr[-4000:]
    [error] = [line for line in done.stderr.split("\n\n") if line.startswith("error:")]
    assert uri in error and "MLFLOW_TRACKING_URI" in error and "Traceback" not in done.stderr
    assert not (tmp_path / "job").exists(), "nothing was written"


def test_an_interrupted_job_ends_its_run_failed_with_the_error(mlflow_server: LocalMlflowServer,
                                                               tmp_path: Path) -> None:
    experiment = f"test-train-job-{uuid.uuid4().hex[:8]}"
    job = [*JOB, "train.max_steps=100000", "train.max_epochs=1000", "train.patience=null", f"output_dir={tmp_path}"]
    log = tmp_path.parent / f"{tmp_path.name}-stderr.log"  # a file, not a pipe: nothing blocks on a full buffer
    with log.open("w") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "pipelines.train", *job, "--tracking-uri", mlflow_server.uri,
                                 "--experiment", experiment], cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"},
                                stdout=subprocess.DEVNULL, stderr=stderr, preexec_fn=_sigint_as_in_a_terminal)
        try:
            _wait_for(lambda: (tmp_path / "checkpoints" / "latest").is_dir() or proc.poll() is not None, 240)
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=240)
            except subprocess.TimeoutExpired:
                pytest.fail(f"the job did not end within 240 s of SIGINT: {log.read_text()[-4000:]}")
        finally:
            proc.kill()
    err = log.read_text()
    assert proc.returncode != 0, err[-4000:]
    [run] = _runs(MlflowClient(mlflow_server.uri), experiment)
    assert run.info.status == "FAILED" and run.data.tags["error"].startswith("KeyboardInterrupt"), err[-4000:]


def _sigint_as_in_a_terminal() -> None:
    """In the child before exec: SIGINT at its default, so Python turns it into KeyboardInterrupt. A test session
    started in the background by a non-interactive shell ignores SIGINT, and children inherit that: the job would
    train on through the signal."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _wait_for(condition, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
