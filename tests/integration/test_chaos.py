"""Chaos during a sweep: the process of a one-worker trial (it runs its job in the Tune trial process)
SIGKILLed twice mid-training (Tune retries it each time, from its checkpoint) and the MLflow server stopped and
restarted. The sweep must end with the capsules of a calm run of the same sweep, bit for bit, one MLflow run per
trial and one registry version per capsule."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file

from pipelines.services import LocalMlflowServer

pytestmark = [pytest.mark.integration, pytest.mark.slow]
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
    killed: list[dict[str, Any]] = field(default_factory=list)
    outage_felt: bool = False

    @property
    def jobs(self) -> Path:
        return self.storage / NAME / "jobs"

    def start(self) -> None:
        command = [sys.executable, "pipelines/sweep.py", *SWEEP, f"storage_path={self.storage}",
                   f"tracking.uri={self.server.uri}"]
        self.started = time.monotonic()
        self.driver = subprocess.Popen(command, cwd=ROOT, env=self.env, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True, start_new_session=True)

    def finish(self) -> float:
        """Wait for the driver; its wall time. Fails the test with the driver's output on a non-zero exit."""
        output, _ = self.driver.communicate(timeout=TIMEOUT_S)
        wall = time.monotonic() - self.started
        assert self.driver.returncode == 0, output[-6000:]
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


def _kill_trial(sweep: Sweep, job_dir: Path, dashboard_url: str, after_step: int) -> int:
    """SIGKILL the trial's process once a checkpoint past `after_step` exists; the killed step."""
    sweep.wait_for(f"a checkpoint after step {after_step} in {job_dir.name}",
                   lambda: (_checkpoint_step(job_dir) or 0) > after_step)
    killed_pids = {k["pid"] for k in sweep.killed}
    workers = sweep.wait_for("a live trial process", lambda: _live_trial_processes(dashboard_url, killed_pids))
    assert len(workers) == 1, f"one trial at a time: {workers}"
    step = _checkpoint_step(job_dir) or after_step + 1
    assert not (job_dir / "result.json").exists(), "the trial must still be training when its worker is killed"
    os.kill(workers[0], signal.SIGKILL)
    sweep.killed.append({"pid": workers[0], "step": step})
    return step


def _outcome(sweep: Sweep) -> dict[tuple[str, int], dict[str, Any]]:
    """Per (task, seed): the result.json and the capsule tensors of every finished trial."""
    outcome = {}
    for result_file in sweep.jobs.glob("*/result.json"):
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
    runs = client.search_runs([experiment.experiment_id])
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


def _calm_run(storage: Path, server: LocalMlflowServer, env: dict[str, str]) -> tuple[float, dict]:
    sweep = Sweep(storage, server.start(), env)
    try:
        sweep.start()
        wall = sweep.finish()
        outcome = _outcome(sweep)
        _assert_tracked_once(server, outcome)
    finally:
        sweep.stop_driver()
        server.stop()
    return wall, outcome


def _chaos_run(storage: Path, server: LocalMlflowServer, env: dict[str, str], dashboard_url: str,
               ray_temp_dir: Path) -> tuple[Sweep, float, dict]:
    """The same sweep with two kills of one trial's process and an MLflow stop/restart in between."""
    sweep = Sweep(storage, server.start(), env)
    try:
        sweep.start()
        job_dir = sweep.wait_for("the first checkpoint", lambda: _first_checkpointed_job(sweep.jobs))
        first_step = _kill_trial(sweep, job_dir, dashboard_url, after_step=0)
        server.stop()  # MLflow goes down while Tune retries the trial
        _kill_trial(sweep, job_dir, dashboard_url, after_step=first_step)  # resumed, then killed again
        server.start()  # back before Tune's retry of the trial finishes it
        wall = sweep.finish()
        sweep.outage_felt = _spooled_during_outage(ray_temp_dir, job_dir)
        outcome = _outcome(sweep)
        _assert_tracked_once(server, outcome)
    finally:
        sweep.stop_driver()
        server.stop()
    return sweep, wall, outcome


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


def test_trial_process_kills_and_an_mlflow_restart_leave_the_capsules_of_a_calm_run(ray_head, tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_AUTH_MODE", ray_head.client_env()["RAY_AUTH_MODE"])  # for the state API calls
    env = _env(ray_head)
    calm_wall, calm = _calm_run(tmp_path / "calm", LocalMlflowServer(tmp_path / "mlflow-calm"), env)
    sweep, chaos_wall, chaos = _chaos_run(tmp_path / "chaos", LocalMlflowServer(tmp_path / "mlflow-chaos"), env,
                                          ray_head.dashboard_url, ray_head.temp_dir)
    print(f"\ncalm sweep {calm_wall:.1f} s, chaos sweep {chaos_wall:.1f} s; kills: {sweep.killed}")
    assert len(sweep.killed) == 2 and sweep.killed[0]["pid"] != sweep.killed[1]["pid"]
    assert sweep.outage_felt, "the retried trial spooled its MLflow calls while the server was down"
    assert _tune_failures(sweep.storage) == [0, 2], "Tune retried the killed trial twice"
    errors = [p.read_text() for p in (sweep.storage / NAME).glob("*/error.txt")]  # Tune's record of the failures
    assert len(errors) == 1 and errors[0].count("The actor died unexpectedly") == 2, errors
    assert errors[0].count("class_name: ImplicitFunc") == 2, "the trial processes died, not Ray Train workers"
    assert all(f"pid: {kill['pid']}" in errors[0] for kill in sweep.killed), errors
    _assert_same_capsules(calm, chaos)
