"""The start-up line's list of listening ports, on real sockets of this test process and a child: each port with
its address, its process and its guard, those beyond loopback first; a port on every interface is never called
loopback."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from pipelines.serving.exposure import LOOPBACK, OPEN, SERVE_TOKEN, describe, process_label, serving_listeners

CHILD = "import socket, time; s = socket.socket(); s.bind(('0.0.0.0', 0)); s.listen(); print(s.getsockname()[1], " \
        "flush=True); time.sleep(60)"


@pytest.fixture
def sockets() -> Iterator[dict[str, int]]:
    """This process listening on 127.0.0.1 (the 'HTTP port') and on 127.0.0.1 again; a child on 0.0.0.0."""
    http, other = socket.socket(), socket.socket()
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    try:
        for sock in (http, other):
            sock.bind(("127.0.0.1", 0))
            sock.listen()
        ports = {"http": http.getsockname()[1], "other": other.getsockname()[1], "child": int(child.stdout.readline())}
        time.sleep(0.2)
        yield ports
    finally:
        child.kill()
        child.wait()
        http.close()
        other.close()


def test_every_listening_port_is_listed_with_its_guard(sockets: dict[str, int]) -> None:
    found = {item.port: item for item in serving_listeners(sockets["http"], serve_token=True)}
    assert found[sockets["http"]].guard == f"{LOOPBACK}, {SERVE_TOKEN}"
    assert (found[sockets["other"]].guard, found[sockets["other"]].process) == (LOOPBACK, "this driver")
    beyond = found[sockets["child"]]
    assert (beyond.ip, beyond.guard) == ("0.0.0.0", OPEN) and beyond.process.endswith(" -c"), beyond
    line = describe(list(found.values()), remote_cluster=False)
    assert line.startswith(f"listening (this driver and its local Ray): beyond loopback: 0.0.0.0:{sockets['child']} ")
    assert f"127.0.0.1:{sockets['http']} this driver (loopback only, serve bearer token)" in line
    assert "beyond loopback: none" not in line


def test_without_the_serve_token_the_http_port_says_so(sockets: dict[str, int]) -> None:
    found = {item.port: item for item in serving_listeners(sockets["http"], serve_token=False)}
    assert found[sockets["http"]].guard == f"{LOOPBACK}, NO TOKEN (--no-auth)"


def test_a_ray_workers_label_is_its_title_without_the_method_it_runs_now() -> None:
    busy = process_label("python", ["ray::ServeReplica:capt:capsules.push_proxy_handle"])
    assert busy == process_label("python", ["ray::ServeReplica:capt:capsules"]) == "ray::ServeReplica:capt:capsules"
    assert process_label("python", ["ray::IDLE"]) == "ray::IDLE"
    assert process_label("python3.11", ["python3.11", "-u", "/x/ray/dashboard/dashboard.py", "--host=1"]) == (
        "python3.11 dashboard.py")
