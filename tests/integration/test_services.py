"""Real local services: MLflow server outage and restart, Ray job submission, reachability errors."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from helpers.ray_head import LocalRayHead

from pipelines.services import (
    LocalMlflowServer,
    ServiceError,
    check_reachable,
    free_port,
    http_status,
)

pytestmark = pytest.mark.integration

MLFLOW_WHAT = "MLflow tracking server (MLFLOW_TRACKING_URI)"


def test_check_reachable_names_the_closed_address_and_the_fix() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ServiceError) as caught:
        check_reachable(url, MLFLOW_WHAT)
    message = str(caught.value)
    assert url in message and MLFLOW_WHAT in message and "ssh -N -L" in message
    assert "\n" not in message
    gcs = f"127.0.0.1:{free_port()}"
    with pytest.raises(ServiceError, match="Ray cluster"):
        check_reachable(gcs, "Ray cluster (RAY_ADDRESS)", fix="Start it with `ray start --head`.")
    with pytest.raises(ServiceError) as caught:
        check_reachable(f"postgresql://user:s3cret@127.0.0.1:{free_port()}/mlflow", "database")
    assert "s3cret" not in str(caught.value)
    check_reachable("sqlite:///nowhere.db", "backend store")  # no network location: not probed


def test_mlflow_server_refuses_a_busy_port(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        server = LocalMlflowServer(tmp_path, port=busy.getsockname()[1])
        with pytest.raises(ServiceError, match="in use"):
            server.start()
    assert not server.running


class _CrashingServer(LocalMlflowServer):
    def command(self) -> list[str]:
        return [sys.executable, "-c", "import sys; print('cannot open the database'); sys.exit(3)"]


class _SilentServer(LocalMlflowServer):
    def command(self) -> list[str]:
        return [sys.executable, "-c", "import time; time.sleep(60)"]


class _FailingHead(LocalRayHead):
    """A head whose every start fails as Ray's does when another process binds its port first."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.tried: list[tuple[int, int]] = []
        # the socket's error, and Ray 2.60's own check of the dashboard port, in turn
        self.messages = ["Failed to find a valid port for dashboard: [Errno 98] Address already in use",
                         "ValueError: Failed to bind to 127.0.0.1:27984 because it's already occupied."]

    def command(self) -> list[str]:
        self.tried.append((self.port, self.dashboard_port))
        message = self.messages[(len(self.tried) - 1) % len(self.messages)]
        return [sys.executable, "-c", f"import sys; print({message!r}); sys.exit(1)"]


def test_start_failures_raise_with_the_log_tail(tmp_path: Path) -> None:
    with pytest.raises(ServiceError, match=r"(?s)exited with code 3.*cannot open the database"):
        _CrashingServer(tmp_path / "crash").start()
    silent = _SilentServer(tmp_path / "silent", startup_timeout=1.0)
    with pytest.raises(ServiceError, match="did not answer /health within 1 s"):
        silent.start()
    assert not silent.running
    picked = _FailingHead(num_cpus=1)
    with pytest.raises(ServiceError, match=r"(?s)exit code 1.*Address already in use"):  # the third, as the first
        picked.start()
    assert len(picked.tried) == 3, "ports it picked itself are picked again, twice"
    assert len({port for ports in picked.tried for port in ports}) == 6
    assert not picked.running and picked.temp_dir is None
    chosen = _FailingHead(num_cpus=1, port=free_port(), dashboard_port=free_port())
    with pytest.raises(ServiceError, match="Address already in use"):
        chosen.start()
    assert len(chosen.tried) == 1, "ports the caller chose are never swapped"


def test_mlflow_server_keeps_runs_across_a_restart(mlflow_server: LocalMlflowServer, tmp_path: Path) -> None:
    from mlflow import MlflowClient

    assert http_status(f"{mlflow_server.uri}/health") == 200
    client = MlflowClient(tracking_uri=mlflow_server.uri, registry_uri=mlflow_server.uri)
    experiment_id = client.create_experiment(f"services-{uuid.uuid4().hex[:8]}")
    run_id = client.create_run(experiment_id, run_name="rte/t5/capt/s0").info.run_id
    client.log_param(run_id, "lr", "0.3")
    client.log_metric(run_id, "val_accuracy", 0.75, step=1)
    client.log_text(run_id, "capsule v1", "capsule/notes.txt")
    uri = mlflow_server.uri
    try:
        mlflow_server.stop()
        assert not mlflow_server.running
        with pytest.raises(ServiceError, match="MLflow tracking server"):
            check_reachable(uri, MLFLOW_WHAT)
    finally:
        mlflow_server.start()
    assert mlflow_server.uri == uri
    run = client.get_run(run_id)
    assert run.data.params == {"lr": "0.3"} and run.data.metrics == {"val_accuracy": 0.75}
    local = client.download_artifacts(run_id, "capsule/notes.txt", dst_path=str(tmp_path))
    assert Path(local).read_text() == "capsule v1"
    assert list(mlflow_server.artifacts_dir.rglob("notes.txt")), "artifacts go through the server"
    client.set_terminated(run_id)


def test_ray_job_submit_runs_on_the_local_head(ray_head: LocalRayHead) -> None:
    assert http_status(f"{ray_head.dashboard_url}/api/version") == 200
    check_reachable(ray_head.address, "Ray cluster (RAY_ADDRESS)")
    ray_cli = str(Path(sys.executable).with_name("ray"))
    entrypoint = "import ray; ray.init(); print('RESOURCES', ray.cluster_resources())"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | ray_head.client_env()
    done = subprocess.run(
        [ray_cli, "job", "submit", "--address", ray_head.dashboard_url, "--", "python", "-c", entrypoint],
        capture_output=True, text=True, timeout=240, env=env,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "RESOURCES" in output and "'CPU': 2.0" in output, output[-4000:]


RACED_LOCAL_RAY = """
import logging, socket, sys
import psutil
import pipelines.services.ray_connect as ray_connect
taken = socket.socket()
taken.bind(("127.0.0.1", 0))
taken.listen()
picks, pick_free = [taken.getsockname()[1]], ray_connect.free_port
# the race made certain: the first port picked free is taken (here by this process) before Ray binds it
ray_connect.free_port = lambda host="127.0.0.1": picks.pop() if picks else pick_free(host)
logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(levelname)s %(message)s")
with ray_connect.ray_cluster(1):
    import ray  # as a sweep does: after the local Ray's settings are in the environment

    print("cpus", ray.cluster_resources().get("CPU"))
print("gcs servers left", sum("gcs_server" in c.name() for c in psutil.Process().children(recursive=True)))
"""


def test_a_local_ray_whose_port_is_taken_while_it_starts_starts_on_another(tmp_path: Path) -> None:
    """Another process binds the dashboard port the local Ray picked before Ray does: it starts again on another
    port, and what the failed start left running (its GCS server) is stopped."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")}
    done = subprocess.run([sys.executable, "-c", RACED_LOCAL_RAY], cwd=Path(__file__).resolve().parents[2], env=env,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert any(line.startswith("WARNING Port ") and "taken while the local Ray started" in line for line in lines)
    assert "cpus 1.0" in lines and lines[-1] == "gcs servers left 0", done.stdout[-2000:]
