"""The Ray Serve deployment: HTTP in, one mixed batch per `serve.batch`, hot reload from registry aliases.

``POST /`` with ``{"task": "rte", "inputs": [raw rows]}`` answers ``{"task", "labels", "scores",
"label_names", "model", "version"}``; ``GET /`` lists the capsules served, their versions and the
replica's memory. Bad requests get 400 (413 when too many rows) with one clear message.
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse

from capt.errors import CaptError
from pipelines.serving.engine import Answer, CapsuleEngine, ServedCapsule
from pipelines.serving.settings import ServeSettings
from pipelines.serving.source import RegistrySource

logger = logging.getLogger(__name__)


class BadRequest(ValueError):
    """A request the server refuses; `status` is its HTTP status."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class CapsuleServer:
    """One replica: the base model once, every capsule in one bank, an alias poller in a thread."""

    def __init__(self, settings: dict[str, Any], capsules: Sequence[ServedCapsule] | None = None) -> None:
        self._stop = threading.Event()
        self.settings = ServeSettings.from_args(settings)
        self.source: RegistrySource | None = None
        if capsules is None:  # the registry's versions; a list given directly is served as it is (benchmark)
            self.source = RegistrySource(self.settings.tracking_uri, self.settings.model, self.settings.alias,
                                         tempfile.mkdtemp(prefix="capt-serve-"))
            versions = self.source.check(self.settings.tasks)
            capsules = [self.source.fetch(task, version) for task, version in versions.items()]
        self.engine = CapsuleEngine(capsules)
        self.loaded_rss_mb = _rss_mb()
        """Resident memory once the base model and every capsule are loaded, before any request."""
        self.answer_batch.set_max_batch_size(self.settings.max_batch_requests)
        self.answer_batch.set_batch_wait_timeout_s(self.settings.batch_wait_s)
        if self.source is not None:
            threading.Thread(target=self._poll, name="capt-alias-poll", daemon=True).start()

    def _poll(self) -> None:
        """Every `poll_s`: load the capsule of each moved alias; a failed load keeps the old one answering."""
        while not self._stop.wait(self.settings.poll_s):
            for task, version in self.source.moved(self.engine.versions()).items():
                try:
                    self.engine.replace(self.source.fetch(task, version))
                except Exception:  # noqa: BLE001 - a bad new version must not stop the ones being served
                    logger.exception("Could not load version %d for %s; still serving version %d", version, task,
                                     self.engine.versions()[task])

    def __del__(self) -> None:
        self._stop.set()

    async def __call__(self, request: Request) -> JSONResponse:
        if request.method == "GET":
            return JSONResponse(self.status())
        try:
            name, examples = self._parse(await self._body(request))
        except BadRequest as err:
            return JSONResponse({"error": str(err)}, status_code=err.status)
        answer: Answer = await self.answer_batch((name, examples))
        return JSONResponse({"task": name, "labels": answer.labels, "scores": answer.scores,
                             "label_names": answer.label_names, "model": answer.model_name,
                             "version": answer.version})

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.01)
    async def answer_batch(self, requests: list[tuple[str, list[Any]]]) -> list[Answer]:
        """Every request of the batch in one mixed batch through the bank (in a thread: the loop keeps
        accepting the next batch's requests meanwhile)."""
        return await asyncio.to_thread(self.engine.answer, requests)

    async def _body(self, request: Request) -> Any:
        try:
            return await request.json()
        except ValueError as err:
            raise BadRequest(f"The request body is not JSON ({err}); send {{\"task\": ..., \"inputs\": [...]}}.") \
                from err

    def _parse(self, body: Any) -> tuple[str, list[Any]]:
        """(capsule name, validated examples) of a request body; BadRequest says what is wrong."""
        names = self.engine.names
        if not isinstance(body, dict) or "task" not in body or "inputs" not in body:
            raise BadRequest(f"The request must be a JSON object with the fields 'task' (one of {names}) and "
                             "'inputs' (a list of raw task rows).")
        name, rows = body["task"], body["inputs"]
        if name not in names:
            raise BadRequest(f"task={name!r} is not served here; tasks served: {', '.join(names)}.")
        if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
            raise BadRequest("'inputs' must be a non-empty list of JSON objects, one raw task row each (the "
                             "task's official jsonl fields).")
        limit = self.settings.max_rows_per_request
        if len(rows) > limit:
            raise BadRequest(f"'inputs' holds {len(rows)} rows; at most {limit} per request (split the request, "
                             "or raise max_rows_per_request).", status=413)
        try:
            return name, self.engine.examples(name, rows)
        except CaptError as err:
            raise BadRequest(str(err)) from err

    def status(self) -> dict[str, Any]:
        """What this replica serves: capsule versions, base model, resident memory."""
        return {"base_model": self.engine.base_name, "alias": self.settings.alias, "versions": self.engine.versions(),
                "loaded_rss_mb": self.loaded_rss_mb, "rss_mb": _rss_mb()}


def _rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def deployment(settings: ServeSettings, capsules: Sequence[ServedCapsule] | None = None) -> serve.Application:
    """The bound Serve application for `settings` (and, for the benchmark, capsules given directly)."""
    options = {"num_cpus": settings.num_cpus, "num_gpus": settings.num_gpus}
    server = serve.deployment(CapsuleServer, name="capsules", num_replicas=settings.num_replicas,
                              ray_actor_options=options,
                              max_ongoing_requests=settings.max_batch_requests * 4)
    return server.bind(asdict(settings), list(capsules) if capsules is not None else None)


def build(args: dict[str, Any]) -> serve.Application:
    """The application builder a Serve config file names (``import_path: pipelines.serving.app:build``).

    ``tracking_uri`` defaults to MLFLOW_TRACKING_URI of the process that builds it (on a cluster, the head).
    """
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    return deployment(ServeSettings.from_args({**({"tracking_uri": uri} if uri else {}), **args}))
