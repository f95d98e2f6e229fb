"""A packed sweep (#34, "In the sweep") on a real Ray and a real MLflow server, three seeds of one task in one pack
trial, its driver killed mid-pack, then `--resume`: each member continues from its checkpoint in its reopened run and
has its result.json, its own FINISHED run (nested under the sweep's run, with the capsule) and its row in the
summary; the same sweep again trains nothing and adds no run. Registration is off here (three pyfunc versions took
~40 s on 2 shared CPUs): members' runs register through the trial's own `RunPlan.register`
(tests/unit/pipelines/test_sweep_packs.py checks the members' plans ask for it)."""

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
from helpers.mlflow_runs import sweep_runs, trial_runs

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
STEPS = 48  # 48 epochs of one batch: long enough to kill the driver mid-pack
PACKED = ["--config", "pipelines/configs/smoke.yaml", "models=[tiny-t5]", "tasks=[rte]", "seeds=[0,1,2]",
          f"job.train.max_steps={STEPS}", "job.train.eval_every_steps=3", "job.task.generated_size=32",
          "job.task.max_eval_examples=8", "job.train.score_untrained=false", "data_source=generated",
          "pack.max_members=3", "name=it-pack", "tracking.register=false"]


def _env(ray_head) -> dict[str, str]:
    env = {**os.environ, **ray_head.client_env(), "OMP_NUM_THREADS": "1", "RAY_ADDRESS": ray_head.address}
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


def _command(uri: str, storage: Path, *extra: str) -> list[str]:
    return [sys.executable, "pipelines/sweep.py", *PACKED, f"storage_path={storage}", f"tracking.uri={uri}", *extra]


def _sweep(ray_head, uri: str, storage: Path, *extra: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(_command(uri, storage, *extra), cwd=ROOT, env=_env(ray_head), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-4000:]
    return proc


def _trained(jobs: Path) -> dict[str, int]:
    """Modification times of what training writes: every member's result.json and artifact files."""
    paths = [*jobs.glob("*/result.json"), *jobs.glob("*/artifact/*")]
    return {str(p): p.stat().st_mtime_ns for p in paths}


def _kill_mid_pack(ray_head, uri: str, storage: Path, jobs: Path) -> None:
    """Start the sweep and SIGKILL its driver once every member has validated (checkpointed) at least once."""
    driver = subprocess.Popen(_command(uri, storage), cwd=ROOT, env=_env(ray_head), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 300
    while len(list(jobs.glob("*/checkpoints/pack_member.pt"))) < 3 and driver.poll() is None \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(driver.pid, signal.SIGKILL)
    driver.wait()
    assert not list(jobs.glob("*/result.json")), "the driver must die mid-pack"


def test_a_killed_packed_sweep_resumes_each_member_and_gives_it_what_a_trial_has(ray_head, mlflow_server, tmp_path):
    """Killed mid-pack, resumed: each member continues from its checkpoint in its reopened run and ends with its
    result.json, its FINISHED run nested under the sweep's run, its capsule and its summary row; the same sweep
    again trains nothing and adds no run."""
    import mlflow

    jobs, pack = tmp_path / "it-pack" / "jobs", "pack000-tiny-t5-x3"
    _kill_mid_pack(ray_head, mlflow_server.uri, tmp_path, jobs)
    _sweep(ray_head, mlflow_server.uri, tmp_path, "--resume")
    results = {r["seed"]: r for r in (json.loads(p.read_text()) for p in jobs.glob("*/result.json"))}
    assert sorted(results) == [0, 1, 2] and all(r["steps"] == STEPS and r["pack"]["name"] == pack
                                                for r in results.values())
    client = mlflow.MlflowClient(mlflow_server.uri)
    experiment = client.get_experiment_by_name("capt-it-pack").experiment_id
    runs = trial_runs(client, [experiment])
    [parent] = sweep_runs(client, [experiment])
    assert sorted(r.info.run_name for r in runs) == [f"rte/tiny-t5/capt/s{s}" for s in (0, 1, 2)], "runs reopened"
    for run in runs:
        result = results[int(run.data.tags["seed"])]
        assert run.info.status == "FINISHED" and run.data.tags["pack"] == pack
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id, "nested under the sweep's run"
        assert run.data.tags["config_hash"] == result["config_hash"]
        assert run.data.metrics["test/score"] == pytest.approx(result["metrics"]["test_score"])
        logged = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "validation/score")}
        assert sorted(logged) == list(range(3, STEPS + 1, 3)), (
            "each validation logged once: the member continued from its checkpoint, it did not start over")
        assert logged == {r["step"]: r["validation_score"] for r in result["history"]}
        assert {"artifact/capsule.safetensors", "artifact/capsule.json"} <= {
            f.path for f in client.list_artifacts(run.info.run_id, "artifact")}
    with (tmp_path / "it-pack" / "summary.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert sorted((r["seed"], r["pack"], r["status"]) for r in rows) == [(str(s), pack, "done") for s in (0, 1, 2)]

    trained = _trained(jobs)
    again = _sweep(ray_head, mlflow_server.uri, tmp_path)
    assert _trained(jobs) == trained, "no member trained again"
    assert {r.info.run_id for r in trial_runs(client, [experiment])} == {r.info.run_id for r in runs}, "no new run"
    assert "All 3 trials reused" in again.stdout + again.stderr
