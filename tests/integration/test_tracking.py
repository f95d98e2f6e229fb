"""TrialTracker against a real MLflow server with real tiny training jobs (generated CB data, tiny-t5)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import mlflow
import pytest
from helpers.jobs import tiny_job
from mlflow import MlflowClient

from capt.tasks import generate_rows
from capt.tasks import get as task_spec
from pipelines.capsule_predictor import CapsulePredictor
from pipelines.config.schema import flatten
from pipelines.services import LocalMlflowServer, free_port
from pipelines.sweeps.config import SweepConfig, load_sweep_config
from pipelines.sweeps.leftover import leftover_lines, spooled_operations, upload_spooled
from pipelines.tracking import RetryPolicy, TrialTracker, main, sync_pending
from pipelines.tracking.client import fluent_uri
from pipelines.tracking.pyfunc import log_pyfunc, pyfunc_signature
from pipelines.tracking.spool import FAILED_FILE, PENDING_FILE, RUN_FILE, Spool
from pipelines.training.loop import run
from pipelines.training.outputs import claim_job_folder

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENT = "test-tracking"
MODEL_NAME = "capt-tiny-t5-cb"  # CB here, RTE in test_promote_report: the two files share one server
TAGS = {"task": "cb", "model": "tiny-t5", "method": "capt", "sweep": "test"}


def _tracker(uri: str, state_dir: Path, seed: int, **kwargs: Any) -> TrialTracker:
    return TrialTracker(
        uri, EXPERIMENT, f"cb/tiny-t5/capt/s{seed}", {**TAGS, "seed": seed}, state_dir, **kwargs
    )


@pytest.fixture(scope="module")
def tracked(mlflow_server: LocalMlflowServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One CaPT job trained with its tracker live, as the sweep's rank-0 worker does it."""
    out = tmp_path_factory.mktemp("trial")
    config = tiny_job(out, task={"name": "cb"}, train={"max_epochs": 6, "eval_every_steps": 3})
    with claim_job_folder(config):  # before the tracker writes its run record there, as the sweep's worker does
        tracker = _tracker(mlflow_server.uri, out, 0, system_metrics_interval_s=0.5)
        run_id = tracker.start()
        tracker.log_params(flatten(config.to_dict()))
        result = run(config, lambda record: tracker.log_metrics(record, step=record["step"]))
        _wait_for_system_metrics(MlflowClient(mlflow_server.uri), run_id)
        version = tracker.finish(result, result["artifact_dir"], register=True)
    return {"config": config, "result": result, "run_id": run_id, "version": version, "out": out}


def _wait_for_system_metrics(client: MlflowClient, run_id: str, timeout_s: float = 60.0) -> None:
    """Give the monitor its first sample: a job shorter than one sampling interval logs none."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(key.startswith("system/") for key in client.get_run(run_id).data.metrics):
            return
        time.sleep(0.2)


def test_a_trial_is_one_run_with_params_history_artifacts_and_a_version(
    mlflow_server: LocalMlflowServer, tracked: dict[str, Any]
) -> None:
    client = MlflowClient(mlflow_server.uri)
    run_data = client.get_run(tracked["run_id"])
    assert run_data.info.run_name == "cb/tiny-t5/capt/s0" and run_data.info.status == "FINISHED"
    assert {k: run_data.data.tags[k] for k in (*TAGS, "seed")} == {**TAGS, "seed": "0"}
    assert set(run_data.data.params) == set(flatten(tracked["config"].to_dict()))
    assert run_data.data.params["train.eval_every_steps"] == "3"
    # no lr in the job: the resolved default is logged, never "None"
    assert {k: run_data.data.params[k] for k in ("optim.name", "optim.lr", "optim.schedule")} == {
        "optim.name": "adafactor", "optim.lr": "0.3", "optim.schedule": "linear"}
    history = client.get_metric_history(tracked["run_id"], "validation/score")
    assert [m.step for m in history] == [h["step"] for h in tracked["result"]["history"]] == [3, 6]
    assert run_data.data.metrics["test/score"] == pytest.approx(tracked["result"]["metrics"]["test_score"])
    assert any(key.startswith("system/") for key in run_data.data.metrics), "system metrics are on"
    files = {f.path for f in client.list_artifacts(tracked["run_id"], "artifact")}
    assert {"artifact/capsule.safetensors", "artifact/capsule.json", "artifact/method.json"} <= files
    logged = json.loads(
        Path(
            mlflow.artifacts.download_artifacts(
                run_id=tracked["run_id"], artifact_path="result.json", tracking_uri=mlflow_server.uri
            )
        ).read_text()
    )
    assert logged["metrics"] == tracked["result"]["metrics"]
    [version] = client.search_model_versions(f"name='{MODEL_NAME}' and run_id='{tracked['run_id']}'")
    assert version.version == tracked["version"]
    assert version.tags["validation_status"] == "pending" and version.tags["base_model"] == "tiny-t5"
    assert float(version.tags["test_score"]) == pytest.approx(tracked["result"]["metrics"]["test_score"])


def test_a_trial_restarted_after_its_run_finished_logs_nothing_twice(
    mlflow_server: LocalMlflowServer, tracked: dict[str, Any]
) -> None:
    record = json.loads((tracked["out"] / RUN_FILE).read_text())
    assert record["run_id"] == tracked["run_id"] and record["status"] == "FINISHED"
    assert record["model_version"] == tracked["version"]
    client = MlflowClient(mlflow_server.uri)
    ended = client.get_run(tracked["run_id"]).info.end_time
    tracker = _tracker(mlflow_server.uri, tracked["out"], 0, system_metrics=False)
    assert tracker.finished and tracker.start() == tracked["run_id"]
    tracker.log_metrics({"validation_score": -1.0}, step=99)
    assert tracker.finish(tracked["result"], tracked["result"]["artifact_dir"], register=True) == tracked["version"]
    tracker.fail()
    run_data = client.get_run(tracked["run_id"])
    assert run_data.info.status == "FINISHED" and run_data.info.end_time == ended
    assert [m.step for m in client.get_metric_history(tracked["run_id"], "validation/score")] == [3, 6]


def test_a_trial_restarted_mid_run_reopens_its_run_and_registers_one_version(
    mlflow_server: LocalMlflowServer, tracked: dict[str, Any], tmp_path: Path
) -> None:
    record = json.loads((tracked["out"] / RUN_FILE).read_text())
    unfinished = {k: v for k, v in record.items() if k not in ("status", "model_version")}
    (tmp_path / RUN_FILE).write_text(json.dumps(unfinished))
    tracker = _tracker(mlflow_server.uri, tmp_path, 0, system_metrics=False)
    assert not tracker.finished and tracker.start() == tracked["run_id"]
    client = MlflowClient(mlflow_server.uri)
    assert client.get_run(tracked["run_id"]).info.status == "RUNNING"
    assert (
        tracker.finish(tracked["result"], tracked["result"]["artifact_dir"], register=True)
        == tracked["version"]
    )
    experiment = client.get_experiment_by_name(EXPERIMENT)
    named = client.search_runs([experiment.experiment_id], "attributes.run_name = 'cb/tiny-t5/capt/s0'")
    assert [r.info.run_id for r in named] == [tracked["run_id"]]
    assert len(client.search_model_versions(f"name='{MODEL_NAME}' and run_id='{tracked['run_id']}'")) == 1
    assert client.get_run(tracked["run_id"]).info.status == "FINISHED"
    assert json.loads((tmp_path / RUN_FILE).read_text())["status"] == "FINISHED"


def _log_trial(tracker: TrialTracker, result: dict[str, Any]) -> None:
    tracker.log_params(flatten(result["config"]))
    for record in result["history"]:
        tracker.log_metrics(record, step=record["step"])
    tracker.finish(result, result["artifact_dir"], register=True)


def _spool_a_sweep_trial(uri: str, sweep: SweepConfig, result: dict[str, Any]) -> Path:
    """A sweep's trial that starts and finishes while the server is down: every call of it is spooled."""
    trial = sweep.storage_root() / sweep.name / "jobs" / "cb-tiny-t5-capt-s3-0a1b2c"
    trial.mkdir(parents=True)
    tracker = _tracker(uri, trial, 3, retry=RetryPolicy(budget_s=1.0, first_delay_s=0.2), reconnect_s=3600,
                       system_metrics=False)
    assert tracker.start() is None
    _log_trial(tracker, result)
    return trial


def test_an_outage_spools_then_sync_and_the_sweep_driver_upload_once(
    mlflow_server: LocalMlflowServer,
    tracked: dict[str, Any],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """One outage of the server (a restart costs seconds), two ways back: trials that spooled during it are uploaded
    once by `sync`; a sweep's trial that finished during it is uploaded by its driver once the server answers at the
    sweep's end, and a driver does not wait for a server that does not answer."""
    result, quick, synced_root = tracked["result"], RetryPolicy(budget_s=1.0, first_delay_s=0.2), tmp_path / "sync"
    sweep = load_sweep_config(ROOT / "pipelines/configs/smoke.yaml", [f"storage_path={tmp_path / 'sweep'}",
                                                                      "name=outage"])
    early = _tracker(
        mlflow_server.uri, synced_root / "s1", 1, retry=quick, reconnect_s=3600, system_metrics=False
    )
    early_run = early.start()
    mlflow_server.stop()
    try:
        began = time.monotonic()
        _log_trial(early, result)  # started before the outage
        late = _tracker(
            mlflow_server.uri, synced_root / "s2", 2, retry=quick, reconnect_s=3600, system_metrics=False
        )
        assert late.start() is None  # no run yet: the start itself is spooled
        _log_trial(late, result)
        assert time.monotonic() - began < 15, (
            "an outage costs one retry budget per offline period, not per call"
        )
        trial = _spool_a_sweep_trial(mlflow_server.uri, sweep, result)
        began = time.monotonic()
        assert upload_spooled(sweep, mlflow_server.uri) == []
        assert time.monotonic() - began < 5, "a server that does not answer is not waited for"
        assert spooled_operations(sweep) == {trial.name: 5}
    finally:
        mlflow_server.start()
    _assert_sync_uploaded_once(mlflow_server, synced_root, early_run, capsys)
    _assert_the_driver_uploaded_once(mlflow_server, sweep, trial)


def _assert_sync_uploaded_once(mlflow_server: LocalMlflowServer, root: Path, early_run: str,
                               capsys: pytest.CaptureFixture[str]) -> None:
    assert [op["op"] for op in Spool(root / "s1" / PENDING_FILE).read()] == [
        "params",
        "metrics",
        "metrics",
        "finish",
    ]
    assert [op["op"] for op in Spool(root / "s2" / PENDING_FILE).read()][0] == "start"
    assert sync_pending(root).synced == 9
    assert not (root / "s1" / PENDING_FILE).exists() and not (root / "s2" / PENDING_FILE).exists()
    client = MlflowClient(mlflow_server.uri)
    late_run = json.loads((root / "s2" / RUN_FILE).read_text())["run_id"]
    for run_id in (early_run, late_run):
        assert client.get_run(run_id).info.status == "FINISHED"
        assert len(client.get_metric_history(run_id, "validation/score")) == 2
        assert len(client.search_model_versions(f"name='{MODEL_NAME}' and run_id='{run_id}'")) == 1
    assert main(["sync", "--root", str(root), "--tracking-uri", mlflow_server.uri]) == 0
    assert f"Nothing to sync under {root}" in capsys.readouterr().out
    assert sync_pending(root).synced == 0
    assert len(client.get_metric_history(late_run, "validation/score")) == 2
    experiment = client.get_experiment_by_name(EXPERIMENT)
    assert (
        len(client.search_runs([experiment.experiment_id], "attributes.run_name = 'cb/tiny-t5/capt/s2'")) == 1
    )


def _assert_the_driver_uploaded_once(mlflow_server: LocalMlflowServer, sweep: SweepConfig, trial: Path) -> None:
    assert upload_spooled(sweep, mlflow_server.uri) == [
        "Uploaded 5 operations that 1 trial spooled while the MLflow server could not be reached."]
    assert spooled_operations(sweep) == {} and leftover_lines(sweep, mlflow_server.uri, local_server=False) == []
    run_id = json.loads((trial / RUN_FILE).read_text())["run_id"]
    client = MlflowClient(mlflow_server.uri)
    assert client.get_run(run_id).info.status == "FINISHED"
    assert len(client.get_metric_history(run_id, "validation/score")) == 2
    assert len(client.search_model_versions(f"name='{MODEL_NAME}' and run_id='{run_id}'")) == 1
    assert upload_spooled(sweep, mlflow_server.uri) == [], "nothing is uploaded twice"


def _sync_cli(root: Path, uri: str, *more: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "pipelines.tracking", "sync", "--root", str(root), "--tracking-uri", uri, *more]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_sync_cli_dead_letters_corrupt_and_torn_lines_and_uploads_every_operation(
    mlflow_server: LocalMlflowServer, tmp_path: Path
) -> None:
    closed, trial = f"http://127.0.0.1:{free_port()}", tmp_path / "jobs" / "s7"
    offline = _tracker(closed, trial, 7, retry=RetryPolicy(budget_s=0.2, first_delay_s=0.1), reconnect_s=3600,
                       system_metrics=False)
    assert offline.start() is None
    offline.log_params({"optim": {"lr": 0.3}})
    for step, score in ((3, 50.0), (6, 62.5)):
        offline.log_metrics({"validation_score": score}, step=step)
    (tmp_path / "artifact").mkdir()
    (tmp_path / "artifact" / "capsule.json").write_text("{}")
    offline.finish({"metrics": {"test_score": 55.0}, "steps": 6}, tmp_path / "artifact", register=False)
    lines = (trial / PENDING_FILE).read_text().splitlines(keepends=True)
    lines.insert(2, "<<<merge conflict>>>\n")  # line 3: a hand edit gone wrong
    lines.append('{"op": "metrics", "metr')  # line 7: torn by a crash mid-append
    (trial / PENDING_FILE).write_text("".join(lines))
    assert len(Spool(trial / PENDING_FILE)) == 7

    skipped = _sync_cli(tmp_path, mlflow_server.uri)  # spooled for the closed port: not for this server
    assert skipped.returncode == 1 and "Synced 0 operation(s)" in skipped.stdout, skipped.stderr[-3000:]
    assert "7 still pending (7 of them skipped" in skipped.stdout and f"recorded for {closed}" in skipped.stdout
    assert len(Spool(trial / PENDING_FILE)) == 7 and not (trial / FAILED_FILE).exists(), "a skipped spool is untouched"
    synced = _sync_cli(tmp_path, mlflow_server.uri, "--moved-from", closed)  # the server moved: replay it here
    assert synced.returncode == 1, synced.stderr[-3000:]  # the dead letters did not reach the server
    assert "Synced 5 operation(s)" in synced.stdout and "dead-lettered 2; 0 still pending" in synced.stdout
    assert "jobs/s7: 5 synced, 2 dead-lettered now (2 in mlflow_failed.jsonl), 0 still pending" in synced.stdout
    assert not (trial / PENDING_FILE).exists()
    records = Spool(trial / FAILED_FILE).records()
    assert [(r["line"], r["raw"]) for r in records] == [(3, "<<<merge conflict>>>"), (7, '{"op": "metrics", "metr')]
    assert all(r["file"] == str(trial / PENDING_FILE) and r["reason"] for r in records)

    client = MlflowClient(mlflow_server.uri)
    run_id = json.loads((trial / RUN_FILE).read_text())["run_id"]
    run_data = client.get_run(run_id)
    assert run_data.info.status == "FINISHED" and run_data.data.params["optim.lr"] == "0.3"
    assert [m.step for m in client.get_metric_history(run_id, "validation/score")] == [3, 6]
    assert run_data.data.metrics["test/score"] == 55.0
    again = _sync_cli(tmp_path, mlflow_server.uri, "--moved-from", closed)
    assert again.returncode == 1 and "Synced 0 operation(s)" in again.stdout
    assert len(Spool(trial / FAILED_FILE).records()) == 2, "dead letters are kept until a person handles them"


LOAD_IN_A_FRESH_PROCESS = """
import json, sys
import mlflow, pandas as pd
predicted = mlflow.pyfunc.load_model(sys.argv[1]).predict(pd.DataFrame(json.loads(sys.argv[2])))
import capt, pipelines.capsule_predictor
print(json.dumps({"labels": list(predicted), "capt": capt.__file__,
                  "capsule_predictor": pipelines.capsule_predictor.__file__}))
"""


def _artifact_files(client: MlflowClient, model_id: str, path: str | None = None) -> list[str]:
    files = []
    for info in client.list_logged_model_artifacts(model_id, path):
        files += _artifact_files(client, model_id, info.path) if info.is_dir else [info.path]
    return files


def test_a_registered_version_holds_no_pickle_and_loads_in_a_fresh_process(
    mlflow_server: LocalMlflowServer, tracked: dict[str, Any], tmp_path: Path
) -> None:
    client = MlflowClient(mlflow_server.uri)
    version = client.get_model_version(MODEL_NAME, tracked["version"])
    assert version.source.startswith("models:/m-"), version.source  # a logged model (MLflow 3)
    model_id = version.model_id or version.source.removeprefix("models:/")
    files = _artifact_files(client, model_id)
    assert "MLmodel" in files and "capsule_model.py" in files and "code/project_code.zip" in files
    assert not [f for f in files if f.startswith("code/") and f != "code/project_code.zip"], "one upload, not 200"
    assert not [f for f in files if f.endswith((".pkl", ".pickle", ".cloudpickle"))], files
    uri = f"models:/{MODEL_NAME}/{tracked['version']}"
    location = client.get_logged_model(model_id).artifact_location
    requirements = Path(mlflow.artifacts.download_artifacts(f"{location}/requirements.txt", dst_path=str(tmp_path),
                                                            tracking_uri=mlflow_server.uri))
    requirements = requirements.read_text().split()
    assert not [line for line in requirements if "+" in line], requirements
    assert f"capt=={metadata.version('capt')}" in requirements and any(r.startswith("torch==") for r in requirements)

    rows = [{k: v for k, v in row.items() if k not in ("generated", "idx", "label")}
            for row in generate_rows("cb", "val", 6, seed=3)]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing points at this checkout
    env |= {"MLFLOW_TRACKING_URI": mlflow_server.uri, "MLFLOW_ALLOW_PICKLE_DESERIALIZATION": "false"}
    loaded = subprocess.run([sys.executable, "-c", LOAD_IN_A_FRESH_PROCESS, uri, json.dumps(rows)], cwd=tmp_path,
                            env=env, capture_output=True, text=True, timeout=300)
    assert loaded.returncode == 0, loaded.stderr[-4000:]
    answer = json.loads(loaded.stdout.strip().splitlines()[-1])
    local = CapsulePredictor(tracked["result"]["artifact_dir"], tracked["result"]).predict_rows(rows)
    assert answer["labels"] == local and len(local) == 6
    for module in ("capt", "capsule_predictor"):  # the version's own copy of the code, not a checkout's
        assert "/code/project_code.zip/" in answer[module], answer
        assert not answer[module].startswith((str(ROOT), "/work/main")), answer


@contextlib.contextmanager
def _not_answering(server: LocalMlflowServer) -> Iterator[None]:
    """The server's processes stopped (SIGSTOP): connections open, no answer comes, until the block ends."""
    group = os.getpgid(server.pid)
    os.killpg(group, signal.SIGSTOP)
    try:
        yield
    finally:
        os.killpg(group, signal.SIGCONT)


def test_log_metrics_returns_while_the_server_does_not_answer_and_finish_uploads_every_point(
    mlflow_server: LocalMlflowServer, tmp_path: Path
) -> None:
    tracker = _tracker(mlflow_server.uri, tmp_path, 11, system_metrics=False)
    run_id = tracker.start()
    logging_thread = threading.Thread(
        target=lambda: [tracker.log_metrics({"validation_score": float(s)}, step=s) for s in (1, 2, 3)])
    with _not_answering(mlflow_server):
        logging_thread.start()
        logging_thread.join(timeout=20)  # a hang detector: the old tracker waited 30 s per request here
        returned = not logging_thread.is_alive()
        spooled = [op["step"] for op in Spool(tmp_path / PENDING_FILE).read()]
    logging_thread.join()
    assert returned, "log_metrics waited for a server that does not answer"
    assert spooled == [1, 2, 3], "the points are durable before the server has them (a crash loses none)"
    tracker.finish({"metrics": {"test_score": 1.0}, "steps": 3}, tmp_path / "no-artifact", register=False)
    client = MlflowClient(mlflow_server.uri)
    assert [m.step for m in client.get_metric_history(run_id, "validation/score")] == [1, 2, 3]
    assert client.get_run(run_id).info.status == "FINISHED"
    assert not (tmp_path / PENDING_FILE).exists() and tracker.background_problems == []


def test_a_metric_refused_in_the_background_is_reported_at_finish_and_dead_lettered(
    mlflow_server: LocalMlflowServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tracker = _tracker(mlflow_server.uri, tmp_path, 12, system_metrics=False)
    run_id = tracker.start()
    tracker.log_metrics({"validation_score": 1.0}, step=1)
    tracker.log_metrics({"not a metric name!": 2.0}, step=2)  # MLflow refuses the name
    tracker.log_metrics({"validation_score": 3.0}, step=3)
    tracker.finish({"metrics": {}, "steps": 3}, tmp_path / "no-artifact", register=False)
    [problem] = tracker.background_problems
    assert problem.startswith("1 spooled operation(s) dead-lettered") and str(tmp_path / FAILED_FILE) in problem
    assert problem in caplog.text
    [dead] = Spool(tmp_path / FAILED_FILE).records()
    assert dead["op"] == "metrics" and dead["step"] == 2 and "not a metric name!" in dead["error"]
    client = MlflowClient(mlflow_server.uri)
    assert [m.step for m in client.get_metric_history(run_id, "validation/score")] == [1, 3]
    assert client.get_run(run_id).info.status == "FINISHED"


COUNTING_MODEL = """
import os
import mlflow


class CountingModel(mlflow.pyfunc.PythonModel):
    def load_context(self, context):
        with open(os.environ["CAPT_TEST_MODEL_CALLS"], "a") as calls:
            calls.write("load\\n")

    def predict(self, context, model_input, params=None):
        with open(os.environ["CAPT_TEST_MODEL_CALLS"], "a") as calls:
            calls.write("predict\\n")
        return ["entailment"] * len(model_input)


mlflow.models.set_model(CountingModel())
"""


def test_logging_the_pyfunc_stores_signature_and_example_without_loading_the_model(
    mlflow_server: LocalMlflowServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls, model_code = tmp_path / "calls.txt", tmp_path / "counting_model.py"
    model_code.write_text(COUNTING_MODEL)
    monkeypatch.setenv("CAPT_TEST_MODEL_CALLS", str(calls))
    signature, example = pyfunc_signature("cb", task_spec("cb").label_names)
    client = MlflowClient(mlflow_server.uri)
    experiment = client.get_experiment_by_name(EXPERIMENT)  # None when this test runs alone
    experiment_id = experiment.experiment_id if experiment else client.create_experiment(EXPERIMENT)
    run_id = client.create_run(experiment_id).info.run_id
    with fluent_uri(mlflow_server.uri), mlflow.start_run(run_id=run_id):
        info = log_pyfunc(signature, example, {"result": str(model_code)}, "capsule-tiny-t5-cb", {}, 0,
                           model_code=model_code)
    assert not calls.exists(), f"logging ran the model: {calls.read_text().split()}"
    with fluent_uri(mlflow_server.uri):
        local = mlflow.artifacts.download_artifacts(info.model_uri, dst_path=str(tmp_path / "model"))
    stored = mlflow.models.Model.load(local)
    assert stored.signature == signature and stored.signature.inputs.input_names() == ["premise", "hypothesis"]
    assert stored.load_input_example(local).to_dict("records") == example.to_dict("records")
    predicted = mlflow.pyfunc.load_model(local).predict(example)
    assert list(predicted) == ["entailment", "entailment"]
    assert calls.read_text().split() == ["load", "predict"], "the counter sees a load and a predict"
