"""End-to-end sweeps on a real Ray head and a real MLflow server: `ray job submit`, DDP trials, the
registry and promotion, driver kill + --resume, an MLflow outage during a trial, and one-worker trials
in a reused trial process that keeps its base model."""

from __future__ import annotations

import csv
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from helpers.mlflow_runs import trial_runs

from capt.tasks import generate_rows, get
from pipelines.services import LocalMlflowServer

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--config", "pipelines/configs/smoke.yaml", "models=[tiny-t5]", "tasks=[rte]", "job.train.max_steps=6",
         "job.train.eval_every_steps=3", "job.task.generated_size=32", "job.task.max_eval_examples=8",
         "data_source=generated"]


def _mlflow():
    import mlflow

    return mlflow


def _env(ray_head, **extra: str) -> dict[str, str]:
    env = {**os.environ, **ray_head.client_env(), "OMP_NUM_THREADS": "1", **extra}
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


def _submit(ray_head, *args: str) -> subprocess.CompletedProcess:
    ray = str(Path(sys.executable).with_name("ray"))
    command = [ray, "job", "submit", "--address", ray_head.dashboard_url, "--working-dir", str(ROOT), "--",
               "python", "pipelines/sweep.py", *args]
    env = _env(ray_head)
    env.pop("RAY_ADDRESS", None)
    return subprocess.run(command, capture_output=True, text=True, timeout=900, env=env, cwd=ROOT)


def test_ray_job_submit_runs_a_ddp_sweep_that_registers_and_promotes(ray_head, mlflow_server, tmp_path, monkeypatch):
    # WiC: the registered model capt-tiny-t5-wic belongs to this test alone on the shared server.
    proc = _submit(ray_head, *SMALL, "tasks=[wic]", "name=it-submit", f"storage_path={tmp_path}",
                   f"tracking.uri={mlflow_server.uri}",
                   "resources.num_workers=2", "resources.cpus_per_worker=0.9")
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-3000:]
    assert "succeeded" in (proc.stdout + proc.stderr).lower()
    folder = _job_folder(tmp_path / "it-submit" / "jobs", "wic-tiny-t5-capt-s0")
    result = json.loads((folder / "result.json").read_text())
    assert result["processes"] == 2 and result["ranks_in_sync"] is True, "DDP over gloo kept the replicas equal"

    mlflow = _mlflow()
    client = mlflow.MlflowClient(mlflow_server.uri)
    experiment = client.get_experiment_by_name("capt-it-submit")
    runs = trial_runs(client, [experiment.experiment_id])
    assert [r.info.run_name for r in runs] == ["wic/tiny-t5/capt/s0"]
    run = runs[0]
    assert run.data.params["train.max_steps"] == "6" and run.data.tags["sweep"] == "it-submit"
    assert len(client.get_metric_history(run.info.run_id, "validation/score")) == 2
    assert run.data.metrics["test/score"] == pytest.approx(result["metrics"]["test_score"])
    champion = client.get_model_version_by_alias("capt-tiny-t5-wic", "champion")
    assert champion.run_id == run.info.run_id

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.uri)
    model = mlflow.pyfunc.load_model("models:/capt-tiny-t5-wic@champion")
    rows = pd.DataFrame(generate_rows("wic", "val", 4, seed=3))
    labels = model.predict(rows.drop(columns=["label"]))
    assert len(labels) == 4 and set(labels) <= set(get("wic").label_names)


def test_a_broken_sweep_config_fails_the_job_with_the_config_error(ray_head, tmp_path):
    proc = _submit(ray_head, *SMALL, "job.train.batch_size=-4", "job.method.options.fusion=glue",
                   f"storage_path={tmp_path}", "tracking.enabled=false")
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "train.batch_size=-4" in output and "fusion='glue'" in output
    assert not (tmp_path / "smoke").exists()


def _job_folder(jobs: Path, trial: str) -> Path:
    """The one output folder of `trial` (its name, then a config hash)."""
    [folder] = jobs.glob(f"{trial}-*")
    return folder


def _sweep(ray_head, tmp_path, uri, *extra: str) -> list[str]:
    return [sys.executable, "pipelines/sweep.py", *SMALL, "name=it-resume", f"storage_path={tmp_path}",
            f"tracking.uri={uri}", "seeds=[0,1]", "resources.max_concurrent_trials=1", "tracking.register=false",
            *extra]


def _finished(jobs: Path) -> int:
    return len(list(jobs.glob("*/result.json")))



def test_killed_driver_resumes_without_repeating_trials(ray_head, mlflow_server, tmp_path):
    env = _env(ray_head, RAY_ADDRESS=ray_head.address)
    driver = subprocess.Popen(_sweep(ray_head, tmp_path, mlflow_server.uri), cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    jobs = tmp_path / "it-resume" / "jobs"
    deadline = time.monotonic() + 600
    # Kill the moment the first job has written its result: its trial may not have ended in Tune's
    # experiment state yet, and the second trial (one at a time) has not trained.
    while _finished(jobs) == 0 and driver.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(driver.pid, signal.SIGKILL)
    driver.wait()
    done_before = {p.parent.name: p.stat().st_mtime for p in jobs.glob("*/result.json")}
    assert len(done_before) == 1, "the driver must die mid-sweep"
    resumed = subprocess.run(_sweep(ray_head, tmp_path, mlflow_server.uri, "--resume"), cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert _finished(jobs) == 2
    for name, mtime in done_before.items():
        assert (jobs / name / "result.json").stat().st_mtime == mtime, f"{name} ran twice"
    client = _mlflow().MlflowClient(mlflow_server.uri)
    experiment = client.get_experiment_by_name("capt-it-resume")
    names = [r.info.run_name for r in trial_runs(client, [experiment.experiment_id])]
    assert sorted(names) == [f"rte/tiny-t5/capt/s{seed}" for seed in range(2)], "one MLflow run per trial"
    folder = tmp_path / "it-resume"  # the resumed sweep's summary covers the trial finished before the kill too
    with (folder / "summary.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert sorted((r["seed"], r["status"], r["data"]) for r in rows) == [("0", "done", "generated"),
                                                                       ("1", "done", "generated")]
    assert all(float(r["majority"]) > 0 and r["chance"] and r["untrained"] and r["test"] for r in rows)
    assert "| rte | tiny-t5 | capt | 1 | generated |" in (folder / "summary.md").read_text()
    assert "jobs/" in (folder / "README.md").read_text()
    header = next(line for line in resumed.stdout.splitlines() if line.startswith("task "))
    assert header.split()[4:9] == ["data", "majority", "chance", "untrained", "valid"]
    assert f"Summary: {folder / 'summary.md'}" in resumed.stdout


def _final_tune_results(experiment: Path) -> dict[int, dict]:
    """Per seed: the last result Tune recorded for the trial (its `result.json` holds one JSON line per report)."""
    finals = {}
    for path in experiment.glob("*/result.json"):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        finals[rows[-1]["config"]["point"]["seed"]] = rows[-1]
    return finals


def test_a_reused_trial_process_trains_the_next_trial_on_its_cached_base_model(ray_head, mlflow_server, tmp_path):
    env = _env(ray_head, RAY_ADDRESS=ray_head.address)
    command = [sys.executable, "pipelines/sweep.py", *SMALL, "name=it-reuse", f"storage_path={tmp_path}",
               f"tracking.uri={mlflow_server.uri}", "tracking.register=false", "seeds=[0,1]",
               "resources.max_concurrent_trials=1"]
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-4000:]
    finals = _final_tune_results(tmp_path / "it-reuse")
    assert sorted(finals) == [0, 1]
    first, second = finals[0], finals[1]
    assert first["process_id"] == second["process_id"], "Tune reused the trial process"
    assert (first["base_model_loads"], first["base_model_hits"]) == (1, 0)
    assert (second["base_model_loads"], second["base_model_hits"]) == (1, 1), "the second trial loaded no weights"
    assert first["torch_threads"] == second["torch_threads"] == 1, "as a Ray Train worker of 1 CPU"
    client = _mlflow().MlflowClient(mlflow_server.uri)
    runs = trial_runs(client, [client.get_experiment_by_name("capt-it-reuse").experiment_id])
    assert sorted(r.info.run_name for r in runs) == ["rte/tiny-t5/capt/s0", "rte/tiny-t5/capt/s1"]
    for run in runs:
        result = json.loads((_job_folder(tmp_path / "it-reuse" / "jobs", f"rte-tiny-t5-capt-s{run.data.tags['seed']}")
                             / "result.json").read_text())
        assert run.info.status == "FINISHED" and run.data.metrics["test/score"] == pytest.approx(
            result["metrics"]["test_score"])
        logged = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "validation/score")}
        assert logged == {r["step"]: r["validation_score"] for r in result["history"]}
        assert finals[int(run.data.tags["seed"])]["validation_score"] == result["metrics"]["best_validation_score"]


def _outputs(folder: Path) -> dict[str, int]:
    """Modification times of what training writes: result.json, the artifact, the checkpoints."""
    paths = [folder / "result.json", *(folder / "artifact").rglob("*"), *(folder / "checkpoints").rglob("*")]
    return {str(p): p.stat().st_mtime_ns for p in paths if p.is_file()}


def test_a_changed_sweep_trains_afresh_and_an_unchanged_one_trains_nothing(ray_head, mlflow_server, tmp_path):
    env = _env(ray_head, RAY_ADDRESS=ray_head.address)
    jobs = tmp_path / "it-rerun" / "jobs"

    def sweep(*extra: str) -> None:
        command = [sys.executable, "pipelines/sweep.py", *SMALL, "name=it-rerun", f"storage_path={tmp_path}",
                   f"tracking.uri={mlflow_server.uri}", *extra]
        proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-4000:]

    client = _mlflow().MlflowClient(mlflow_server.uri)

    def runs() -> dict[str, object]:
        experiment = client.get_experiment_by_name("capt-it-rerun")
        return {r.info.run_id: r for r in trial_runs(client, [experiment.experiment_id])}

    sweep()
    old = _job_folder(jobs, "rte-tiny-t5-capt-s0")
    trained, first_runs = _outputs(old), runs()
    assert len(first_runs) == 1 and trained
    sweep()  # unchanged: every trial is reused
    assert _outputs(old) == trained and list(jobs.iterdir()) == [old], "nothing trained again"
    assert runs().keys() == first_runs.keys(), "no new MLflow run"

    sweep("job.optim.weight_decay=0.01")  # changed: trained afresh in its own folder, with its own run
    assert _outputs(old) == trained, "the old trial's outputs are kept"
    [new] = [folder for folder in jobs.iterdir() if folder != old]
    result = json.loads((new / "result.json").read_text())
    assert result["config"]["optim"]["weight_decay"] == 0.01 and result["steps"] == 6
    [new_run] = [r for run_id, r in runs().items() if run_id not in first_runs]
    assert new_run.info.status == "FINISHED" and new_run.data.tags["config_hash"] == result["config_hash"]
    assert new_run.data.metrics["test/score"] == pytest.approx(result["metrics"]["test_score"])
    [version] = client.search_model_versions(f"run_id='{new_run.info.run_id}'")
    assert version.tags["config_hash"] == result["config_hash"]
    [old_run] = first_runs.values()
    assert old_run.data.tags["config_hash"] == json.loads((old / "result.json").read_text())["config_hash"]


def test_results_reach_mlflow_after_an_outage(ray_head, tmp_path):
    server = LocalMlflowServer(tmp_path / "mlflow").start()
    env = _env(ray_head, RAY_ADDRESS=ray_head.address)
    command = [sys.executable, "pipelines/sweep.py", *SMALL, "name=it-outage", f"storage_path={tmp_path / 'sweeps'}",
               f"tracking.uri={server.uri}", "tracking.retry_s=2",
               "job.train.max_steps=30", "job.train.eval_every_steps=10"]  # long enough to outlive server.stop()
    driver = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    jobs = tmp_path / "sweeps" / "it-outage" / "jobs"
    deadline = time.monotonic() + 600
    while not list(jobs.glob("rte-tiny-t5-capt-s0-*/mlflow_run.json")) and driver.poll() is None \
            and time.monotonic() < deadline:
        time.sleep(0.2)
    run_file = _job_folder(jobs, "rte-tiny-t5-capt-s0") / "mlflow_run.json"
    server.stop()  # the trial keeps training while MLflow is down
    try:
        stdout, stderr = driver.communicate(timeout=900)
        assert driver.returncode == 3, "every trial trained, not everything is tracked: " + stderr[-4000:]
        assert (run_file.parent / "mlflow_pending.jsonl").is_file(), "results were kept for later"
        assert f"  {run_file.parent.name}: " in stdout and "Not fully tracked: " in stdout, stdout[-3000:]
        assert f"`python -m pipelines.tracking sync --root {jobs.parent}`" in stdout, stdout[-3000:]
    finally:
        server.start()
    sync = subprocess.run([sys.executable, "-m", "pipelines.tracking", "sync", "--root", str(tmp_path / "sweeps"),
                           "--tracking-uri", server.uri], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    try:
        assert sync.returncode == 0, sync.stderr[-3000:]
        client = _mlflow().MlflowClient(server.uri)
        runs = trial_runs(client, [client.get_experiment_by_name("capt-it-outage").experiment_id])
        assert len(runs) == 1 and runs[0].info.status == "FINISHED"
        result = json.loads((run_file.parent / "result.json").read_text())
        assert runs[0].data.metrics["test/score"] == pytest.approx(result["metrics"]["test_score"])
        assert client.search_model_versions(f"run_id='{runs[0].info.run_id}'"), "the capsule was registered"
    finally:
        server.stop()


def test_a_laptop_sweep_starts_and_stops_its_own_ray_and_mlflow(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for key in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI", "RAY_API_SERVER_ADDRESS"):
        env.pop(key, None)
    command = [sys.executable, "pipelines/sweep.py", *SMALL, "name=it-laptop", f"storage_path={tmp_path / 'sweeps'}",
               f"tracking.local_dir={tmp_path / 'mlflow'}", "--num-cpus", "2"]
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-5000:]
    assert (_job_folder(tmp_path / "sweeps" / "it-laptop" / "jobs", "rte-tiny-t5-capt-s0") / "result.json").is_file()
    assert "capt-tiny-t5-rte@champion" in proc.stdout and (tmp_path / "mlflow" / "mlflow.db").is_file()
    # Ray Train's controller reached the local state API: no teardown stall waiting for it.
    assert "Failed to stop PlacementGroupCleaner" not in output and "did not exit within" not in output


def test_a_select_sweep_reports_the_value_best_on_validation_and_only_its_test_scores(ray_head, mlflow_server,
                                                                                        tmp_path):
    """3 learning rates x 2 seeds of CaPT on tiny-t5: the results table and the report keep the lr with the
    best mean validation score (computed here from the trials' own result.json) and only its runs."""
    from pipelines.report import build_report, run_frame
    from pipelines.tracking import experiment_runs

    command = [sys.executable, "pipelines/sweep.py", *SMALL, "name=it-select", f"storage_path={tmp_path}",
               f"tracking.uri={mlflow_server.uri}", "seeds=[0,1]", "tracking.register=false",
               "select={optim.lr: [0.01, 0.1, 0.3]}"]
    proc = subprocess.run(command, cwd=ROOT, env=_env(ray_head, RAY_ADDRESS=ray_head.address), capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-4000:]
    results = [json.loads(p.read_text()) for p in (tmp_path / "it-select" / "jobs").glob("*/result.json")]
    by_lr: dict[float, list[dict]] = {}
    for result in results:
        by_lr.setdefault(result["config"]["optim"]["lr"], []).append(result)
    assert sorted(by_lr) == [0.01, 0.1, 0.3] and all(len(r) == 2 for r in by_lr.values())
    mean_validation = {lr: sum(r["metrics"]["best_validation_score"] for r in rs) / 2 for lr, rs in by_lr.items()}
    best = max(sorted(mean_validation), key=mean_validation.get)
    assert "4 trials of other values not shown" in proc.stdout
    table = [line.split() for line in proc.stdout.splitlines() if line.startswith("rte ") and line.endswith(" done")]
    assert [(row[3], row[4]) for row in table] == [(f"optim.lr={best}", "0"), (f"optim.lr={best}", "1")]

    runs = experiment_runs("capt-it-select", mlflow_server.uri)
    assert len(runs) == 6 and {r["tags"]["select"] for r in runs} == {f"optim.lr={lr}" for lr in by_lr}
    frame = run_frame(runs, "test_score")
    chosen_runs = {r["run_id"] for r in runs if r["tags"]["select"] == f"optim.lr={best}"}
    assert set(frame["run_id"]) == chosen_runs and len(chosen_runs) == 2
    text, _, _ = build_report("capt-it-select", mlflow_server.uri, tmp_path / "report")
    tests = sorted(r["metrics"]["test_score"] for r in by_lr[best])
    [row] = [line for line in text.splitlines() if line.startswith("| capt |")]
    assert f"{statistics.mean(tests):.2f} ± {statistics.stdev(tests):.2f} [optim.lr={best}]" in row
    assert "Selection on the validation split" in text
