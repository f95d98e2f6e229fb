"""Bounded request heads on Serve's HTTP proxy: its uvicorn parses with h11 (a request head past 16 KB: 400, the
connection closed), not httptools (headers kept in memory however long they grow, before any token is checked).

A local Ray that serves starts its processes with `H11_ONLY` first on PYTHONPATH (`node_env`), where `httptools`
does not import; a cluster's nodes need the same in the environment of `ray start` (infra/README.md, "Serving"; the
project's image sets it). `head_limit_problem` asks the running proxy itself whether it holds the bound.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

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
    outcome = head_flood(target, port, PROBE_HEADER_BYTES, timeout_s)
    if outcome != "read on":
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
