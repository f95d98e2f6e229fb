"""Chaos during a sweep, against a calm run of the same jobs (each alone, untracked). The process of a one-worker
trial (it runs its job in the Tune trial process) is SIGKILLed twice mid-training (Tune retries it each time, from its
checkpoint) while the MLflow server is stopped and restarted; a second sweep on the same storage is started and
refused; the driver is stopped by SIGTERM and resumed, then SIGKILLed and resumed again. The sweep must end with the
capsules of the calm run, bit for bit, one MLflow run per trial and one registry version per capsule, no trial
process outliving a killed driver by more than 10 s, the trial finished before the driver stops untouched by the
resumes, and the last driver's summary covering both trials."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from helpers.mlflow_runs import sweep_runs, trial_runs
from helpers.multinode import trainer_pid
from safetensors.torch import load_file

from pipelines.services import LocalMlflowServer
from pipelines.services.folder_lock import current_holder
from pipelines.sweeps.run import SWEEP_LOCK_FILE

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]  # two sweeps, three drivers
ROOT = Path(__file__).resolve().parents[2]
NAME = "chaos"
SEEDS = (0, 1)
SWEEP = ["--config", "pipelines/configs/smoke.yaml", "models=[tiny-t5]", "tasks=[rte]", f"seeds={list(SEEDS)}",
         f"name={NAME}", "data_source=generated", "job.task.generated_size=48", "job.task.max_eval_examples=8",
         "job.train.max_steps=120", "job.train.eval_every_steps=10", "resources.max_concurrent_trials=1",
         # Tune retries a one-worker trial (1 + 1) x (1 + 1) - 1 = 3 times: both kills are retried.
         "failure.worker_max_failures=1", "failure.trial_max_failures=1", "tracking.retry_s=2"]
TIMEOUT_S = 900


@dataclass
class Sweep:
    """One sweep driver (`python pipelines/sweep.py`) on the test's Ray head and its own MLflow server."""

    storage: Path
    server: LocalMlflowServer
    env: dict[str, str]
    driver: subprocess.Popen | None = None
    started: float = 0.0
    first_started: float = 0.0
    killed: list[dict[str, Any]] = field(default_factory=list)
    outage_felt: bool = False
    final_output: str = ""
    stopped_at: int = 0
    first_job: Path | None = None
    finished_first: dict[str, int] = field(default_factory=dict)

    @property
    def jobs(self) -> Path:
        return self.storage / NAME / "jobs"

    def command(self, *extra: str) -> list[str]:
        return [sys.executable, "pipelines/sweep.py", *SWEEP, f"storage_path={self.storage}",
                f"tracking.uri={self.server.uri}", *extra]

    def start(self, *extra: str) -> None:
        self.started = time.monotonic()
        self.first_started = self.first_started or self.started
        self.driver = subprocess.Popen(self.command(*extra), cwd=ROOT, env=self.env, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True, start_new_session=True)

    def finish(self) -> float:
        """Wait for the driver; its wall time. Fails the test with the driver's output on a non-zero exit."""
        output, _ = self.driver.communicate(timeout=TIMEOUT_S)
        wall = time.monotonic() - self.first_started
        assert self.driver.returncode == 0, output[-6000:]
        self.final_output = output
        return wall

    def stop_driver(self) -> None:
        if self.driver is not None and self.driver.poll() is None:
            os.killpg(self.driver.pid, signal.SIGKILL)
            self.driver.wait()

    def wait_for(self, what: str, probe: Callable[[], Any], timeout: float = 600) -> Any:
        """Poll `probe` until it returns a truthy value; fail if the driver ends first or time runs out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = probe()
            if value:
                return value
            if self.driver.poll() is not None:
                pytest.fail(f"the sweep ended before {what}: {self.driver.stdout.read()[-6000:]}")
            time.sleep(0.05)
        pytest.fail(f"timed out waiting for {what}")


def _checkpoint_step(job_dir: Path) -> int | None:
    """Step of the job's latest checkpoint (None while there is none or it is being replaced)."""
    try:
        return json.loads((job_dir / "checkpoints" / "latest" / "loop_state.json").read_text())["step"]
    except (OSError, ValueError, KeyError):
        return None


def _first_checkpointed_job(jobs: Path) -> Path | None:
    found = [p.parents[2] for p in jobs.glob("*/checkpoints/latest/loop_state.json")]
    return found[0] if len(found) == 1 else None


def _live_trial_processes(dashboard_url: str, exclude: set[int]) -> list[int]:
    """Pids of the alive Tune trial actors on the head (Ray's state API), without `exclude`."""
    from ray.util.state import list_actors

    actors = list_actors(address=dashboard_url, filters=[("class_name", "=", "ImplicitFunc"),
                                                          ("state", "=", "ALIVE")], raise_on_missing_output=False)
    return [a.pid for a in actors if a.pid and a.pid not in exclude and Path(f"/proc/{a.pid}").exists()]


def _spooled_during_outage(ray_temp_dir: Path, job_dir: Path) -> bool:
    """Whether a worker of the trial logged that it kept MLflow calls for later (the outage was felt)."""
    needle = f"Spooling to {job_dir.resolve()}"
    for log in (ray_temp_dir / "session_latest" / "logs").rglob("*"):
        if log.is_file() and needle in log.read_text(errors="replace"):
            return True
    return False


def _training_process(job_dir: Path, exclude: set[int]) -> int | None:
    """Pid of the live process that holds `job_dir` now (a one-worker trial trains in the Tune trial's own process),
    unless it is in `exclude`. Read from the folder's lock, not from Ray's state API: a trial of 100 tiny steps can
    end within the seconds a state API call takes on a loaded machine."""
    try:
        pid = trainer_pid(job_dir)
    except (OSError, ValueError, KeyError):
        return None
    return pid if pid not in exclude and Path(f"/proc/{pid}").exists() else None


def _kill_trial(sweep: Sweep, job_dir: Path, after_step: int) -> int:
    """SIGKILL the trial's process once a checkpoint past `after_step` exists; the killed step."""
    killed_pids = {k["pid"] for k in sweep.killed}
    worker = sweep.wait_for(f"a checkpoint after step {after_step} in {job_dir.name}, written by a live process",
                            lambda: (_checkpoint_step(job_dir) or 0) > after_step
                            and _training_process(job_dir, killed_pids))
    step = _checkpoint_step(job_dir) or after_step + 1
    assert not (job_dir / "result.json").exists(), "the trial must still be training when its worker is killed"
    os.kill(worker, signal.SIGKILL)
    sweep.killed.append({"pid": worker, "step": step})
    return step


def _outcome(jobs: Path) -> dict[tuple[str, int], dict[str, Any]]:
    """Per (task, seed): the result.json and the capsule tensors of every finished trial in the sweep's `jobs`."""
    outcome = {}
    for result_file in jobs.glob("*/result.json"):
        result = json.loads(result_file.read_text())
        artifact = Path(result["artifact_dir"])
        tensors = {f.name: load_file(str(f)) for f in sorted(artifact.glob("*.safetensors"))}
        outcome[(result["task"], result["seed"])] = {"result": result, "tensors": tensors, "dir": result_file.parent}
    return outcome


def _assert_tracked_once(server: LocalMlflowServer, outcome: dict) -> None:
    """One FINISHED run per trial, its validation curve complete, and one registry version per capsule."""
    import mlflow

    client = mlflow.MlflowClient(server.uri)
    experiment = client.get_experiment_by_name(f"capt-{NAME}")
    runs = trial_runs(client, [experiment.experiment_id])
    [parent] = sweep_runs(client, [experiment.experiment_id])  # one, however many drivers ran the sweep
    assert parent.info.status == "FINISHED" and {r.data.tags["mlflow.parentRunId"] for r in runs} == {
        parent.info.run_id}
    assert sorted(r.info.run_name for r in runs) == [f"rte/tiny-t5/capt/s{seed}" for seed in SEEDS]
    assert {r.info.status for r in runs} == {"FINISHED"}
    versions = client.search_model_versions("name='capt-tiny-t5-rte'")
    assert sorted(v.run_id for v in versions) == sorted(r.info.run_id for r in runs), "one version per capsule"
    for run in runs:
        seed = int(run.data.tags["seed"])
        result = outcome[("rte", seed)]["result"]
        logged = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "validation/score")}
        assert logged == {r["step"]: r["validation_score"] for r in result["history"]}, "no validation lost"
        assert run.data.metrics["test/score"] == result["metrics"]["test_score"]


def _env(ray_head) -> dict[str, str]:
    env = {**os.environ, **ray_head.client_env(), "OMP_NUM_THREADS": "1", "RAY_ADDRESS": ray_head.address,
           "PYTHONPATH": str(ROOT)}
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


def _tune_failures(storage: Path) -> list[int]:
    """Tune's failure count of every trial (sorted), from the experiment state the driver saved."""
    states = sorted((storage / NAME).glob("experiment_state-*.json"))
    trials = json.loads(states[-1].read_text())["trial_data"]
    return sorted(json.loads(run_metadata)["num_failures"] for _, run_metadata in trials)


def _calm_run(storage: Path) -> tuple[float, dict]:
    """The sweep's jobs undisturbed and untracked, each run alone in this process on one torch thread (a trial
    process's, `OMP_NUM_THREADS=1`): their capsules are the reference, which the tracked chaos run must match."""
    import torch

    from pipelines.config.load import validate_job_config
    from pipelines.sweeps.config import load_sweep_config, trials
    from pipelines.training.loop import run

    started, threads = time.monotonic(), torch.get_num_threads()
    sweep = load_sweep_config(ROOT / SWEEP[1], [*SWEEP[2:], f"storage_path={storage}", "tracking.enabled=false"])
    torch.set_num_threads(1)
    try:
        for trial in trials(sweep):
            run(validate_job_config(trial.job))
    finally:
        torch.set_num_threads(threads)
    return time.monotonic() - started, _outcome(storage / NAME / "jobs")


def _chaos_run(storage: Path, server: LocalMlflowServer, env: dict[str, str], dashboard_url: str,
               ray_temp_dir: Path) -> tuple[Sweep, float, dict]:
    """The same sweep with two kills of the first trial's process and an MLflow stop/restart in between, a second
    sweep started on its storage, then the driver stopped by SIGTERM and by SIGKILL during the second trial, each
    time followed by `--resume`."""
    sweep = Sweep(storage, server.wait_ready(), env)
    try:
        sweep.start()
        second_sweep = _start_a_second_sweep(sweep)  # runs while the first trial is killed
        job_dir = sweep.wait_for("the first checkpoint", lambda: _first_checkpointed_job(sweep.jobs))
        first_step = _kill_trial(sweep, job_dir, after_step=0)
        server.stop()  # MLflow goes down while Tune retries the trial
        _kill_trial(sweep, job_dir, after_step=first_step)  # resumed, then killed again
        server.start()  # back before Tune's retry of the trial finishes it
        _assert_refused(second_sweep, holder=sweep.driver.pid)
        second = sweep.wait_for("the second trial training", lambda: _training_job_besides(sweep.jobs, job_dir))
        sweep.first_job, sweep.finished_first = job_dir, _written_files(job_dir)
        _sigterm_stops_the_driver(sweep, second)
        sweep.start("--resume")
        _sigkill_leaves_no_trial_process(sweep, second, dashboard_url)
        sweep.start("--resume")
        wall = sweep.finish()
        sweep.outage_felt = _spooled_during_outage(ray_temp_dir, job_dir)
        outcome = _outcome(sweep.jobs)
        _assert_tracked_once(server, outcome)
    finally:
        sweep.stop_driver()
        server.stop()
    return sweep, wall, outcome


def _written_files(job_dir: Path) -> dict[str, int]:
    """Modification times of what a finished trial wrote: its result.json and its artifact."""
    paths = [job_dir / "result.json", *(job_dir / "artifact").rglob("*")]
    return {str(p): p.stat().st_mtime_ns for p in paths if p.is_file()}


def _assert_summary_covers_both_trials(sweep: Sweep) -> None:
    """The last driver's summary (files and printed table) has every trial, also the one finished two drivers ago."""
    folder = sweep.storage / NAME
    with (folder / "summary.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert sorted((r["seed"], r["status"], r["data"]) for r in rows) == [(str(s), "done", "generated") for s in SEEDS]
    assert all(float(r["majority"]) > 0 and r["chance"] and r["untrained"] and r["test"] for r in rows)
    table = (folder / "summary.md").read_text()
    assert all(f"| rte | tiny-t5 | capt | {seed} | generated |" in table for seed in SEEDS), table
    assert "jobs/" in (folder / "README.md").read_text()
    header = next(line for line in sweep.final_output.splitlines() if line.startswith("task "))
    assert header.split()[4:9] == ["data", "majority", "chance", "untrained", "valid"]
    assert f"Summary: {folder / 'summary.md'}" in sweep.final_output


def _training_job_besides(jobs: Path, first: Path) -> Path | None:
    """The trial other than `first` once it has a checkpoint and no result yet."""
    found = [p.parents[2] for p in jobs.glob("*/checkpoints/latest/loop_state.json") if p.parents[2] != first]
    return found[0] if len(found) == 1 and not (found[0] / "result.json").exists() else None


def _start_a_second_sweep(sweep: Sweep) -> subprocess.Popen:
    """The same sweep started again on the storage of the running one, once the first driver holds its folder
    (started together, either may win the lock: the test is of a sweep started while another runs)."""
    lock = sweep.storage / NAME / SWEEP_LOCK_FILE
    sweep.wait_for("the first driver's lock", lambda: f"pid {sweep.driver.pid} " in (current_holder(lock) or ""))
    return subprocess.Popen(sweep.command(), cwd=ROOT, env=sweep.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _assert_refused(second: subprocess.Popen, holder: int) -> None:
    """The second sweep was refused before it started anything, naming the running driver, without a traceback."""
    stdout, stderr = second.communicate(timeout=120)
    assert second.returncode == 2, stdout[-2000:] + stderr[-3000:]
    assert f"is being run by another driver (pid {holder} on " in stderr, stderr[-3000:]
    assert "Traceback" not in stderr and not stdout.strip(), stdout[-2000:] + stderr[-3000:]


def _sigterm_stops_the_driver(sweep: Sweep, job_dir: Path) -> None:
    """SIGTERM mid-trial: exit 143, no stack dump, the last words name `--resume`; the trial has not finished."""
    sweep.driver.send_signal(signal.SIGTERM)
    output, _ = sweep.driver.communicate(timeout=180)
    assert sweep.driver.returncode == 143, output[-3000:]
    stop = output[output.index("stopped: SIGTERM received"):]  # earlier tracebacks are Ray's reports of the kills
    assert "Traceback" not in stop and "*** SIGTERM received" not in output, output[-3000:]
    assert output.rstrip().endswith("--resume"), output[-1500:]
    assert not (job_dir / "result.json").exists()
    sweep.stopped_at = _checkpoint_step(job_dir) or 0


def _sigkill_leaves_no_trial_process(sweep: Sweep, job_dir: Path, dashboard_url: str) -> None:
    """Once the resumed trial checkpointed past the step it stopped at, SIGKILL the driver: within 10 s no trial
    process of the sweep is left on the cluster."""
    sweep.wait_for("a checkpoint of the resumed trial", lambda: (_checkpoint_step(job_dir) or 0) > sweep.stopped_at)
    assert not (job_dir / "result.json").exists(), "the trial must still be training when its driver is killed"
    trainer = _training_process(job_dir, set())
    os.killpg(sweep.driver.pid, signal.SIGKILL)
    sweep.driver.wait()
    deadline = time.monotonic() + 10
    while ((left := _live_trial_processes(dashboard_url, set())) or _training_process(job_dir, set())) \
            and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"trial processes {left} outlived the killed driver by 10 s"
    assert trainer is not None and not Path(f"/proc/{trainer}").exists(), f"the training process {trainer} outlived it"


def _assert_same_capsules(calm: dict, chaos: dict) -> None:
    """Same trials, results and capsule tensors (names, dtypes and every bit)."""
    assert sorted(chaos) == sorted(calm) == [("rte", seed) for seed in SEEDS]
    for key, calm_trial in calm.items():
        chaos_trial = chaos[key]
        assert chaos_trial["result"]["metrics"] == calm_trial["result"]["metrics"]
        assert chaos_trial["result"]["history"] == calm_trial["result"]["history"]
        assert set(chaos_trial["tensors"]) == set(calm_trial["tensors"]) == {"capsule.safetensors"}
        for file, tensors in calm_trial["tensors"].items():
            other = chaos_trial["tensors"][file]
            assert set(other) == set(tensors)
            for name, tensor in tensors.items():
                assert other[name].dtype == tensor.dtype and other[name].equal(tensor), f"{key} {file}:{name}"


def test_trial_and_driver_kills_and_an_mlflow_restart_leave_the_capsules_of_a_calm_run(ray_head, tmp_path,
                                                                                          monkeypatch):
    monkeypatch.setenv("RAY_AUTH_MODE", ray_head.client_env()["RAY_AUTH_MODE"])  # for the state API calls
    env = _env(ray_head)
    chaos_server = LocalMlflowServer(tmp_path / "mlflow-chaos").start(wait=False)  # boots during the calm run
    try:
        calm_wall, calm = _calm_run(tmp_path / "calm")
    except BaseException:
        chaos_server.stop()  # otherwise the chaos run stops it
        raise
    sweep, chaos_wall, chaos = _chaos_run(tmp_path / "chaos", chaos_server, env, ray_head.dashboard_url,
                                          ray_head.temp_dir)
    print(f"\ncalm jobs {calm_wall:.1f} s, chaos sweep {chaos_wall:.1f} s (three drivers); kills: {sweep.killed}")
    assert len(sweep.killed) == 2 and sweep.killed[0]["pid"] != sweep.killed[1]["pid"]
    assert sweep.outage_felt, "the retried trial spooled its MLflow calls while the server was down"
    assert _tune_failures(sweep.storage) == [0, 2], "Tune retried the killed trial twice"
    errors = [p.read_text() for p in (sweep.storage / NAME).glob("*/error.txt")]  # Tune's record of the failures
    assert len(errors) == 1 and errors[0].count("The actor died unexpectedly") == 2, errors
    # Ray names the class either bare or by its qualified name (wrap_function.<locals>.ImplicitFunc)
    dead = re.findall(r"class_name: (?:\S+\.)?(\w+)\n", errors[0])
    assert dead == ["ImplicitFunc", "ImplicitFunc"], f"the trial processes died, not Ray Train workers: {dead}"
    assert all(f"pid: {kill['pid']}" in errors[0] for kill in sweep.killed), errors
    final_rows = [line.split() for line in sweep.final_output.splitlines() if line.startswith("rte ")]
    assert len(final_rows) == len(SEEDS) and all(row[-1] == "done" for row in final_rows), sweep.final_output[-3000:]
    assert sweep.finished_first and _written_files(sweep.first_job) == sweep.finished_first, (
        "the trial finished before the driver stopped ran again after a resume")
    _assert_summary_covers_both_trials(sweep)
    _assert_same_capsules(calm, chaos)
