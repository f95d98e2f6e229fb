"""Multi-node Ray on one machine for the integration tests, stopped without touching any other Ray here.

`local_cluster`: Ray's own test cluster (`ray.cluster_utils.Cluster`: a head and worker nodes, each its own
raylet with its own resources) in this process, with its own temp dir. Its `shutdown()` kills only
the processes of its nodes (unlike `AutoscalingCluster`, it never runs `ray stop --force`).

`FakeAutoscalingHead`: a head started with `ray start --head --autoscaling-config` and `RAY_FAKE_CLUSTER=1`,
whose autoscaler adds and removes worker nodes on this machine (`fake_multinode` provider). Ray 2.60's
`AutoscalingCluster` cannot be used: it reads an `example.yaml` the wheel does not ship, and its start and
shutdown run `ray stop --force`. This head is a `LocalRayHead`: stopped by its own process group and by the
processes that name its GCS port (which the autoscaler's nodes do).

What the trials did is read back from their folders: `job.lock` names the process that trained (the
job's main process), Tune's `result.json` the trial's own process; Ray's actor table gives each pid's node.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from helpers.ray_head import LocalRayHead
from pipelines.services import LOCALHOST
from pipelines.services.private import RAY_LOOPBACK_ENV
from pipelines.services.ray_connect import environ
from pipelines.sweeps.resources import TRIAL_DRIVER_RESOURCE

ROOT = Path(__file__).resolve().parents[2]


def _private_temp_dir() -> Path:
    """A short folder of its own below /tmp (Ray's unix sockets live below it: 107-byte path limit)."""
    return Path(tempfile.mkdtemp(prefix="capt-mn-", dir="/tmp" if Path("/tmp").is_dir() else None))


@contextlib.contextmanager
def local_cluster(workers: int, worker_cpus: float, head_cpus: float = 0) -> Iterator[tuple[object, dict[str, str]]]:
    """A `ray.cluster_utils.Cluster` on 127.0.0.1: yields it and the env its clients need.

    Auth is explicitly off, as for the `ray_head` fixture: the Cluster's nodes run in this process, whose
    Ray reads RAY_AUTH_MODE once, so a token mode set here later would not reach its GCS client. (Ray 2.60
    turns token auth on by itself when ~/.ray/auth_token exists; the explicit mode keeps it off.)
    `RAY_TMPDIR` points at the cluster's own folder while it runs, so the `ray_current_cluster` file the
    Cluster writes (and deletes at shutdown) is never the machine's shared one.
    """
    temp = _private_temp_dir()
    client_env = {"RAY_AUTH_MODE": "disabled", **RAY_LOOPBACK_ENV}
    from ray.cluster_utils import Cluster

    with environ(RAY_TMPDIR=str(temp), OMP_NUM_THREADS="1", **client_env):
        cluster = Cluster(shutdown_at_exit=True)
        try:
            # no dashboard: its sweeps' trials run in Tune processes, and nothing asks the state API
            cluster.add_node(num_cpus=head_cpus, node_ip_address=LOCALHOST, temp_dir=str(temp / "ray"),
                             include_dashboard=False, resources={TRIAL_DRIVER_RESOURCE: 16})
            for _ in range(workers):
                cluster.add_node(num_cpus=worker_cpus, node_ip_address=LOCALHOST)
            cluster.wait_for_nodes()
            yield cluster, {**client_env, "RAY_ADDRESS": cluster.address}
        finally:
            cluster.shutdown()
            shutil.rmtree(temp, ignore_errors=True)


def fake_autoscaling_config(gcs_port: int, worker_resources: dict[str, float], max_workers: int,
                            head_resources: dict[str, float]) -> dict:
    """The autoscaling config of a 0-CPU head and one worker type that starts at zero nodes.

    Modelled on the `fake_multi_node/example.yaml` of Ray's source tree; the provider is told the GCS
    address, else it assumes port 6379.
    """
    return {
        "cluster_name": "capt-fake", "max_workers": max_workers,
        "provider": {"type": "fake_multinode", "use_node_id_as_ip": True, "disable_node_updaters": True,
                     "disable_launch_config_check": True, "gcs_address": f"{LOCALHOST}:{gcs_port}"},
        "available_node_types": {
            "ray.head.default": {"resources": head_resources, "node_config": {}, "max_workers": 0},
            "ray.worker.gpu": {"resources": {**worker_resources, "object_store_memory": 100 * 1024 * 1024},
                               "node_config": {}, "min_workers": 0, "max_workers": max_workers},
        },
        "head_node_type": "ray.head.default", "auth": {}, "upscaling_speed": 1.0,
        "idle_timeout_minutes": 1, "docker": {}, "initialization_commands": [], "setup_commands": [],
        "head_setup_commands": [], "worker_setup_commands": [], "head_start_ray_commands": [],
        "worker_start_ray_commands": [], "file_mounts": {}, "cluster_synced_files": [],
        "file_mounts_sync_continuously": False, "rsync_exclude": [], "rsync_filter": [],
    }


class FakeAutoscalingHead(LocalRayHead):
    """A 0-CPU head whose autoscaler (fake_multinode provider) adds worker nodes of one type on demand."""

    def __init__(self, worker_resources: dict[str, float], max_workers: int) -> None:
        super().__init__(num_cpus=0, auth_mode="token", include_dashboard=False)  # its trials run in Tune processes
        self.head_resources = {TRIAL_DRIVER_RESOURCE: 16}
        self.config_dir = _private_temp_dir()
        self.config_path = self.config_dir / "autoscaling.json"
        config = fake_autoscaling_config(self.port, worker_resources, max_workers,
                                         {"CPU": 0, **self.head_resources})
        self.config_path.write_text(json.dumps(config))

    def command(self) -> list[str]:
        return [*super().command(), f"--autoscaling-config={self.config_path}",
                f"--resources={json.dumps(self.head_resources)}"]

    def start(self, wait: bool = True) -> FakeAutoscalingHead:
        # The monitor (autoscaler) and the nodes it starts inherit these from `ray start`.
        with environ(RAY_FAKE_CLUSTER="1", AUTOSCALER_UPDATE_INTERVAL_S="1", OMP_NUM_THREADS="1"):
            return super().start(wait)

    def stop(self, grace: float = 2.0) -> None:
        super().stop(grace)
        shutil.rmtree(self.config_dir, ignore_errors=True)


_DUMP = """
import json, os, ray
ray.init(address=os.environ["RAY_ADDRESS"], logging_level="ERROR")
from ray._private import state
actors = [{"pid": a["Pid"], "node": a["Address"]["NodeID"], "class": a["ActorClassName"], "state": a["State"]}
          for a in state.actors().values()]
nodes = [{"node": n["NodeID"], "alive": n["Alive"], "resources": n["Resources"]} for n in ray.nodes()]
print("CAPT-DUMP " + json.dumps({"actors": actors, "nodes": nodes}))
"""


def cluster_records(env: dict[str, str]) -> dict:
    """Every actor (pid, node, class, state) and node (alive, resources) the cluster at RAY_ADDRESS has known."""
    proc = subprocess.run([sys.executable, "-c", _DUMP], env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    for line in proc.stdout.splitlines():
        if line.startswith("CAPT-DUMP "):
            return json.loads(line.removeprefix("CAPT-DUMP "))
    raise AssertionError(f"could not read the cluster's actors: {proc.stdout[-2000:]}{proc.stderr[-3000:]}")


def node_running(cluster, pid: int) -> object | None:
    """The node of `cluster` where the live actor process `pid` runs (None if no live actor has that pid).

    Asked of the GCS: Ray renames its worker processes (setproctitle), so their command lines say nothing."""
    for actor in cluster.global_state.actor_table(None).values():
        if actor["Pid"] == pid and actor["State"] == "ALIVE":
            return next((n for n in cluster.list_all_nodes() if n.node_id == actor["Address"]["NodeID"]), None)
    return None


def job_folder(jobs: Path, trial: str) -> Path:
    """The one config-keyed output folder of `trial` (its name, then a config hash)."""
    [folder] = jobs.glob(f"{trial}-*")
    return folder


def trainer_pid(job_dir: Path) -> int:
    """Pid of the process that last held the job folder: the job's main process."""
    return json.loads((job_dir / "job.lock").read_text())["pid"]


def trial_pid(trial_dir: Path) -> int:
    """Pid of the Tune trial's own process (Tune writes it into every result)."""
    lines = (trial_dir / "result.json").read_text().splitlines()
    return json.loads(lines[-1])["pid"]


def training_interval(job_dir: Path) -> tuple[float, float]:
    """When the job claimed its folder and when it wrote its result (file modification times)."""
    return (job_dir / "job_config.json").stat().st_mtime, (job_dir / "result.json").stat().st_mtime


def peak_overlap(intervals: list[tuple[float, float]]) -> int:
    """The most intervals open at one instant."""
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals],
                    key=lambda e: (e[0], e[1]))
    peak = current = 0
    for _, step in events:
        current += step
        peak = max(peak, current)
    return peak


def sweep_command(*overrides: str) -> list[str]:
    """`python pipelines/sweep.py` on the smoke config with `overrides` (RAY_ADDRESS in the env: no local Ray)."""
    return [sys.executable, "pipelines/sweep.py", "--config", "pipelines/configs/smoke.yaml", *overrides]
