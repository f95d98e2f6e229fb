"""Where a multi-worker trial's driver runs, on a real two-node Ray: a 0-CPU head that declares
`capt_trial_driver` (as both cluster files' heads do) and one 2-CPU worker node. Trials of 2 workers x 1 CPU
fit the worker node only if their drivers stay off it: with a driver asking 0.1 CPU (what a head without the
resource gets) the driver takes a slice of the worker node and its own workers wait forever. One trial shows it (a
second, after the first, would only wait for the first's placement group to be freed)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from pipelines.services import LOCALHOST, free_port
from pipelines.services.private import RAY_LOOPBACK_ENV
from pipelines.sweeps.resources import TRIAL_DRIVER_RESOURCE

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def head_and_worker(monkeypatch):
    """The two nodes (this test's own processes, stopped by their handles, never `ray stop`) and the
    dashboard URL Ray Train's state API calls need."""
    for name, value in RAY_LOOPBACK_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    from ray.cluster_utils import Cluster

    port, temp_dir = free_port(LOCALHOST), tempfile.mkdtemp(prefix="capt-place-")  # short: socket paths
    # Cluster() writes (and at shutdown deletes) `ray_current_cluster` in RAY_TMPDIR whatever temp_dir says: ours,
    # never the machine's shared /tmp/ray (as helpers.multinode.local_cluster does).
    monkeypatch.setenv("RAY_TMPDIR", temp_dir)
    node = {"node_ip_address": LOCALHOST, "temp_dir": os.path.join(temp_dir, "ray")}  # RAY_TMPDIR's own layout
    cluster = Cluster(initialize_head=True, shutdown_at_exit=False, head_node_args={
        "num_cpus": 0, "resources": {TRIAL_DRIVER_RESOURCE: 4}, "include_dashboard": True,
        "dashboard_host": LOCALHOST, "dashboard_port": port, **node})
    try:
        cluster.add_node(num_cpus=2, **node)
        yield cluster.address, f"http://{LOCALHOST}:{port}"
    finally:
        cluster.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_two_worker_trials_fit_a_worker_node_with_their_drivers_on_the_head(head_and_worker, tmp_path):
    address, dashboard = head_and_worker
    env = {**os.environ, "RAY_ADDRESS": address, "RAY_API_SERVER_ADDRESS": dashboard, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "pipelines/sweep.py", "--config", "pipelines/configs/smoke.yaml", "tasks=[cb]",
               "models=[tiny-t5]", "data_source=generated", "tracking.enabled=false", "seeds=[0]",
               f"storage_path={tmp_path}", "resources.num_workers=2", "resources.cpus_per_worker=1",
               "resources.pending_timeout_s=240", "job.train.max_steps=4"]
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("cb ")]
    assert len(rows) == 1 and rows[0].endswith("done"), proc.stdout[-2000:]
