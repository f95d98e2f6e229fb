"""`python -m pipelines.serve --all` on a real local Ray + Serve and a real MLflow server, one server for the module:
mixed-task requests answer what each task's registry pyfunc answers, bad requests get 4xx, the start-up line names
the generated token file (mode 600) and requests need that token, and the entry point refuses a bad command line
with one paragraph. It follows the registry without a restart: a moved alias is served after a poll, a task
registered with the alias after the start is served (its answers name its version), a capsule that fails the
start-up checks is skipped while the rest keep answering, a deleted registered model's task answers 400 and leaves
GET /tasks. And what listens: the start-up line is one short line, --debug logs every port of the driver and its local
Ray with its guard, and a replica's gRPC port, on every interface, refuses a call without Ray's token from the
machine's non-loopback address."""

from __future__ import annotations

import ipaddress
import json
import os
import re
import socket
import stat
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import mlflow
import pandas as pd
import psutil
import pytest
from helpers.bad_inputs import entry_env
from helpers.registry import track, train_capsule
from helpers.serve_process import serve_entry_point
from mlflow import MlflowClient

from capt.tasks import generate_rows
from pipelines import promote, serve
from pipelines.services import LOCALHOST, LocalMlflowServer, free_port
from pipelines.serving.exposure import head_flood

pytestmark = pytest.mark.integration

EXPERIMENT = "test-serve"
MODEL = "tiny-serve"  # a slug of its own: capt-tiny-serve-<task>, whatever other tests register
POLL_S = 2.0
MAX_ROWS = 8


def _rows(task: str, count: int, seed: int) -> list[dict[str, Any]]:
    return [{k: v for k, v in row.items() if k not in ("generated", "label", "idx")}
            for row in generate_rows(task, "val", count, seed=seed)]


def _register(uri: str, result: dict[str, Any]) -> None:
    track(uri, {**result, "model_slug": MODEL}, EXPERIMENT)
    promote.promote(MODEL, result["task"], tracking_uri=uri)


@pytest.fixture(scope="module")
def registry(mlflow_server: LocalMlflowServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """RTE (two versions: the champion, and one to move the alias to) and CB of tiny-t5, promoted; WiC (tiny-t5)
    and COPA (trained on tiny-llama: another base model) trained only, registered by the tests after the start."""
    out = tmp_path_factory.mktemp("serve-jobs")
    jobs = {(task, seed): train_capsule(out / f"{task}{seed}", task, seed) for task, seed in
            (("rte", 0), ("cb", 0), ("rte", 1), ("wic", 0))}
    jobs["copa", 0] = train_capsule(out / "copa", "copa", 0, model="tiny-llama", max_epochs=1)
    for task in ("rte", "cb"):
        _register(mlflow_server.uri, jobs[task, 0])
    return {"uri": mlflow_server.uri, "jobs": jobs}


TOKEN: dict[str, str] = {}
"""The bearer token the server generated (read from the file its start-up line names)."""


def _headers() -> dict[str, str]:
    return {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN.get('token', '')}"}


def _post(url: str, body: Any) -> tuple[int, dict[str, Any]]:
    data = json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers=_headers())
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _get(url: str) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=_headers()), timeout=5) as response:
            return json.loads(response.read())
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


@dataclass(frozen=True)
class Server:
    """The running entry point: its URL, its start-up line and its log."""

    url: str
    line: str
    log: Path


@pytest.fixture(scope="module")
def server(registry: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The entry point as a real process serving every task with a champion (rte, cb at the start) on its own local
    Ray (token auth), Serve on 127.0.0.1:<free port>, with a token it generates (read into TOKEN); SIGINT at the
    end."""
    port = free_port(LOCALHOST)
    log = tmp_path_factory.mktemp("serve-log") / "serve.log"
    command = [sys.executable, "-m", "pipelines.serve", "--model", MODEL, "--all", "--tracking-uri",
               registry["uri"], "--port", str(port), "--poll-s", str(POLL_S), "--max-rows", str(MAX_ROWS),
               "--num-cpus", "2", "--debug"]  # --debug: the listening ports, logged at debug level
    env = {k: v for k, v in entry_env().items() if k != "CAPT_SERVE_TOKEN"}
    url = f"http://{LOCALHOST}:{port}/"
    with serve_entry_point(command, env, log) as (proc, line):
        token_file = re.search(r"token in (\S+) \(mode 600, generated now\)", line)
        assert token_file, line
        assert stat.S_IMODE(os.stat(token_file.group(1)).st_mode) == 0o600
        TOKEN["token"] = Path(token_file.group(1)).read_text().strip()
        assert _get(url + "health") == {"status": "ok"}
        yield Server(url, line, log)
    assert proc.returncode == 0, log.read_text()[-3000:]
    assert _get(url + "health") is None


def _pyfunc_labels(uri: str, name: str, rows: list[dict[str, Any]], ref: str = "champion") -> list[str]:
    mlflow.set_tracking_uri(uri)
    return list(mlflow.pyfunc.load_model(f"models:/{name}@{ref}").predict(pd.DataFrame(rows)))


def test_mixed_task_requests_answer_as_each_task_pyfunc(registry: dict[str, Any], server: Server) -> None:
    rows = {"rte": _rows("rte", 6, seed=5), "cb": _rows("cb", 6, seed=6)}
    requests = [("rte", rows["rte"][:3]), ("cb", rows["cb"][:4]), ("rte", rows["rte"][3:]), ("cb", rows["cb"][4:])]
    with ThreadPoolExecutor(len(requests)) as pool:  # at once, so that Serve batches them together
        answers = list(pool.map(lambda r: _post(server.url, {"task": r[0], "inputs": r[1]}), requests))
    assert all(status == 200 for status, _ in answers), answers
    for task in ("rte", "cb"):
        served = [label for (t, _), (_, body) in zip(requests, answers, strict=True) if t == task
                  for label in body["labels"]]
        assert served == _pyfunc_labels(registry["uri"], f"capt-{MODEL}-{task}", rows[task])
    body = answers[1][1]
    assert (body["model"], body["version"], body["label_names"]) == (
        f"capt-{MODEL}-cb", 1, ["entailment", "contradiction", "neutral"])
    assert len(body["scores"]) == 4 and all(len(s) == 3 for s in body["scores"])


@pytest.mark.parametrize(("body", "status", "phrase"), [
    ({"task": "boolq", "inputs": [{"question": "q", "passage": "p"}]}, 400, "task='boolq' is not served here"),
    ({"task": "rte", "inputs": [{"premise": "A cat sat."}]}, 400, "field 'hypothesis': missing field"),
    ({"inputs": [{"premise": "a", "hypothesis": "b"}]}, 400, "The field 'task' is missing"),
    ({"task": "rte", "inputs": [{"premise": "a", "hypothesis": "b"}] * (MAX_ROWS + 1)}, 413, f"at most {MAX_ROWS}"),
], ids=["unknown-task", "missing-field", "no-task", "oversized"])
def test_bad_requests_get_4xx_with_a_clear_message(server: Server, body: Any, status: int, phrase: str) -> None:
    got, answer = _post(server.url, body)
    assert (got, phrase in answer["error"]) == (status, True), answer


def test_requests_without_the_generated_token_get_401(server: Server) -> None:
    request = urllib.request.Request(server.url, data=b'{"task": "rte", "inputs": []}',
                                     headers={"Authorization": "Bearer x"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 401 and json.loads(refused.value.read())["field"] == "Authorization"


def test_a_moved_alias_is_served_without_a_restart(registry: dict[str, Any], server: Server) -> None:
    uri, name = registry["uri"], f"capt-{MODEL}-rte"
    digests = {key: job["artifact_digest"] for key, job in registry["jobs"].items()}
    tasks = _get(server.url + "tasks")["tasks"]  # each version's artifact digest, as verified when it was fetched
    assert (tasks["rte"]["digest"], tasks["cb"]["digest"]) == (digests["rte", 0], digests["cb", 0])
    assert digests["rte", 0] != digests["rte", 1]
    track(uri, {**registry["jobs"]["rte", 1], "model_slug": MODEL}, EXPERIMENT)
    MlflowClient(uri).set_registered_model_alias(name, "champion", "2")
    rows = _rows("rte", 4, seed=7)
    deadline, versions = time.monotonic() + 120, []
    while time.monotonic() < deadline:  # every request is answered, by the old version or the new one
        status, body = _post(server.url, {"task": "rte", "inputs": rows})
        assert status == 200, body
        versions.append(body["version"])
        if body["version"] == 2:
            break
        time.sleep(POLL_S / 4)
    assert versions[-1] == 2 and set(versions) <= {1, 2}, versions
    assert body["labels"] == _pyfunc_labels(uri, name, rows)
    after = _get(server.url + "tasks")
    assert after["versions"] == {"rte": 2, "cb": 1} and after["tasks"]["rte"]["digest"] == digests["rte", 1]


@pytest.mark.parametrize(("args", "phrase"), [
    (["--model", "no-such-model", "--tasks", "rte"], "no capsule of this base model is registered"),
    (["--model", MODEL, "--tasks", "boolq"], "for task 'boolq' is registered"),
    (["--model", MODEL, "--tasks", "rte", "--alias", "nobody"], "has no version with this alias"),
], ids=["unknown-model", "unregistered-task", "no-version-at-alias"])  # unknown task names: test_serving_http
def test_the_entry_point_refuses_bad_input_in_one_paragraph(registry: dict[str, Any], args: list[str], phrase: str,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert serve.main([*args, "--tracking-uri", registry["uri"], "--port", str(free_port(LOCALHOST))]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"Tracking store: {registry['uri']} (from --tracking-uri)\nerror: "), err
    assert phrase in err and "Traceback" not in err, err


def test_an_unreachable_mlflow_is_one_paragraph(capsys: pytest.CaptureFixture[str]) -> None:
    closed = f"http://{LOCALHOST}:{free_port(LOCALHOST)}"
    assert serve.main(["--model", MODEL, "--tasks", "rte", "--tracking-uri", closed]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and closed in err and "Traceback" not in err, err


def _answer_if(url: str, task: str, rows: int, wanted: Callable[[int], bool]) -> tuple[int, dict[str, Any]] | None:
    """(status, body) of a request for `task` when its status is `wanted`, else None."""
    status, body = _post(url, {"task": task, "inputs": _rows(task, rows, seed=3)})
    return (status, body) if wanted(status) else None


def _until(check: Callable[[], Any], what: str, timeout: float = 90) -> Any:
    """Poll `check` until it returns something truthy (the server's poll is every POLL_S seconds)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := check():
            return found
        time.sleep(POLL_S / 2)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_task_registered_after_the_start_is_served_after_a_poll(registry: dict[str, Any], server: Server) -> None:
    url = server.url
    status, body = _post(url, {"task": "wic", "inputs": _rows("wic", 2, seed=3)})
    assert status == 400 and "is not served here" in body["error"], body
    _register(registry["uri"], registry["jobs"]["wic", 0])
    status, body = _until(lambda: _answer_if(url, "wic", 3, lambda status: status == 200), "wic to be served")
    assert (body["model"], body["version"], len(body["labels"])) == (f"capt-{MODEL}-wic", 1, 3), body
    versions = _get(url + "tasks")["versions"]
    assert set(versions) == {"rte", "cb", "wic"} and versions["wic"] == 1, versions
    status, body = _post(url, {"task": "rte", "inputs": _rows("rte", 2, seed=3)})
    assert (status, body["model"], body["version"]) == (200, f"capt-{MODEL}-rte", versions["rte"]), body


def test_a_new_capsule_of_another_base_model_is_skipped_and_the_rest_keep_answering(registry: dict[str, Any],
                                                                                   server: Server) -> None:
    url, log = server.url, server.log
    _register(registry["uri"], registry["jobs"]["copa", 0])  # trained on tiny-llama; this server holds tiny-t5
    _until(lambda: f"capt-{MODEL}-copa" in log.read_text(errors="replace"), "the replica's warning on copa")
    time.sleep(2 * POLL_S)  # another poll: the refused version is checked again, not warned about again
    warning = [line for line in log.read_text(errors="replace").splitlines() if f"capt-{MODEL}-copa" in line]
    assert len(warning) == 1 and "is refused" in warning[0] and "tiny-llama" in warning[0], warning
    status, body = _post(url, {"task": "copa", "inputs": _rows("copa", 1, seed=3)})
    assert status == 400 and "is not served here" in body["error"], body
    assert _post(url, {"task": "rte", "inputs": _rows("rte", 2, seed=3)})[0] == 200
    assert "copa" not in _get(url + "tasks")["tasks"]


def test_a_deleted_registered_model_is_no_longer_served(registry: dict[str, Any], server: Server) -> None:
    url = server.url
    if _answer_if(url, "wic", 1, lambda status: status == 200) is None:  # run without the test that registers it
        _register(registry["uri"], registry["jobs"]["wic", 0])
        _until(lambda: _answer_if(url, "wic", 1, lambda status: status == 200), "wic to be served")
    MlflowClient(registry["uri"]).delete_registered_model(f"capt-{MODEL}-wic")
    status, body = _until(lambda: _answer_if(url, "wic", 1, lambda status: status != 200), "wic to be dropped")
    assert status == 400 and body["field"] == "task" and "is not served here" in body["error"], body
    tasks = _get(url + "tasks")
    assert set(tasks["tasks"]) == {"rte", "cb"} and "wic" not in tasks["versions"], tasks
    assert _post(url, {"task": "rte", "inputs": _rows("rte", 2, seed=3)})[0] == 200


def _non_loopback_address() -> str | None:
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family == socket.AF_INET and not ipaddress.ip_address(address.address).is_loopback:
                return address.address
    return None


def test_the_start_up_line_is_short_and_the_ports_are_at_debug_level(server: Server) -> None:
    assert len(server.line) < 400 and "listening" not in server.line and "ray::" not in server.line, server.line
    assert f"at {server.url} ;" in server.line and "rte" in server.line and "token in " in server.line, server.line
    assert re.search(r"^.* DEBUG pipelines\.serve: listening \(this driver and its local Ray\): ",
                     server.log.read_text(errors="replace"), re.M), server.log.read_text()[-3000:]
    # its local Ray's proxy parses with h11: the start-up check found a bounded request head, and so does this one
    assert "kept reading a request head" not in server.log.read_text(errors="replace")
    port = int(server.url.rsplit(":", 1)[1].strip("/"))
    assert head_flood(LOCALHOST, port, 1_000_000, timeout_s=30) in ("400", "closed")


def test_the_replicas_grpc_port_is_listed_and_refuses_a_call_without_the_ray_token(server: Server) -> None:
    found = re.search(r"^.* DEBUG pipelines\.serve: (listening .*)$", server.log.read_text(errors="replace"), re.M)
    assert found, server.log.read_text()[-3000:]
    line = found.group(1)
    assert "beyond loopback: none" not in line, line
    # the replica's process title ends with the method it runs at that moment (e.g. `.push_proxy_handle`)
    listed = re.findall(r"\[::\]:(\d+) ray::ServeReplica:capt:capsules\S* \(Ray token\)", line)
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


def test_the_log_names_no_token(server: Server) -> None:
    assert TOKEN["token"] and TOKEN["token"] not in server.log.read_text(errors="replace")
