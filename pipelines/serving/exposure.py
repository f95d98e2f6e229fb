"""What listens while the Serve app serves, and what protects each port: the list `pipelines.serve` logs at start
(at debug level, ``--debug``; a port beyond loopback that nothing guards is a warning).

A local Ray started by the driver keeps its daemons on 127.0.0.1 (`pipelines.services.private`), but not every
port: Ray Serve 2.60 starts each replica's inter-deployment gRPC server on ``[::]:<random port>`` (hard-coded in
``ray/serve/_private/replica.py``), plaintext. With Ray's token auth (``RAY_AUTH_MODE=token``, what the local Ray
runs with) that server's authentication interceptor answers a call without the token UNAUTHENTICATED; without it
the port is open. So the list names every listening socket of the processes serving (the driver, and
below it the local Ray's daemons and workers: the replicas, Serve's proxy and controller) instead of promising
that nothing listens beyond loopback. Processes of a remote cluster (RAY_ADDRESS) are not on this machine: the
list says so, and infra/serve.yaml documents what listens where there.

The HTTP port's request heads are bounded too: Serve's proxy runs uvicorn, which parses with httptools when it
imports (headers kept in memory however long they grow, before any token is checked) and with h11 otherwise (a
request head past 16 KB: 400, the connection closed). A local Ray that serves starts its processes with `H11_ONLY`
first on PYTHONPATH (`node_env`), where `httptools` does not import; a cluster's nodes need the same in the
environment of `ray start` (infra/README.md, "Serving"; the project's image sets it). `head_limit_problem` asks the
running proxy itself whether it holds the bound.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path

import psutil

from pipelines.services.private import is_loopback, process_tree

LOOPBACK = "loopback only"
RAY_TOKEN = "Ray token"
SERVE_TOKEN = "serve bearer token"
OPEN = "NOTHING: open to anyone who reaches it"


@dataclass(frozen=True)
class Listener:
    """One listening TCP socket of a serving process."""

    ip: str
    port: int
    process: str
    """What the process is: ``ray::ServeReplica:capt:capsules``, ``raylet``, ``this driver``, ..."""
    guard: str
    """What protects it: `LOOPBACK`, `RAY_TOKEN`, `SERVE_TOKEN` or `OPEN` (``--no-auth`` on the HTTP port says so)."""

    def __str__(self) -> str:
        host = f"[{self.ip}]" if ":" in self.ip else self.ip
        return f"{host}:{self.port} {self.process} ({self.guard})"


def serving_listeners(http_port: int, serve_token: bool, root_pid: int | None = None) -> list[Listener]:
    """Every TCP socket listening in `root_pid` (default: this process) and its descendants, with its guard.

    One system-wide `psutil.net_connections` read, kept to those processes' pids (a process of another user that
    cannot be read is not ours and is skipped); sorted beyond-loopback first, then by port.
    """
    ray_token = os.environ.get("RAY_AUTH_MODE", "").lower() == "token"
    labels = _process_labels(root_pid or os.getpid())
    found = set()
    for conn in psutil.net_connections(kind="inet"):
        if conn.status == psutil.CONN_LISTEN and conn.pid in labels and conn.laddr:
            label, is_ray = labels[conn.pid]
            found.add(Listener(conn.laddr.ip, conn.laddr.port, label,
                               _guard(conn.laddr.ip, conn.laddr.port, is_ray, http_port, serve_token, ray_token)))
    return sorted(found, key=lambda item: (is_loopback(item.ip), item.port, item.ip))


def _guard(ip: str, port: int, is_ray: bool, http_port: int, serve_token: bool, ray_token: bool) -> str:
    if port == http_port:  # Serve's HTTP proxy: the app checks the bearer token on every route but /health
        guard = SERVE_TOKEN if serve_token else "NO TOKEN (--no-auth)"
        return f"{LOOPBACK}, {guard}" if is_loopback(ip) else guard
    if is_loopback(ip):
        return LOOPBACK
    return RAY_TOKEN if is_ray and ray_token else OPEN


def _process_labels(root_pid: int) -> dict[int, tuple[str, bool]]:
    """{pid: (label, is a Ray process)} of `root_pid` and every descendant still alive."""
    labels = {}
    for process in process_tree(root_pid):
        try:
            name, command = process.name(), process.cmdline()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        joined = " ".join(command)
        is_ray = name in ("gcs_server", "raylet") or joined.startswith("ray::") or f"{os.sep}ray{os.sep}" in joined
        labels[process.pid] = ("this driver" if process.pid == root_pid else process_label(name, command), is_ray)
    return labels


def process_label(name: str, command: list[str]) -> str:
    """``ray::ServeReplica:capt:capsules`` for a Ray worker (its title, without the ``.method`` a busy actor's title
    ends with, so that one process reads the same whenever the list is written), ``python dashboard.py``
    for a script."""
    if command and command[0].startswith("ray::"):
        title = command[0].split()[0]
        head, _, method = title.rpartition(".")
        return head if head.startswith("ray::") and method.isidentifier() else title
    if name.startswith("python") and len(command) > 1:
        if "-c" in command[1:]:  # the code itself is no name
            return f"{name} -c"
        script = next((arg for arg in command[1:] if not arg.startswith("-")), "")  # a script, or -m's module
        return f"{name} {Path(script).name}".strip()
    return name


def describe(listeners: list[Listener], remote_cluster: bool) -> str:
    """The logged list: every port, those beyond loopback first, each with its guard."""
    beyond = ", ".join(str(item) for item in listeners if not is_loopback(item.ip)) or "none"
    local = ", ".join(str(item) for item in listeners if is_loopback(item.ip)) or "none"
    where = ("this machine's processes only; the cluster's nodes: infra/serve.yaml" if remote_cluster else
             "this driver and its local Ray")
    return f"listening ({where}): beyond loopback: {beyond}; on loopback: {local}"


H11_ONLY = Path(__file__).resolve().parent / "h11_only"
"""The folder whose `httptools` stand-in fails to import, so that uvicorn falls back to h11."""
HEAD_LIMIT_BYTES = 16 * 1024
"""h11's bound on an incomplete request head (uvicorn's default `h11_max_incomplete_event_size`)."""
PROBE_HEADER_BYTES = 4 * HEAD_LIMIT_BYTES
"""Header bytes `head_limit_problem` sends: past the bound, and small enough to take no time."""


def node_env() -> dict[str, str]:
    """Environment for the processes of a local Ray that serves: `H11_ONLY` first on PYTHONPATH."""
    paths = [str(H11_ONLY), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {"PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}


def head_limit_problem(host: str, port: int, timeout_s: float = 5.0) -> str | None:
    """None when the proxy at host:port ends a request head of `PROBE_HEADER_BYTES` before the head does (a 400, or
    the connection closed); else what it did, and the fix."""
    target = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    if head_flood(target, port, PROBE_HEADER_BYTES, timeout_s) != "read on":
        return None
    return (f"Serve's HTTP proxy at {target}:{port} kept reading a request head of {PROBE_HEADER_BYTES:,} bytes: "
            "its uvicorn parses with httptools, which holds headers of any size in memory before the token is "
            f"checked. Start the cluster's nodes with PYTHONPATH={H11_ONLY} in the environment of `ray start` "
            "(infra/README.md, \"Serving\").")


def head_flood(host: str, port: int, header_bytes: int, timeout_s: float) -> str:
    """Send one request head that grows by `header_bytes` and never ends; how the server took it: "400" (it
    answered so), "closed" (it closed or reset the connection) or "read on" (it was still reading at `timeout_s`)."""
    line = b"X-Capt-Head-Probe: " + b"a" * min(header_bytes, 60_000) + b"\r\n"
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as connection:
            connection.sendall(b"GET /health HTTP/1.1\r\nHost: capt\r\n")
            for _ in range(max(1, header_bytes // len(line))):
                connection.sendall(line)
            reply = connection.recv(64)
    except TimeoutError:
        return "read on"
    except OSError:  # reset or broken pipe: the server dropped the connection mid-head
        return "closed"
    return "400" if reply.startswith(b"HTTP/1.1 400") else "closed" if not reply else "read on"
