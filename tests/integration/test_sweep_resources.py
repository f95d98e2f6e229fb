"""A sweep whose trials ask for resources the cluster cannot give: refused up front on the local Ray the sweep
starts; on a cluster, the wait is reported with its resource shape and given up on at resources.pending_timeout_s.
Both run the real entry point (`python pipelines/sweep.py`) on a real Ray."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
ONE_TRIAL = ["--config", "pipelines/configs/smoke.yaml", "tasks=[cb]", "models=[tiny-t5]", "data_source=generated",
             "tracking.enabled=false"]
PENDING_TIMEOUT_S = 10


def _sweep(tmp_path: Path, env: dict[str, str], *overrides: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "pipelines/sweep.py", *ONE_TRIAL, f"storage_path={tmp_path}", *overrides]
    return subprocess.run(command, cwd=ROOT, env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                          timeout=600)


def test_a_local_gpu_request_without_gpus_is_refused_before_any_trial(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI")}
    proc = _sweep(tmp_path, env, "resources.gpus_per_worker=1", "--num-cpus", "2")
    assert proc.returncode == 2, proc.stderr[-3000:]
    error = proc.stderr.split("error: ", 1)[1]
    assert "one trial needs {CPU: 1, GPU: 1} (1 worker(s) x {CPU: 1, GPU: 1}), but" in error
    assert "has {CPU: 2, GPU: 0}: GPU needs 1, has 0" in error
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "smoke" / "jobs").exists(), "no trial started"


def test_a_cluster_wait_is_reported_then_given_up_at_the_pending_timeout(ray_head, tmp_path):
    # A custom resource no node has: the one-worker trial asks Tune for it, and its placement group waits.
    env = {**os.environ, **ray_head.client_env(), "RAY_ADDRESS": ray_head.address}
    # The wait is reported every max(5 s, timeout / 3): 10 s leaves two or three 2-s polls between the first
    # report (5 s) and giving up.
    proc = _sweep(tmp_path, env, "resources.custom_per_worker={capt_test_accelerator: 1}",
                  f"resources.pending_timeout_s={PENDING_TIMEOUT_S}")
    assert proc.returncode == 2, proc.stderr[-3000:]
    shape = "placement group {CPU: 1, capt_test_accelerator: 1} * 1 (PACK)"
    reports = [line for line in proc.stderr.splitlines() if "WARNING" in line and shape in line]
    assert reports and f"Giving up at {PENDING_TIMEOUT_S} s" in reports[0], proc.stderr[-3000:]
    error = proc.stderr.split("error: ", 1)[1]
    assert shape in error and "scheduling state INFEASIBLE" in error and "capt_test_accelerator: 0" in error
    assert error.startswith(f"resources: gave up after resources.pending_timeout_s={PENDING_TIMEOUT_S}: ")
    assert "--resume" in error
    assert "Traceback" not in error
