"""The Serve app's HTTP surface on a real local Ray (the session's ``ray_head``), hit by real HTTP clients on
127.0.0.1: deployed once for the module (one tiny-T5 RTE capsule given directly, at a route prefix as the
benchmark deploys it), then every case against it. Proves: three routes and 404/405 elsewhere; the bearer token
on every route but /health; hostile bodies (50 MB, 100,000-deep nesting, lone surrogates, NaN, bad UTF-8, long
texts) are 4xx at once, never 5xx, the replica's memory stays within 5 % and the next request is answered at once.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from helpers.bad_inputs import ROOT
from helpers.ray_head import LocalRayHead
from helpers.registry import train_capsule

from capt.tasks import example_rows
from pipelines.capsule_predictor import CapsulePredictor
from pipelines.services import LOCALHOST, free_port
from pipelines.serving.exposure import H11_ONLY, HEAD_LIMIT_BYTES, head_flood, head_limit_problem

pytestmark = pytest.mark.integration

TOKEN = "integration-token-0123456789abcdef"
PREFIX = "/capt-http"
MAX_ROWS = 8
ROW = {"premise": "A cat sat on the mat.", "hypothesis": "A cat sat."}


class Client:
    """Raw HTTP/1.1 to the app: any method, any path (unnormalised), any bytes."""

    def __init__(self, port: int) -> None:
        self.port = port

    def call(self, method: str, path: str, body: bytes | None = None, token: str | None = TOKEN,
             headers: dict[str, str] | None = None, timeout: float = 60) -> tuple[int, dict[str, Any], float]:
        connection = http.client.HTTPConnection(LOCALHOST, self.port, timeout=timeout)
        started = time.perf_counter()
        try:
            connection.putrequest(method, PREFIX + path, skip_accept_encoding=True)
            sent = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {}),
                    **({"Content-Length": str(len(body))} if body is not None else {}), **(headers or {})}
            for key, value in sent.items():
                connection.putheader(key, value)
            connection.endheaders()
            try:
                if body:
                    connection.send(body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the server answered before the whole body was sent: read that answer
            response = connection.getresponse()
            return response.status, json.loads(response.read() or b"null"), time.perf_counter() - started
        finally:
            connection.close()

    def post(self, body: Any, **kw: Any) -> tuple[int, dict[str, Any], float]:
        return self.call("POST", "/", body if isinstance(body, bytes) else json.dumps(body).encode(), **kw)

    def rss_mb(self) -> float:
        return self.call("GET", "/tasks")[1]["rss_mb"]


@pytest.fixture(scope="module")
def capsule(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return train_capsule(tmp_path_factory.mktemp("http-job"), "rte", 0, max_epochs=1)


DRIVER = """
import json, sys
from pathlib import Path
import ray
from ray import serve
args = json.loads(sys.argv[1])
ray.init(address=args["address"], runtime_env={"env_vars": args["env"]}, logging_level="WARNING")
if args["deploy"]:
    from pipelines.serving.app import deployment
    from pipelines.serving.records import ServedCapsule
    from pipelines.serving.settings import ServeSettings
    result = json.loads(Path(args["result"]).read_text())
    served = ServedCapsule("rte", "rte", "capt-tiny-t5-rte", 1, Path(result["artifact_dir"]), result)
    serve.start(http_options={"host": "127.0.0.1", "port": args["port"]})
    serve.run(deployment(ServeSettings(**args["settings"]), [served]), name="capt-http", route_prefix=args["prefix"])
else:
    serve.shutdown()
"""
"""Deploys (or shuts down) the app from a driver process of its own: Ray reads its address settings on import,
before a fixture could set them in this process; Serve keeps the app after the driver exits."""


def _driver(ray_head: LocalRayHead, **args: Any) -> None:
    # as `python -m pipelines.serve` gives its job (`exposure.node_env`): Serve's proxy parses with h11
    env = {**os.environ, **ray_head.client_env(),
           "PYTHONPATH": os.pathsep.join([str(H11_ONLY), str(ROOT), str(ROOT / "tests")])}
    worker_env = {key: env[key] for key in ("PYTHONPATH",)} | {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", DRIVER, json.dumps({"address": ray_head.address, "env": worker_env,
                                                                     "prefix": PREFIX, **args})],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]


@pytest.fixture(scope="module")
def client(ray_head: LocalRayHead, capsule: dict[str, Any],
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    """The app on ``ray_head``, Serve's proxy on 127.0.0.1:<free port>; shut down at the end."""
    from pipelines.serving.auth import digest

    settings = {"model": "tiny-t5", "tasks": ["rte"], "tracking_uri": "local capsules", "token_sha256": digest(TOKEN),
                "max_rows_per_request": MAX_ROWS, "num_cpus": 0.5}
    result = tmp_path_factory.mktemp("http-result") / "result.json"
    result.write_text(json.dumps(capsule, default=str))
    port = free_port(LOCALHOST)
    try:
        _driver(ray_head, deploy=True, result=str(result), settings=settings, port=port)
        yield Client(port)
    finally:
        _driver(ray_head, deploy=False)


def test_inference_answers_as_the_pyfunc_and_health_needs_no_token(client: Client, capsule: dict[str, Any]) -> None:
    rows = example_rows("rte", 3)
    status, body, _ = client.post({"task": "rte", "inputs": rows})
    assert status == 200, body
    assert body["labels"] == CapsulePredictor(capsule["artifact_dir"], capsule).predict_rows(rows)
    assert (body["model"], body["version"]) == ("capt-tiny-t5-rte", 1)
    assert client.call("GET", "/health", token=None)[:2] == (200, {"status": "ok"})
    described = client.call("GET", "/tasks")[1]
    assert described["tasks"] == {"rte": {"task": "rte", "model": "capt-tiny-t5-rte", "version": 1, "digest": None}}


@pytest.mark.parametrize(("method", "path", "token", "status"), [
    ("POST", "/", None, 401), ("POST", "/", "wrong-token-0123456789abcdef", 401), ("GET", "/tasks", None, 401),
    ("GET", "/tasks", TOKEN[:-1], 401), ("PUT", "/", TOKEN, 405), ("DELETE", "/", TOKEN, 405),
    ("OPTIONS", "/", TOKEN, 405), ("GET", "/", TOKEN, 405), ("POST", "/health", TOKEN, 405),
    ("GET", "/nope", TOKEN, 404), ("POST", "/../../etc/passwd", TOKEN, 404), ("GET", "/nope", None, 404),
], ids=["post-no-token", "post-wrong-token", "tasks-no-token", "tasks-wrong-token", "put", "delete", "options",
        "get-inference", "post-health", "unknown-path", "traversal", "unknown-path-no-token"])
def test_routes_methods_and_the_token(client: Client, method: str, path: str, token: str | None,
                                      status: int) -> None:
    got, body, _ = client.call(method, path, json.dumps({"task": "rte", "inputs": [ROW]}).encode(), token=token)
    assert got == status and body["error"] and body["field"] and body["rule"], body


DEEP = 100_000
CASES = [
    (b'{"task": "rte", "inputs": [{"premise": "\\ud800", "hypothesis": "b"}]}', 400, "inputs[0].premise", "unicode"),
    (b'{"task": "rte", "inputs": [{"premise": NaN, "hypothesis": "b"}]}', 400, "body", "finite_numbers"),
    (b'{"task": "rte", "inputs": [{"premise": "caf\xe9", "hypothesis": "b"}]}', 400, "body", "utf-8"),
    (b"[" * DEEP + b"]" * DEEP, 400, "body", "max_depth"),
    (b'{"task": "rte", "inputs": [{"premise": ' + b"[" * DEEP + b"]" * DEEP + b', "hypothesis": "b"}]}', 400,
     "body", "max_depth"),
    (b'{"task": "rte", "inputs": [{"premise": 7, "hypothesis": "b"}]}', 400, "inputs[0].premise",
     "expected a string, got int 7"),
    (b'{"task": "nope", "inputs": [{"premise": "a", "hypothesis": "b"}]}', 400, "task", "served_task"),
    (b'{"task": "rte", "inputs": []}', 400, "inputs", "non_empty_list"),
    (json.dumps({"task": "rte", "inputs": [ROW] * (MAX_ROWS + 1)}).encode(), 413, "inputs", "max_rows"),
    (json.dumps({"task": "rte", "inputs": [{**ROW, "premise": "word " * 40_000}]}).encode(), 400, "inputs",
     "max_chars"),
]


@pytest.mark.parametrize(("body", "status", "field", "rule"), CASES,
                         ids=["lone-surrogate", "nan", "bad-utf8", "deep-body", "deep-field", "wrong-type",
                              "unknown-task", "empty-inputs", "too-many-rows", "long-text"])
def test_client_errors_are_4xx_naming_field_and_rule(client: Client, body: bytes, status: int, field: str,
                                                     rule: str) -> None:
    got, answer, seconds = client.post(body)
    assert (got, answer["field"], answer["rule"]) == (status, field, rule), answer
    assert seconds < 5


def test_a_50_mb_body_is_413_at_once_and_the_replica_keeps_its_memory(client: Client) -> None:
    client.post({"task": "rte", "inputs": [ROW]})
    before = client.rss_mb()
    premise = b"x" * (50 * 2**20)
    status, body, seconds = client.post(b'{"task": "rte", "inputs": [{"premise": "' + premise + b'"}]}', timeout=120)
    assert (status, body["rule"]) == (413, "max_body_bytes") and seconds < 30, (body, seconds)
    status, _, seconds = client.post({"task": "rte", "inputs": [ROW]})
    assert status == 200 and seconds < 5, seconds
    time.sleep(1)
    after = client.rss_mb()
    assert after <= before * 1.05, (before, after)



def _proxy_process(port: int):
    """The process listening on Serve's HTTP `port`: its proxy (other sessions' heads run proxies of their own)."""
    import psutil

    [pid] = {c.pid for c in psutil.net_connections("tcp") if c.laddr.port == port and c.status == psutil.CONN_LISTEN}
    process = psutil.Process(pid)
    assert "ProxyActor" in " ".join(process.cmdline()), process.cmdline()
    return process


def test_a_request_head_past_16_kb_is_refused_before_the_token_and_the_proxy_keeps_no_memory(client: Client) -> None:
    """The head starts as infra/README.md says (`pipelines.serving.exposure.node_env`), so Serve's proxy parses
    with h11: two connections, no token, each sending a head of 20 MB that never ends, are cut off after 16 KB (a
    400, or the connection closed) and the proxy's memory does not grow with them; the next request is answered."""
    proxy = _proxy_process(client.port)
    before = proxy.memory_info().rss
    outcomes = [head_flood(LOCALHOST, client.port, 20_000_000, timeout_s=30) for _ in range(2)]
    grown_mb = (proxy.memory_info().rss - before) / 2**20
    assert set(outcomes) <= {"400", "closed"}, outcomes
    assert grown_mb < 20, f"the proxy grew by {grown_mb:.0f} MB for two {20_000_000:,}-byte heads"
    assert head_limit_problem(LOCALHOST, client.port) is None and HEAD_LIMIT_BYTES == 16 * 1024
    assert client.call("GET", "/health", token=None)[:2] == (200, {"status": "ok"})
