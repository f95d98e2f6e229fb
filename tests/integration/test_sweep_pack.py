"""A packed sweep (#34, "In the sweep") stopped by SIGTERM mid-pack, then `--resume`, on a real Ray with the sweep's own
MLflow server (`tracking.local_dir`, as on a laptop). The stop ends cleanly: exit 143, one paragraph naming the resume
command, no stack dump, every member's run and the sweep's run KILLED, the sweep's MLflow server and workers gone
within 10 s. The resumed sweep continues each member from its checkpoint in its reopened run: each ends with its
result.json, its own FINISHED run (nested under the sweep's run, with the capsule) and its summary row; the same sweep
again trains nothing and adds no run. Registration is off here (three pyfunc versions took ~40 s on 2 shared CPUs):
members' runs register through the trial's own `RunPlan.register` (tests/unit/pipelines/test_sweep_packs.py checks
the members' plans ask for it; tests/integration/test_pack_registry.py registers two members on a real server). A
driver SIGKILLed and resumed: tests/integration/test_chaos.py."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.mlflow_runs import stopped_store_client, sweep_runs, trial_runs

from pipelines.services.reaper import REAP_ENV
from pipelines.sweeps.config import TUNED_HEAP_ENV

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
# 300 epochs of one batch, validated every 12: Tune's stop reaches the pack a second or two after the signal, and a
# pack this long is still training then (its members checkpoint at step 12; the rest takes about 10 s on a quiet
# 2-CPU machine, longer under load)
STEPS, EVERY = 300, 12
PACKED = ["--config", "pipelines/configs/smoke.yaml", "models=[tiny-t5]", "tasks=[rte]", "seeds=[0,1,2]",
          f"job.train.max_steps={STEPS}", f"job.train.max_epochs={STEPS}", f"job.train.eval_every_steps={EVERY}",
          "job.task.generated_size=32",
          "job.task.max_eval_examples=8", "job.train.score_untrained=false", "data_source=generated",
          "pack.max_members=3", "name=it-pack", "tracking.register=false"]
PACK = "pack000-tiny-t5-x3"


def _env(ray_head) -> dict[str, str]:
    env = {**os.environ, **ray_head.client_env(), "OMP_NUM_THREADS": "1", "RAY_ADDRESS": ray_head.address}
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


def _command(tmp_path: Path, *extra: str) -> list[str]:
    return [sys.executable, "pipelines/sweep.py", *PACKED, f"storage_path={tmp_path / 'sweeps'}",
            f"tracking.local_dir={tmp_path / 'mlflow'}", *extra]


def _sweep(ray_head, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(_command(tmp_path, *extra), cwd=ROOT, env=_env(ray_head), capture_output=True,
                              text=True, timeout=600)
    except subprocess.TimeoutExpired as late:
        pytest.fail(f"the sweep did not end within 600 s: {(late.stderr or b'')[-4000:]!r}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-4000:]
    return proc


def _trained(jobs: Path) -> dict[str, int]:
    """Modification times of what training writes: every member's result.json and artifact files."""
    paths = [*jobs.glob("*/result.json"), *jobs.glob("*/artifact/*")]
    return {str(p): p.stat().st_mtime_ns for p in paths}


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


def _stop_mid_pack(ray_head, tmp_path: Path, jobs: Path) -> None:
    """Start the sweep and SIGTERM its driver once every member has validated (checkpointed) at least once: a clean
    stop in one paragraph, nothing of the sweep left running 10 s later."""
    driver = subprocess.Popen(_command(tmp_path), cwd=ROOT, env=_env(ray_head), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while len(list(jobs.glob("*/checkpoints/pack_member.pt"))) < 3:
        assert driver.poll() is None, (
            f"the sweep ended before every member checkpointed: {driver.stderr.read()[-3000:]}")
        assert time.monotonic() < deadline, "no checkpoint of every member within 300 s"
        time.sleep(0.05)
    token = _token_of_children(driver.pid)
    started = time.monotonic()
    driver.send_signal(signal.SIGTERM)
    stdout, stderr = driver.communicate(timeout=180)
    assert driver.returncode == 143, stderr[-3000:]
    assert "Traceback" not in stderr and "*** SIGTERM received" not in stderr, stderr[-3000:]
    assert "stopped: SIGTERM received; the trials that were running stopped and keep their last checkpoint" in stderr
    resume = f"python pipelines/sweep.py {' '.join(PACKED[:2])} "
    assert resume in stderr and stderr.rstrip().endswith("--resume"), stderr[-1500:]
    assert not list(jobs.glob("*/result.json")), "the driver must stop mid-pack"
    while _marked_processes(token) and time.monotonic() - started < 10:
        time.sleep(0.2)
    assert _marked_processes(token) == [], "the sweep's MLflow server and its workers are gone within 10 s"


def _assert_each_member_has_what_a_trial_has(store: Path, experiment: str, results: dict[int, dict]) -> list:
    """Every member's run FINISHED, nested under the sweep's run, each validation logged once, with its capsule
    (the uploaded files, read from the stopped server's artifact folder, are the member's own)."""
    client = stopped_store_client(store)
    runs = trial_runs(client, [experiment])
    [parent] = sweep_runs(client, [experiment])
    assert parent.info.status == "FINISHED", "the sweep's run was reopened and ended, not a second one"
    assert sorted(r.info.run_name for r in runs) == [f"rte/tiny-t5/capt/s{s}" for s in (0, 1, 2)], "runs reopened"
    for run in runs:
        result = results[int(run.data.tags["seed"])]
        assert run.info.status == "FINISHED" and run.data.tags["pack"] == PACK
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id, "nested under the sweep's run"
        assert run.data.tags["config_hash"] == result["config_hash"]
        assert run.data.metrics["test/score"] == pytest.approx(result["metrics"]["test_score"])
        logged = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "validation/score")}
        assert sorted(logged) == list(range(EVERY, STEPS + 1, EVERY)), (
            "each validation logged: the member continued from its checkpoint, it did not start over")
        assert logged == {r["step"]: r["validation_score"] for r in result["history"]}
        uploaded = store / "artifacts" / experiment / run.info.run_id / "artifacts" / "artifact"
        for name in ("capsule.safetensors", "capsule.json"):
            assert (uploaded / name).read_bytes() == (Path(result["artifact_dir"]) / name).read_bytes(), name
    return runs


def test_a_packed_sweep_stopped_by_sigterm_resumes_each_member_and_gives_it_what_a_trial_has(ray_head, tmp_path):
    jobs = tmp_path / "sweeps" / "it-pack" / "jobs"
    _stop_mid_pack(ray_head, tmp_path, jobs)
    client = stopped_store_client(tmp_path / "mlflow")  # the store the sweep's own server used
    experiment = client.get_experiment_by_name("capt-it-pack").experiment_id
    assert [r.info.status for r in trial_runs(client, [experiment])] == ["KILLED"] * 3, "no run left RUNNING"
    assert [r.info.status for r in sweep_runs(client, [experiment])] == ["KILLED"], "the sweep's run"

    _sweep(ray_head, tmp_path, "--resume")
    results = {r["seed"]: r for r in (json.loads(p.read_text()) for p in jobs.glob("*/result.json"))}
    assert sorted(results) == [0, 1, 2] and all(r["steps"] == STEPS and r["pack"]["name"] == PACK
                                                for r in results.values())
    # the trial process started with the pack's glibc heap (a runtime_env on the cluster's workers)
    assert all(r["pack"]["heap"] == TUNED_HEAP_ENV for r in results.values()), results[0]["pack"]
    runs = _assert_each_member_has_what_a_trial_has(tmp_path / "mlflow", experiment, results)
    with (tmp_path / "sweeps" / "it-pack" / "summary.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert sorted((r["seed"], r["pack"], r["status"]) for r in rows) == [(str(s), PACK, "done") for s in (0, 1, 2)]

    trained = _trained(jobs)
    again = _sweep(ray_head, tmp_path)
    assert _trained(jobs) == trained, "no member trained again"
    assert {r.info.run_id for r in trial_runs(stopped_store_client(tmp_path / "mlflow"), [experiment])} == {
        r.info.run_id for r in runs}, "no new run"
    assert "All 3 trials reused" in again.stdout + again.stderr
