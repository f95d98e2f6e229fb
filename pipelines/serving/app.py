"""The Ray Serve deployment: HTTP in (`routes`), one mixed batch per `serve.batch`, hot reload from registry aliases.

``POST /`` with ``{"task": "rte", "inputs": [raw rows]}`` answers ``{"task", "labels", "scores",
"label_names", "model", "version"}``; ``GET /tasks`` lists the capsules served, their versions and the
replica's memory; ``GET /health`` answers without the token. Refusals: `pipelines.serving.routes`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from typing import Any

from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse

from pipelines.serving.auth import TOKEN_ENV, given_token
from pipelines.serving.engine import CapsuleEngine
from pipelines.serving.limits import Limits
from pipelines.serving.memory import resident_mb
from pipelines.serving.records import Answer, ServedCapsule
from pipelines.serving.reload import Reloader
from pipelines.serving.routes import Catalog, Front
from pipelines.serving.settings import ServeSettings
from pipelines.serving.source import RegistrySource, ServeError

logger = logging.getLogger(__name__)

CHARS_PER_TOKEN_LIMIT = 8
"""Default characters per text field: this many per token of the capsule's max_length (`ServeSettings`)."""


class CapsuleServer:
    """One replica: the base model once, every capsule in one bank, an alias poller in a thread."""

    def __init__(self, settings: dict[str, Any], capsules: Iterable[ServedCapsule] | None = None) -> None:
        self._stop = threading.Event()
        self.settings = ServeSettings.from_args(settings)
        self.source: RegistrySource | None = None
        if capsules is None:  # the registry's versions, each fetched as the bank reads it; capsules given are served
            self.source = RegistrySource(self.settings.tracking_uri, self.settings.model, self.settings.alias,
                                         tempfile.mkdtemp(prefix="capt-serve-"))
        try:
            if self.source is not None:
                versions = self.source.check(self.settings.tasks)
                capsules = (self.source.fetch(task, version) for task, version in versions.items())
            self.engine = CapsuleEngine(capsules)
        except BaseException:
            self._forget_downloads()  # a refused start leaves no download folder (tampered copies included)
            raise
        self.loaded_rss_mb = resident_mb()
        """Resident memory once the base model and every capsule are loaded, before any request."""
        self._catalog: tuple[int, Catalog] | None = None
        """(engine revision, the route checks' catalog of what it served then): `catalog`."""
        self.front = Front(self, self.settings.token_sha256 if self.settings.auth else None)
        self.answer_batch.set_max_batch_size(self.settings.max_batch_requests)
        self.answer_batch.set_batch_wait_timeout_s(self.settings.batch_wait_s)
        if self.source is not None:
            self.reloader = Reloader(self.source, self.engine, None if self.settings.all_tasks else self.settings.tasks)
            threading.Thread(target=self._poll, name="capt-alias-poll", daemon=True).start()

    def _poll(self) -> None:
        """Every `poll_s`: serve what the alias names now (`reload.Reloader`: moved, new and deleted tasks)."""
        while not self._stop.wait(self.settings.poll_s):
            self.reloader.poll()

    def __del__(self) -> None:
        self._stop.set()
        self._forget_downloads()

    def _forget_downloads(self) -> None:
        """Remove the folder the registry's versions were downloaded into (the bank holds their values)."""
        if getattr(self, "source", None) is not None:
            shutil.rmtree(self.source.root, ignore_errors=True)

    async def __call__(self, request: Request) -> JSONResponse:
        return await self.front.respond(request)

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.01)
    async def answer_batch(self, requests: list[tuple[str, list[Any]]]) -> list[Answer]:
        """Every request of the batch in one mixed batch through the bank (in a thread: the loop keeps
        accepting the next batch's requests meanwhile)."""
        return await asyncio.to_thread(self.engine.answer, requests)

    # What `routes.Front` asks of a replica (`routes.Served`).
    def catalog(self) -> Catalog:
        """The names served and the request limits, built again only after the served set changed (the engine's
        revision moved: load, hot add, swap, or a drop by the registry poll), not on every request."""
        revision = self.engine.revision  # read first: a change made while building is caught by the next request
        if self._catalog is None or self._catalog[0] != revision:
            self._catalog = revision, Catalog(self.engine.names, self.limits())
        return self._catalog[1]

    def max_chars(self, name: str) -> int:
        """Most characters per string in a row for capsule `name`."""
        return self.settings.max_text_chars or CHARS_PER_TOKEN_LIMIT * self.engine.max_length(name)

    def limits(self) -> Limits:
        """The request limits (characters: the largest of the capsules', each task's own checked after parsing)."""
        s = self.settings
        # with every task dropped (deleted from the registry), any request is refused for its task, after parsing
        chars = max((self.max_chars(name) for name in self.engine.names), default=s.max_text_chars or 2**16)
        return Limits(s.max_body_bytes, s.max_rows_per_request, s.max_json_depth, chars)

    def examples(self, name: str, rows: list[dict[str, Any]]) -> list[Any]:
        """Validated examples (the registry pyfunc's checks; CaptError names the row and field)."""
        return self.engine.examples(name, rows)

    async def answer(self, name: str, examples: list[Any]) -> dict[str, Any]:
        """The answer to one checked request, batched with the requests of other tasks."""
        return answer_body(name, await self.answer_batch((name, examples)))

    def describe(self) -> dict[str, Any]:
        """What this replica serves: each capsule's registry model, version and digest; base model; memory."""
        served = {name: self.engine.served(name) for name in self.engine.names}
        return {"base_model": self.engine.base_name, "alias": self.settings.alias,
                "tasks": {name: {"task": c.task, "model": c.model_name, "version": c.version, "digest": c.digest}
                          for name, c in served.items()},
                "versions": self.engine.versions(), "base_rss_mb": self.engine.base_rss_mb,
                "loaded_rss_mb": self.loaded_rss_mb, "rss_mb": resident_mb()}



def deployment(settings: ServeSettings, capsules: Sequence[ServedCapsule] | None = None) -> serve.Application:
    """The bound Serve application for `settings` (and, for the benchmark, capsules given directly)."""
    server = serve.deployment(CapsuleServer, name="capsules", num_replicas=settings.num_replicas,
                              ray_actor_options=actor_options(settings),
                              max_ongoing_requests=settings.max_batch_requests * 4)
    return server.bind(asdict(settings), list(capsules) if capsules is not None else None)


def actor_options(settings: ServeSettings) -> dict[str, Any]:
    """A replica's Ray actor options: its CPUs and GPUs."""
    return {"num_cpus": settings.num_cpus, "num_gpus": settings.num_gpus}


def build(args: dict[str, Any]) -> serve.Application:
    """The application builder a Serve config file names (``import_path: pipelines.serving.app:build``).

    ``tracking_uri`` defaults to MLFLOW_TRACKING_URI of the process that builds it (on a cluster, the head);
    the bearer token is read there too: ``token_file`` in `args`, else CAPT_SERVE_TOKEN (`auth.find_token`);
    ``auth: false`` turns it off.
    """
    args = dict(args)
    token_file = args.pop("token_file", None)
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if args.get("auth", True) and "token_sha256" not in args:
        token = given_token(token_file)
        if token is None:
            raise ServeError(f"The Serve config needs a bearer token: set {TOKEN_ENV} in the environment of "
                             "`serve deploy` (the head), or args.token_file to a file holding it; or args.auth: "
                             "false to serve without one.")
        args["token_sha256"] = token.sha256
    return deployment(ServeSettings.from_args({**({"tracking_uri": uri} if uri else {}), **args}))


def answer_body(name: str, answer: Answer) -> dict[str, Any]:
    """The JSON body of one request's answer: labels, their scores, the label names and the version that answered."""
    return {"task": name, "labels": answer.labels, "scores": answer.scores, "label_names": answer.label_names,
            "model": answer.model_name, "version": answer.version}
