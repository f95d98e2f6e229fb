"""No secret in Ray's metadata or files, nothing open to the network: real sweeps run with a canary password
in the environment; every Ray API response and every file Ray and Tune write is searched for it; the local
Ray and MLflow listen on 127.0.0.1 only; the job API refuses requests without the token (401) and with a wrong one,
and answers the token `LocalRayHead.client_env()` names."""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest
from helpers.mlflow_runs import trial_runs
from helpers.ray_head import LocalRayHead, ray_cluster_stragglers

from pipelines.services import LocalMlflowServer
from pipelines.services.private import is_loopback, listening_sockets, open_to_the_network

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--config", "pipelines/configs/smoke.yaml", "models=[tiny-t5]", "tasks=[rte]", "job.train.max_steps=2",
         "job.train.eval_every_steps=2", "job.task.generated_size=32", "job.task.max_eval_examples=8",
         "data_source=generated", "tracking.register=false"]
# Everything the dashboard tells about jobs, actors, tasks, workers and runtime envs, in full detail.
RAY_APIS = ("/api/jobs/", "/api/v0/jobs?detail=1", "/api/v0/actors?detail=1&limit=10000",
            "/api/v0/tasks?detail=1&limit=10000", "/api/v0/workers?detail=1&limit=10000",
            "/api/v0/runtime_envs?detail=1", "/api/v0/placement_groups?detail=1", "/api/v0/nodes?detail=1")
CREDENTIALS = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")


def _canary() -> str:
    return f"canary-{secrets.token_hex(12)}"


def _get(url: str, token: str | None, basic: tuple[str, str] | None = None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if basic:
        headers = {"Authorization": "Basic " + base64.b64encode(":".join(basic).encode()).decode()}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as response:
            return response.status, response.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode("utf-8", errors="replace")


def _ray_api_answers(dashboard: str, token: str) -> dict[str, str]:
    answers = {}
    for path in RAY_APIS:
        status, body = _get(dashboard + path, token)
        assert status == 200, f"{path}: HTTP {status} {body[:300]}"
        answers[path] = body
    return answers


def _assert_the_job_api_wants_the_token(dashboard: str, token: str) -> None:
    for path in ("/api/version", "/api/jobs/", "/api/v0/actors"):
        assert _get(dashboard + path, None)[0] in (401, 403), f"{path} answered without a token"
        assert _get(dashboard + path, "not-the-token")[0] in (401, 403), f"{path} took a wrong token"
    assert _get(dashboard + "/api/version", token)[0] == 200


def _files_holding(root: Path, secret: str) -> tuple[int, list[str]]:
    """(files searched, files that contain ``secret``) under ``root``; unix sockets and the like skipped."""
    searched, holding = 0, []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            searched += 1
            if secret.encode() in path.read_bytes():
                holding.append(str(path))
    return searched, holding


class _Output:
    """The lines a subprocess writes, collected by a thread; ``wait_for`` a pattern while it runs."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process, self.lines = process, []
        threading.Thread(target=lambda: self.lines.extend(process.stdout or ()), daemon=True).start()

    def wait_for(self, pattern: str, timeout: float = 300.0) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if found := re.search(pattern, line):
                    return found
            assert self.process.poll() is None, f"exited before {pattern!r}:\n{self.text()[-5000:]}"
            time.sleep(0.5)
        raise AssertionError(f"no {pattern!r} within {timeout:.0f} s:\n{self.text()[-5000:]}")

    def text(self) -> str:
        return "".join(self.lines)


TRIAL_ACTOR = "ImplicitFunc"
"""Class of a Tune trial's actor (a one-worker trial runs its job in it, see `pipelines.sweeps.trial`)."""


def _wait_for_the_trial(dashboard: str, token: str, process: subprocess.Popen[str]) -> None:
    """Until the Tune trial's actor exists: the trial's actors and tasks are then in the state API."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and process.poll() is None:
        if TRIAL_ACTOR in _get(dashboard + "/api/v0/actors?detail=1&limit=10000", token)[1]:
            return
        time.sleep(1.0)
    raise AssertionError("no trial actor showed up in the state API while the sweep ran")


def test_a_local_sweep_keeps_the_canary_out_of_ray_and_listens_on_loopback_only(tmp_path):
    """The laptop path as `make demo` runs it (a local Ray and MLflow server of its own, the capsule registered and
    promoted): no secret reaches Ray or a file, nothing listens beyond loopback, and both stop cleanly."""
    canary = _canary()
    short_tmp = Path(tempfile.mkdtemp(prefix="capt-sec-", dir="/tmp"))  # Ray's socket paths must stay short
    token_path = short_tmp / "ray_token"
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI", "RAY_AUTH_TOKEN", "RAY_API_SERVER_ADDRESS")}
    env |= {"TMPDIR": str(short_tmp), "RAY_AUTH_TOKEN_PATH": str(token_path), "OMP_NUM_THREADS": "1",
            "MLFLOW_TRACKING_USERNAME": "capt", "MLFLOW_TRACKING_PASSWORD": canary}
    registered = [arg for arg in SMALL if arg != "tracking.register=false"]  # the laptop path registers, promotes
    command = [sys.executable, "pipelines/sweep.py", *registered, "name=it-security", f"storage_path={tmp_path}",
               f"tracking.local_dir={tmp_path / 'mlflow'}", "--num-cpus", "2"]
    process = subprocess.Popen(command, cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT)
    output = _Output(process)
    try:
        mlflow_port = int(output.wait_for(r"starting MLflow server at http://127\.0\.0\.1:(\d+)")[1])
        in_force = output.wait_for(r"Local Ray: token auth on .*job API on http://127\.0\.0\.1:(\d+);.*")
        assert "no port listens beyond 127.0.0.1" in in_force[0], in_force[0]
        dashboard = f"http://127.0.0.1:{in_force[1]}"
        assert token_path.stat().st_mode & 0o777 == 0o600
        token = token_path.read_text().strip()
        _assert_the_job_api_wants_the_token(dashboard, token)

        _wait_for_the_trial(dashboard, token, process)
        answers = _ray_api_answers(dashboard, token)
        ports = {port for _, port, _ in listening_sockets(process.pid)}
        exposed = open_to_the_network(process.pid)
        assert {int(in_force[1]), mlflow_port} <= ports, "the dashboard and MLflow must be among the listeners"
        # A one-worker trial trains in its own process without torch.distributed (whose rendezvous store binds
        # every interface): everything of Ray, MLflow and the trial must be on loopback.
        assert exposed == [], exposed
        assert process.wait(timeout=600) == 0, output.text()[-5000:]
        _assert_the_laptop_sweep_ended_cleanly(output.text(), tmp_path)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert TRIAL_ACTOR in answers["/api/v0/actors?detail=1&limit=10000"], "the trial's actors were listed"
    assert [path for path, body in answers.items() if canary in body] == []
    private_dir = short_tmp / f"capt-ray-{os.getuid()}"
    assert private_dir.stat().st_mode & 0o777 == 0o700
    for root in (private_dir, tmp_path):
        searched, holding = _files_holding(root, canary)
        assert searched > 20 and holding == [], (root, searched, holding)
    shutil.rmtree(short_tmp, ignore_errors=True)


def _assert_the_laptop_sweep_ended_cleanly(output: str, tmp_path: Path) -> None:
    """The capsule trained, was promoted on the sweep's own SQLite store, and Ray Train's controller reached the
    local state API (no teardown stall waiting for it)."""
    [result] = (tmp_path / "it-security" / "jobs").glob("rte-tiny-t5-capt-s0-*/result.json")
    assert json.loads(result.read_text())["steps"] == 2
    assert "capt-tiny-t5-rte@champion" in output and (tmp_path / "mlflow" / "mlflow.db").is_file(), output[-3000:]
    assert "Failed to stop PlacementGroupCleaner" not in output and "did not exit within" not in output


def _assert_a_user_sees_only_what_is_granted(server: LocalMlflowServer, experiment_id: str) -> None:
    """default_permission NO_PERMISSIONS: another user reads the experiment only after the admin's grant."""
    from mlflow.server import get_app_client

    admin = get_app_client("basic-auth", tracking_uri=server.uri)  # the admin's credentials from the env
    outsider = ("outsider", secrets.token_hex(8))
    admin.create_user(*outsider)
    url = f"{server.uri}/api/2.0/mlflow/experiments/get?experiment_id={experiment_id}"
    assert _get(url, None, basic=outsider)[0] == 403
    admin.grant_user_permission(outsider[0], "experiment", experiment_id, "READ")
    assert _get(url, None, basic=outsider)[0] == 200


def _head_sockets(head: LocalRayHead) -> list[tuple[str, int, str]]:
    """Listening sockets of the head's processes: its daemons share the process group of `ray start`."""
    pids = [process.pid for process in psutil.process_iter() if _group_of(process.pid) == head._pgid]
    return sorted({entry for pid in pids for entry in listening_sockets(pid)})


def _group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def test_a_sweep_on_a_ray_head_takes_credentials_from_the_nodes_not_from_job_metadata(tmp_path, monkeypatch):
    canary = _canary()  # the MLflow admin's real password: the trial logs only if its worker has it
    # The server and the head boot side by side (the server launched first: its environment has no credentials).
    server = LocalMlflowServer(tmp_path / "mlflow", basic_auth=("capt-admin", canary)).start(wait=False)
    head = None
    try:
        # The head's environment holds the credentials, as a node's does from a mounted secret.
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "capt-admin")
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", canary)
        head = LocalRayHead(num_cpus=2, auth_mode="token").start(wait=False)
        server.wait_ready()
        assert _get(f"{server.uri}/api/2.0/mlflow/experiments/search?max_results=1", None)[0] == 401
        head.wait_ready()
        client_env = {k: v for k, v in os.environ.items() if k not in (*CREDENTIALS, "RAY_ADDRESS")}
        client_env |= head.client_env() | {"OMP_NUM_THREADS": "1"}
        ray_cli = str(Path(sys.executable).with_name("ray"))
        done = subprocess.run(
            [ray_cli, "job", "submit", "--address", head.dashboard_url, "--working-dir", str(ROOT), "--",
             "python", "pipelines/sweep.py", *SMALL, "name=it-security-head", f"storage_path={tmp_path / 'sweeps'}",
             f"tracking.uri={server.uri}"],
            cwd=ROOT, env=client_env, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-3000:]
        assert head.token_path is not None and head.client_env()["RAY_AUTH_TOKEN_PATH"] == str(head.token_path)
        token = head.token_path.read_text().strip()
        assert _get(head.dashboard_url + "/api/version", None)[0] == 401, "a client without the token: 401"
        _assert_the_job_api_wants_the_token(head.dashboard_url, token)
        answers = _ray_api_answers(head.dashboard_url, token)
        sockets = _head_sockets(head)
        exposed = [entry for entry in sockets if not is_loopback(entry[0])]
        assert {head.dashboard_port, head.port} <= {port for _, port, _ in sockets}
        assert exposed == [], f"listening beyond 127.0.0.1: {exposed}"  # the trial has ended: no TCPStore
        assert "pipelines/sweep.py" in answers["/api/jobs/"], "the submitted job was listed"
        assert TRIAL_ACTOR in answers["/api/v0/actors?detail=1&limit=10000"]
        assert [path for path, body in answers.items() if canary in body] == []
        for root in (head.temp_dir, tmp_path / "sweeps"):
            searched, holding = _files_holding(root, canary)
            assert searched > 20 and holding == [], (root, searched, holding)

        import mlflow

        client = mlflow.MlflowClient(server.uri)
        experiment = client.get_experiment_by_name("capt-it-security-head")
        runs = trial_runs(client, [experiment.experiment_id])
        assert [(r.info.run_name, r.info.status) for r in runs] == [("rte/tiny-t5/capt/s0", "FINISHED")]
        _assert_a_user_sees_only_what_is_granted(server, experiment.experiment_id)
    finally:
        if head is not None:
            head.stop()
        server.stop()
    pids = ray_cluster_stragglers(head.port)
    assert not pids and not head.running, f"token-auth Ray head not fully stopped: {head.running}, {pids}"
