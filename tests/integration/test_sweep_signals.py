"""A sweep stopped by SIGTERM ends cleanly and `--resume` finishes it: exit 143, one paragraph naming the resume
command, no stack dump, the stopped trial's run KILLED, the sweep's own MLflow server gone; the resumed sweep
trains the trial on from its checkpoint into the same run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.mlflow_runs import stopped_store_client, sweep_runs, trial_runs

from pipelines.services.reaper import REAP_ENV

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
SWEEP = ["--config", "pipelines/configs/smoke.yaml", "models=[tiny-t5]", "tasks=[rte]", "name=it-stop",
         "job.train.max_steps=40", "job.train.eval_every_steps=5", "job.task.generated_size=32",
         "job.task.max_eval_examples=8", "data_source=generated",
         "tracking.register=false"]  # what is registered is not this test's subject (a pyfunc upload per trial)


def _command(tmp_path: Path, *extra: str) -> list[str]:
    return [sys.executable, "pipelines/sweep.py", *SWEEP, f"storage_path={tmp_path / 'sweeps'}",
            f"tracking.local_dir={tmp_path / 'mlflow'}", *extra]


def _wait_for(what: str, condition, driver: subprocess.Popen, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert driver.poll() is None, f"the sweep ended before {what}: {driver.stderr.read()[-3000:]}"
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.2)


def _token_of_children(pid: int) -> str:
    """The reap token the driver's children inherited (its own /proc environ shows only what it started with)."""
    import psutil

    for child in psutil.Process(pid).children(recursive=True):
        try:
            if token := child.environ().get(REAP_ENV):
                return token
        except psutil.Error:
            continue
    raise AssertionError("no child of the driver carries the reap token")


def _marked_processes(token: str) -> list[int]:
    import psutil

    found = []
    for process in psutil.process_iter():
        try:
            if process.environ().get(REAP_ENV) == token and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process.pid)
        except psutil.Error:
            continue
    return found


def test_sigterm_stops_the_sweep_cleanly_and_resume_finishes_it_in_the_same_run(ray_head, tmp_path):
    env = {**os.environ, **ray_head.client_env(), "RAY_ADDRESS": ray_head.address, "OMP_NUM_THREADS": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    driver = subprocess.Popen(_command(tmp_path), cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    jobs = tmp_path / "sweeps" / "it-stop" / "jobs"
    _wait_for("a checkpoint", lambda: any(jobs.rglob("loop_state.json")), driver)
    token = _token_of_children(driver.pid)
    started = time.monotonic()
    driver.send_signal(signal.SIGTERM)
    stdout, stderr = driver.communicate(timeout=180)
    assert driver.returncode == 143, stderr[-3000:]
    assert "Traceback" not in stderr and "*** SIGTERM received" not in stderr, stderr[-3000:]
    assert "stopped: SIGTERM received; the trials that were running stopped and keep their last checkpoint" in stderr
    resume = f"python pipelines/sweep.py {' '.join(SWEEP[:2])} "
    assert resume in stderr and stderr.rstrip().endswith("--resume"), stderr[-1500:]
    assert not list(jobs.glob("*/result.json")), "the trial was stopped before it finished"
    time.sleep(max(0.0, 10 - (time.monotonic() - started)))
    assert _marked_processes(token) == [], "the sweep's MLflow server and its workers are gone"

    client = stopped_store_client(tmp_path / "mlflow")  # the store the sweep's own server used
    experiment = client.get_experiment_by_name("capt-it-stop")
    runs = trial_runs(client, [experiment.experiment_id])
    assert [r.info.status for r in runs] == ["KILLED"], "the stopped trial's run is not left RUNNING"
    assert [r.info.status for r in sweep_runs(client, [experiment.experiment_id])] == ["KILLED"], "the sweep's"

    try:
        resumed = subprocess.run(_command(tmp_path, "--resume"), cwd=ROOT, env=env, capture_output=True, text=True,
                                 timeout=300)
    except subprocess.TimeoutExpired as late:
        pytest.fail(f"the resumed sweep did not end within 300 s: {(late.stderr or b'')[-4000:]!r}")
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert len(list(jobs.glob("*/result.json"))) == 1
    runs = trial_runs(client, [experiment.experiment_id])
    assert [r.info.status for r in runs] == ["FINISHED"], "the resumed trial finished the run it had"
    [parent] = sweep_runs(client, [experiment.experiment_id])  # reopened, not a second one
    assert parent.info.status == "FINISHED" and runs[0].data.tags["mlflow.parentRunId"] == parent.info.run_id
