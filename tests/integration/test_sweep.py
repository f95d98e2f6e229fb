"""End-to-end sweeps on a real Ray head and a real MLflow server: `ray job submit`, DDP trials, the
registry and promotion, a sweep run again unchanged and changed, an MLflow outage during a trial synced later (the
sweep's own run closed by that sync, the champions promoted by the commands it prints),
and one-worker trials in a reused trial process that keeps its base model (driver kills and --resume:
test_chaos.py; the laptop path with its own Ray and MLflow: test_security.py)."""

from __future__ import annotations

import json
import os
import shlex
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
# One trial at a time, CB's first: the unchanged trial is reused before the changed one opens its run and MLflow stops.
TWO_TRIALS = ("tasks=[cb,rte]", "resources.max_concurrent_trials=1")


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
    # storage_path left at its relative default: under --working-dir it would land in Ray's copy of the folder
    proc = _submit(ray_head, *SMALL, "job.train.batch_size=-4", "job.method.options.fusion=glue",
                   "tracking.enabled=false")
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "train.batch_size=-4" in output and "fusion='glue'" in output
    assert "storage_path='outputs/sweeps' is relative" in output and "storage_path=/ABSOLUTE/FOLDER" in output
    assert "Ray's temporary copy" in output


def _job_folder(jobs: Path, trial: str) -> Path:
    """The one output folder of `trial` (its name, then a config hash)."""
    [folder] = jobs.glob(f"{trial}-*")
    return folder


def _check_one_reused_process(experiment: Path, jobs: Path, client, runs: list[dict]) -> None:
    """Trials run one at a time share one trial process: the first loads the base model, every later one finds it
    cached; each trial's last Tune result and its MLflow run hold what its result.json holds."""
    finals = [json.loads(p.read_text().splitlines()[-1]) for p in experiment.glob("*/result.json")]
    assert len({final["process_id"] for final in finals}) == 1, "Tune reused the trial process"
    assert {final["base_model_loads"] for final in finals} == {1}, "one load of the base model in the process"
    assert sorted(final["base_model_hits"] for final in finals) == list(range(len(finals))), "later trials: cached"
    assert {final["torch_threads"] for final in finals} == {1}, "as a Ray Train worker of 1 CPU"
    results = [json.loads(p.read_text()) for p in jobs.glob("*/result.json")]
    by_point = {(r["seed"], r["config"]["optim"]["lr"]): r for r in results}
    for final in finals:
        point = final["config"]["point"]
        result = by_point[(point["seed"], point["select"]["optim.lr"])]
        assert final["validation_score"] == result["metrics"]["best_validation_score"]
    by_hash = {r["config_hash"]: r for r in results}
    for run in runs:
        result = by_hash[run["tags"]["config_hash"]]
        assert run["status"] == "FINISHED" and run["metrics"]["test_score"] == pytest.approx(
            result["metrics"]["test_score"])
        logged = {m.step: m.value for m in client.get_metric_history(run["run_id"], "validation/score")}
        assert logged == {r["step"]: r["validation_score"] for r in result["history"]}


def _outputs(folder: Path) -> dict[str, int]:
    """Modification times of what training writes: result.json, the artifact, the checkpoints."""
    paths = [folder / "result.json", *(folder / "artifact").rglob("*"), *(folder / "checkpoints").rglob("*")]
    return {str(p): p.stat().st_mtime_ns for p in paths if p.is_file()}


def _start_tracked_sweep(ray_head, uri: str, tmp_path: Path, *extra: str) -> subprocess.Popen:
    command = [sys.executable, "pipelines/sweep.py", *SMALL, "name=it-rerun", f"storage_path={tmp_path / 'sweeps'}",
               f"tracking.uri={uri}", "tracking.retry_s=2", *extra]
    return subprocess.Popen(command, cwd=ROOT, env=_env(ray_head, RAY_ADDRESS=ray_head.address),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _sweep_through_an_outage(ray_head, server: LocalMlflowServer, tmp_path: Path, old: Path,
                             *extra: str) -> tuple[Path, str]:
    """Run the sweep, stopping `server` once its new trial (a folder other than `old`) has opened its run; the
    driver must end with exit 3, its results kept for later and the `sync` command named. The new trial's folder
    and what the driver printed."""
    driver = _start_tracked_sweep(ray_head, server.uri, tmp_path, *extra)
    jobs = old.parent
    deadline = time.monotonic() + 600
    while not (opened := [p.parent for p in jobs.glob("rte-tiny-t5-capt-s0-*/mlflow_run.json") if p.parent != old]) \
            and driver.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert opened, f"the changed trial opened no run: {driver.poll()=}"
    server.stop()  # the trial keeps training while MLflow is down
    try:
        stdout, stderr = driver.communicate(timeout=900)
        assert driver.returncode == 3, "every trial trained, not everything is tracked: " + stderr[-4000:]
        assert (opened[0] / "mlflow_pending.jsonl").is_file(), "results were kept for later"
        assert f"  {opened[0].name}: " in stdout and "Not fully tracked: " in stdout, stdout[-3000:]
        assert f"`python -m pipelines.tracking sync --root {jobs.parent}`" in stdout, stdout[-3000:]
    finally:
        server.start()
    return opened[0], stdout


def test_a_changed_trial_trains_afresh_an_unchanged_one_trains_nothing_and_an_outage_syncs_later(ray_head, tmp_path):
    """A sweep of two trials, then run again with one of them changed while the MLflow server goes down: the
    unchanged trial trains nothing and adds no run, the changed one trains afresh in its own folder; the driver exits
    3 and `python -m pipelines.tracking sync` later gives the new trial its FINISHED run and its registry version,
    closes the sweep's own run (left RUNNING by the outage) and prints the promote commands the sweep could not run,
    which then promote the champions."""
    server = LocalMlflowServer(tmp_path / "mlflow").start()
    try:
        _changed_unchanged_and_outage(ray_head, server, tmp_path)
    finally:
        server.stop()


def _changed_unchanged_and_outage(ray_head, server: LocalMlflowServer, tmp_path: Path) -> None:
    client = _mlflow().MlflowClient(server.uri)

    def runs() -> dict[str, object]:
        experiment = client.get_experiment_by_name("capt-it-rerun")
        return {r.info.run_id: r for r in trial_runs(client, [experiment.experiment_id])}

    jobs = tmp_path / "sweeps" / "it-rerun" / "jobs"
    driver = _start_tracked_sweep(ray_head, server.uri, tmp_path, *TWO_TRIALS)
    stdout, stderr = driver.communicate(timeout=900)
    assert driver.returncode == 0, stdout[-3000:] + stderr[-4000:]
    kept, old = _job_folder(jobs, "cb-tiny-t5-capt-s0"), _job_folder(jobs, "rte-tiny-t5-capt-s0")
    trained, first_runs = {folder: _outputs(folder) for folder in (kept, old)}, runs()
    assert len(first_runs) == 2 and all(trained.values())

    # RTE's trial changed (long enough to outlive server.stop()): trained afresh in its own folder, tracked by `sync`
    # later; CB's is unchanged: reused
    changed = ("task_overrides.rte.train.max_steps=30", "task_overrides.rte.train.eval_every_steps=10")
    new, swept = _sweep_through_an_outage(ray_head, server, tmp_path, old, *TWO_TRIALS, *changed)
    parent_id = _check_the_sweep_run_waits_for_sync(client, jobs.parent, swept, server.uri)
    sync = subprocess.run([sys.executable, "-m", "pipelines.tracking", "sync", "--root", str(tmp_path / "sweeps"),
                           "--tracking-uri", server.uri], cwd=ROOT, env=_env(ray_head), capture_output=True,
                          text=True, timeout=300)
    assert sync.returncode == 0, sync.stdout[-3000:] + sync.stderr[-3000:]
    assert {folder: _outputs(folder) for folder in (kept, old)} == trained, "nothing trained again, old outputs kept"
    assert sorted(jobs.iterdir()) == sorted([kept, old, new])
    result = json.loads((new / "result.json").read_text())
    assert result["config"]["train"]["max_steps"] == 30 and result["steps"] == 30
    [new_run] = [r for run_id, r in runs().items() if run_id not in first_runs]  # none for the unchanged trial
    assert new_run.info.status == "FINISHED" and new_run.data.tags["config_hash"] == result["config_hash"]
    assert new_run.data.metrics["test/score"] == pytest.approx(result["metrics"]["test_score"])
    [version] = client.search_model_versions(f"run_id='{new_run.info.run_id}'")
    assert version.tags["config_hash"] == result["config_hash"], "the capsule was registered by sync"
    first_hashes = sorted(json.loads((folder / "result.json").read_text())["config_hash"] for folder in (kept, old))
    assert sorted(r.data.tags["config_hash"] for r in first_runs.values()) == first_hashes
    _check_the_sync_closed_the_sweep_run_and_says_promote(client, jobs.parent, parent_id, sync.stdout, server.uri)
    assert version.tags["validation_status"] == "pending", "registered by sync, not promoted by anything yet"
    for command in [line.strip() for line in sync.stdout.splitlines() if "pipelines.promote" in line]:
        promoted = subprocess.run([sys.executable, *shlex.split(command)[1:]], cwd=ROOT, env=_env(ray_head),
                                  capture_output=True, text=True, timeout=300)
        assert promoted.returncode == 0, command + promoted.stdout[-2000:] + promoted.stderr[-2000:]
    version = client.get_model_version(version.name, version.version)
    assert version.tags["validation_status"] != "pending", "the printed command promoted the synced version too"
    champion = client.get_model_version_by_alias("capt-tiny-t5-rte", "champion")
    assert champion.tags["validation_status"] == "approved"


def _check_the_sweep_run_waits_for_sync(client, sweep_dir: Path, swept: str, uri: str) -> str:
    """The outage left the sweep's run RUNNING, its close kept in the sweep folder, and the driver said so with the
    sync and promote commands; the run's id."""
    parent_id = json.loads((sweep_dir / "mlflow_sweep_run.json").read_text())["run_id"]
    assert client.get_run(parent_id).info.status == "RUNNING"
    assert (sweep_dir / "mlflow_sweep_close.json").is_file()
    assert f"The sweep's run {parent_id} is not closed: " in swept and "server answers: the same sync." in swept
    promote = [f"  python -m pipelines.promote --model tiny-t5 --task {task} --tracking-uri {uri}"
               for task in ("cb", "rte")]
    assert all(line in swept.splitlines() for line in promote), swept[-3000:]
    return parent_id


def _check_the_sync_closed_the_sweep_run_and_says_promote(client, sweep_dir: Path, parent_id: str, synced: str,
                                                          uri: str) -> None:
    """After the trials' spools, the sync closed the sweep's run with its summary, description and counts, removed
    the kept close, and printed the promote commands for the champions the outage left unset (and the report's)."""
    parent = client.get_run(parent_id)
    assert parent.info.status == "FINISHED" and parent.data.metrics["trials/done"] == 2
    description = parent.data.tags["mlflow.note.content"]
    assert description.startswith("**No report** (the MLflow server did not answer when the sweep ended)")
    assert "# Sweep `it-rerun`: results" in description
    assert {"summary.md", "summary.csv"} <= {a.path for a in client.list_artifacts(parent_id)}
    assert not (sweep_dir / "mlflow_sweep_close.json").exists()
    lines = synced.splitlines()
    assert f"The sweep's run {parent_id} in {sweep_dir} is closed: FINISHED at {uri}, with its summary and " \
           "description." in lines, synced
    assert "Left to do: the MLflow server was down when the sweep ended, so it could not promote its champions or " \
           "build its report. Run:" in lines, synced
    for task in ("cb", "rte"):
        assert f"  python -m pipelines.promote --model tiny-t5 --task {task} --tracking-uri {uri}" in lines, synced
    report = shlex.join(["python", "-m", "pipelines.report", "--experiment", "capt-it-rerun", "--sweep", "it-rerun",
                         "--out", str(sweep_dir / "report"), "--tracking-uri", uri])
    assert f"  {report}" in lines, synced


def test_a_select_sweep_reports_the_value_best_on_validation_and_only_its_test_scores(ray_head, mlflow_server,
                                                                                        tmp_path):
    """3 learning rates x 2 seeds of CaPT on tiny-t5, one trial at a time: the results table and the report keep
    the lr with the best mean validation score (computed here from the trials' own result.json) and only its runs;
    the six trials ran in one reused trial process that loaded the base model once."""
    from pipelines.reporting import build_report, run_frame
    from pipelines.tracking import experiment_runs

    command = [sys.executable, "pipelines/sweep.py", *SMALL, "name=it-select", f"storage_path={tmp_path}",
               f"tracking.uri={mlflow_server.uri}", "seeds=[0,1]", "tracking.register=false",
               "select={optim.lr: [0.01, 0.1, 0.3]}", "resources.max_concurrent_trials=1"]
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
    assert sorted(r["run_name"] for r in runs) == sorted(  # the runs table tells the values apart by name too
        f"rte/tiny-t5/capt/s{seed}/optim.lr={lr}" for lr in by_lr for seed in (0, 1))
    frame = run_frame(runs, "test_score")
    chosen_runs = {r["run_id"] for r in runs if r["tags"]["select"] == f"optim.lr={best}"}
    assert set(frame["run_id"]) == chosen_runs and len(chosen_runs) == 2
    _check_one_reused_process(tmp_path / "it-select", tmp_path / "it-select" / "jobs",
                              _mlflow().MlflowClient(mlflow_server.uri), runs)
    text, _, _ = build_report("capt-it-select", mlflow_server.uri, tmp_path / "report")
    tests = sorted(r["metrics"]["test_score"] for r in by_lr[best])
    [row] = [line for line in text.splitlines() if line.startswith("| capt |")]
    assert f"{statistics.mean(tests):.2f} ± {statistics.stdev(tests):.2f} [optim.lr={best}]" in row
    assert "Selection on the validation split" in text


@pytest.mark.parametrize("workers", [1, 2], ids=["in-trial-process", "ray-train-workers"])
def test_a_trial_refused_by_its_own_data_is_not_retried_and_the_table_says_why(ray_head, tmp_path, workers):
    """A bad label in CB's train file (found only when the trial reads its rows): the trial is refused once, not
    retried (by Tune, nor by Ray Train for a trial of 2 workers), its row names the file, line and field, and the
    sweep exits 2."""
    data = tmp_path / "data" / "cb"
    data.mkdir(parents=True)
    rows = [json.dumps({"premise": f"p{i}", "hypothesis": f"h{i}", "label": ["entailment", "contradiction"][i % 2],
                        "idx": i}) for i in range(12)]
    rows[3] = rows[3].replace('"contradiction"', '"maybe"')
    (data / "train.jsonl").write_text("\n".join(rows) + "\n")
    (data / "val.jsonl").write_text("\n".join(rows[4:8]) + "\n")
    command = [sys.executable, "pipelines/sweep.py", *SMALL[:-1], "tasks=[cb]", "name=it-refused",
               f"storage_path={tmp_path / 'sweeps'}", "tracking.enabled=false", "failure.trial_max_failures=2",
               f"resources.num_workers={workers}", f"resources.cpus_per_worker={1 if workers == 1 else 0.9}"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env=_env(ray_head, RAY_ADDRESS=ray_head.address, CAPT_DATA_DIR=str(tmp_path / "data")))
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output[-3000:]
    assert "refused: TaskDataError:" in proc.stdout and "train.jsonl: line 4: field 'label'" in proc.stdout
    # Tune's own record, not the worker's log (whose forwarding to the driver may end before the line arrives)
    [trial_dir] = [d for d in (tmp_path / "sweeps" / "it-refused").iterdir() if (d / "result.json").exists()]
    assert not list(trial_dir.glob("error*.txt")), "refused once, never retried"
    [result] = [json.loads(line) for line in (trial_dir / "result.json").read_text().splitlines()]
    assert result["refused"].startswith("TaskDataError:")
