"""`python -m pipelines.serve --all` follows the registry without a restart, on a real local Ray + Serve and a real
MLflow server: a task registered with the alias after the start is served after a poll (its answers name its
version), a capsule that fails the start-up checks is skipped while the rest keep answering, a deleted registered
model's task answers 400 and leaves GET /tasks. And what listens: the start-up line lists every port of the driver
and its local Ray with its guard, and a replica's gRPC port, on every interface, refuses a call without Ray's
token from the machine's non-loopback address."""

from __future__ import annotations

import ipaddress
import json
import re
import socket
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import psutil
import pytest
from helpers.bad_inputs import entry_env
from helpers.registry import track, train_capsule
from helpers.serve_process import serve_entry_point
from mlflow import MlflowClient

from capt.tasks import generate_rows
from pipelines import promote
from pipelines.services import LOCALHOST, LocalMlflowServer, free_port

pytestmark = pytest.mark.integration

EXPERIMENT = "test-serve-registry"
MODEL = "tiny-serve-reg"  # a slug of its own: capt-tiny-serve-reg-<task>, whatever other tests register
POLL_S = 2.0
TOKEN = "registry-test-token-0123456789abcdef"


def _rows(task: str, count: int) -> list[dict[str, Any]]:
    return [{k: v for k, v in row.items() if k not in ("generated", "label", "idx")}
            for row in generate_rows(task, "val", count, seed=3)]


def _register(uri: str, result: dict[str, Any]) -> None:
    track(uri, {**result, "model_slug": MODEL}, EXPERIMENT)
    promote.promote(MODEL, result["task"], tracking_uri=uri)


@pytest.fixture(scope="module")
def registry(mlflow_server: LocalMlflowServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """RTE of tiny-t5 promoted; CB (tiny-t5) and COPA (trained on tiny-llama: another base model) trained only."""
    out = tmp_path_factory.mktemp("serve-registry-jobs")
    jobs = {"rte": train_capsule(out / "rte", "rte", 0), "cb": train_capsule(out / "cb", "cb", 0),
            "copa": train_capsule(out / "copa", "copa", 0, model="tiny-llama", max_epochs=1)}
    _register(mlflow_server.uri, jobs["rte"])
    return {"uri": mlflow_server.uri, "jobs": jobs}


def _call(url: str, body: Any = None) -> tuple[int, dict[str, Any]]:
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"}
    data = None if body is None else json.dumps(body).encode()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers), timeout=60) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.fixture(scope="module")
def server(registry: dict[str, Any], tmp_path_factory: pytest.TempPathFactory):
    """The entry point with --all (only RTE has a champion yet) on its own local Ray (token auth); (url, start-up
    line, log path); SIGINT at the end."""
    port = free_port(LOCALHOST)
    log = tmp_path_factory.mktemp("serve-registry-log") / "serve.log"
    command = [sys.executable, "-m", "pipelines.serve", "--model", MODEL, "--all", "--tracking-uri",
               registry["uri"], "--port", str(port), "--poll-s", str(POLL_S), "--num-cpus", "2"]
    with serve_entry_point(command, entry_env(CAPT_SERVE_TOKEN=TOKEN), log) as (proc, line):
        yield f"http://{LOCALHOST}:{port}/", line, log
    assert proc.returncode == 0, log.read_text()[-3000:]


def _answer_if(url: str, task: str, rows: int, wanted: Callable[[int], bool]) -> tuple[int, dict[str, Any]] | None:
    """(status, body) of a request for `task` when its status is `wanted`, else None."""
    status, body = _call(url, {"task": task, "inputs": _rows(task, rows)})
    return (status, body) if wanted(status) else None


def _until(check: Callable[[], Any], what: str, timeout: float = 90) -> Any:
    """Poll `check` until it returns something truthy (the server's poll is every POLL_S seconds)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := check():
            return found
        time.sleep(POLL_S / 2)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_task_registered_after_the_start_is_served_after_a_poll(registry: dict[str, Any], server: tuple) -> None:
    url, _, _ = server
    status, body = _call(url, {"task": "cb", "inputs": _rows("cb", 2)})
    assert status == 400 and "is not served here" in body["error"], body
    _register(registry["uri"], registry["jobs"]["cb"])
    status, body = _until(lambda: _answer_if(url, "cb", 3, lambda status: status == 200), "cb to be served")
    assert (body["model"], body["version"], len(body["labels"])) == (f"capt-{MODEL}-cb", 1, 3), body
    assert _call(url + "tasks")[1]["versions"] == {"rte": 1, "cb": 1}
    status, body = _call(url, {"task": "rte", "inputs": _rows("rte", 2)})
    assert (status, body["model"], body["version"]) == (200, f"capt-{MODEL}-rte", 1), body


def test_a_new_capsule_of_another_base_model_is_skipped_and_the_rest_keep_answering(registry: dict[str, Any],
                                                                                   server: tuple) -> None:
    url, _, log = server
    _register(registry["uri"], registry["jobs"]["copa"])  # trained on tiny-llama; this server holds tiny-t5
    _until(lambda: f"capt-{MODEL}-copa" in log.read_text(errors="replace"), "the replica's warning on copa")
    time.sleep(2 * POLL_S)  # another poll: the refused version is not fetched again, nothing else changes
    warning = [line for line in log.read_text(errors="replace").splitlines() if f"capt-{MODEL}-copa" in line]
    assert len(warning) == 1 and "is refused" in warning[0] and "tiny-llama" in warning[0], warning
    status, body = _call(url, {"task": "copa", "inputs": _rows("copa", 1)})
    assert status == 400 and "is not served here" in body["error"], body
    assert _call(url, {"task": "rte", "inputs": _rows("rte", 2)})[0] == 200
    assert set(_call(url + "tasks")[1]["tasks"]) == {"rte", "cb"}


def test_a_deleted_registered_model_is_no_longer_served(registry: dict[str, Any], server: tuple) -> None:
    url, _, _ = server
    MlflowClient(registry["uri"]).delete_registered_model(f"capt-{MODEL}-cb")
    status, body = _until(lambda: _answer_if(url, "cb", 1, lambda status: status != 200), "cb to be dropped")
    assert status == 400 and body["field"] == "task" and "is not served here" in body["error"], body
    tasks = _call(url + "tasks")[1]
    assert set(tasks["tasks"]) == {"rte"} and tasks["versions"] == {"rte": 1}, tasks
    assert _call(url, {"task": "rte", "inputs": _rows("rte", 2)})[0] == 200


def _non_loopback_address() -> str | None:
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family == socket.AF_INET and not ipaddress.ip_address(address.address).is_loopback:
                return address.address
    return None


def test_the_replicas_grpc_port_is_listed_and_refuses_a_call_without_the_ray_token(server: tuple) -> None:
    _, line, _ = server
    assert "beyond loopback: none" not in line, line
    listed = re.findall(r"\[::\]:(\d+) ray::ServeReplica:capt:capsules \(Ray token\)", line)
    assert listed, f"the start-up line does not list the replica's gRPC port on every interface: {line}"
    assert f"{LOCALHOST}:" in line and "(loopback only, serve bearer token)" in line, line
    address = _non_loopback_address()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address to call the replica's gRPC port from")
    with grpc.insecure_channel(f"{address}:{listed[0]}") as channel:
        call = channel.unary_unary("/ray.serve.ASGIService/HandleRequest", request_serializer=lambda raw: raw,
                                   response_deserializer=lambda raw: raw)
        with pytest.raises(grpc.RpcError) as refused:
            call(b"", timeout=20)
    assert refused.value.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.UNAVAILABLE), refused.value


def test_the_log_names_no_token(server: tuple) -> None:
    _, _, log = server
    assert TOKEN not in Path(log).read_text(errors="replace")
