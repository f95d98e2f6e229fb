"""The serving benchmark's side of Ray Serve: the app's replica with timers, HTTP load, the hot add.

`TimedServer` is `pipelines.serving.app.CapsuleServer` with its constructor timed (and the memory at its start), and
an ``add`` a Serve handle calls to put one more capsule into the running replica (`CapsuleEngine.add`, what the
registry poll calls; the app has no HTTP route for it). Requests carry the bearer token the app checks.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pipelines.serving.app import CapsuleServer, server_deployment
from pipelines.serving.memory import resident_mb

TOKEN = secrets.token_urlsafe(32)
"""The bearer token of the applications under load (checked on every request, as when served)."""
HEADERS = {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"}


class TimedServer(CapsuleServer):
    """`CapsuleServer` with its start-up timed and a hot add reachable through a Serve handle."""

    def __init__(self, settings: dict[str, Any], manifest: str) -> None:
        from benchmarks.serving_capsules import read_manifest

        self.start_rss_mb = resident_mb()
        started = time.perf_counter()
        super().__init__(settings, read_manifest(manifest))
        self.init_s = time.perf_counter() - started

    def describe(self) -> dict[str, Any]:
        """The app's GET /tasks, plus the memory at the constructor's start and its time."""
        return {**super().describe(), "start_rss_mb": self.start_rss_mb, "init_s": self.init_s}

    async def add(self, served: Any) -> dict[str, Any]:
        """Serve one more capsule from the next batch on (`CapsuleEngine.add`, in a thread: the replica's event loop
        keeps answering health checks and taking requests); its time and the memory after."""
        return await asyncio.to_thread(self._add, served)

    def _add(self, served: Any) -> dict[str, Any]:
        started = time.perf_counter()
        self.engine.add(served)
        return {"add_s": time.perf_counter() - started, "rss_mb": resident_mb(), "tasks": len(self.engine.names)}


def deploy(settings: Any, manifest: Path, name: str) -> tuple[str, float]:
    """Run `TimedServer` as application `name`, serving the capsules of `manifest`
    (`serving_capsules.write_manifest`), deployed as `pipelines.serving.app.server_deployment` deploys the app's
    replica; (its route prefix, seconds from `serve.run` to the application running)."""
    from ray import serve

    server = server_deployment(settings, TimedServer)
    started = time.perf_counter()
    serve.run(server.bind(asdict(settings), str(manifest)), name=name, route_prefix=f"/{name}")
    return f"/{name}", time.perf_counter() - started


def post(url: str, body: dict[str, Any]) -> float:
    """Seconds one POST took to answer (an HTTP error raises)."""
    started = time.perf_counter()
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=HEADERS)
    with urllib.request.urlopen(request, timeout=120) as response:
        response.read()
    return time.perf_counter() - started


def status(url: str) -> dict[str, Any]:
    """The application's GET /tasks."""
    with urllib.request.urlopen(urllib.request.Request(url + "/tasks", headers=HEADERS), timeout=60) as response:
        return json.loads(response.read())


def load(url: str, bodies: list[dict[str, Any]], requests: int, threads: int, duration_s: float,
         offset: int = 0) -> dict[str, Any]:
    """`requests` POSTs from `threads` client threads, request i carrying bodies[(offset + i) % len], none started
    after `duration_s`; the requests answered, the wall time and each request's latency."""
    deadline = time.perf_counter() + duration_s

    def one(i: int) -> float | None:
        return None if time.perf_counter() > deadline else post(url, bodies[(offset + i) % len(bodies)])

    started = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        latencies = [t for t in pool.map(one, range(requests)) if t is not None]
    return {"requests": len(latencies), "elapsed": time.perf_counter() - started, "latencies": latencies}


def hot_add(app: str, url: str, served: Any, body: dict[str, Any]) -> dict[str, Any]:
    """Add `served` to the running application `app` through a Serve handle, then ask it over HTTP: the add's
    time in the replica, the handle call's, until the first answer for the new capsule, and the memory after."""
    from ray import serve

    started = time.perf_counter()
    added = serve.get_app_handle(app).add.remote(served).result(timeout_s=600)
    call_s = time.perf_counter() - started
    first = post(url, body)
    return {**added, "call_s": call_s, "first_answer_s": time.perf_counter() - started, "first_request_s": first}
