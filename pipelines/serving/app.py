"""The Ray Serve deployment: HTTP through Serve's FastAPI ingress (`routes`), one mixed batch per `serve.batch`, hot
reload from registry aliases (`Reloader`).

The poll: every ``poll_s`` the replica serves what ``capt-<model>-<task>@<alias>`` names: a moved alias's version, a
task registered (or given the alias) since the start, and no task whose registered model was deleted or lost the
alias. A version to load passes the checks of the start (`RegistrySource.fetch`: digests and provenance;
`source.check_finite`: finite values; the engine: base model, method and fit to the loaded weights). One
that fails is skipped with a warning, once per version, and whatever was served keeps answering: a bad capsule
in the registry never takes a replica down. A refused version is fetched again at every poll while the alias names
it (a store repaired since serves it; its refused copy is not kept), and said again only once it passes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Collection, Iterable, Sequence
from dataclasses import asdict
from typing import Any

from ray import serve

from capt.errors import CaptError
from pipelines.serving import routes
from pipelines.serving.auth import TOKEN_ENV, given_token
from pipelines.serving.engine import CapsuleEngine
from pipelines.serving.limits import Limits
from pipelines.serving.memory import resident_mb
from pipelines.serving.records import Answer, ServedCapsule
from pipelines.serving.routes import Catalog
from pipelines.serving.settings import ServeSettings
from pipelines.serving.source import RegistrySource, ServeError, check_finite

logger = logging.getLogger(__name__)


class CapsuleServer:
    """One replica: the base model once, every capsule in one bank, an alias poller in a thread. Serve runs it
    behind `routes.app` (`server_deployment`), whose routes reach it as `routes.replica`."""

    def __init__(self, settings: dict[str, Any], capsules: Iterable[ServedCapsule] | None = None) -> None:
        self._stop = threading.Event()
        self.settings = ServeSettings.from_args(settings)
        # the registry's versions, each fetched as the bank reads it; capsules given are served
        self.source = None if capsules is not None else RegistrySource(
            self.settings.tracking_uri, self.settings.model, self.settings.alias,
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
        self.token_sha256 = self.settings.token_sha256 if self.settings.auth else None
        """SHA-256 of the bearer token the routes ask for; None: no token asked (``--no-auth``)."""
        self.answer_batch.set_max_batch_size(self.settings.max_batch_requests)
        self.answer_batch.set_batch_wait_timeout_s(self.settings.batch_wait_s)
        if self.source is not None:
            self.reloader = Reloader(self.source, self.engine, None if self.settings.all_tasks else self.settings.tasks)
            threading.Thread(target=self._poll, name="capt-alias-poll", daemon=True).start()

    def _poll(self) -> None:
        """Every `poll_s`: serve what the alias names now (`Reloader`: moved, new and deleted tasks)."""
        while not self._stop.wait(self.settings.poll_s):
            self.reloader.poll()

    def __del__(self) -> None:
        self._stop.set()
        self._forget_downloads()

    def _forget_downloads(self) -> None:
        """Remove the folder the registry's versions were downloaded into (the bank holds their values)."""
        if getattr(self, "source", None) is not None:
            shutil.rmtree(self.source.root, ignore_errors=True)

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.01)
    async def answer_batch(self, requests: list[tuple[str, list[Any]]]) -> list[Answer]:
        """Every request of the batch in one mixed batch through the bank (in a thread: the loop keeps
        accepting the next batch's requests meanwhile)."""
        return await asyncio.to_thread(self.engine.answer, requests)

    # What the routes ask of a replica (`routes.Served`).
    def catalog(self) -> Catalog:
        """The names served and the request limits (characters: the largest of the capsules', each task's own checked
        after parsing), built again only after the served set changed (the engine's revision moved: load, hot add,
        swap, or a drop by the registry poll), not on every request."""
        revision = self.engine.revision  # read first: a change made while building is caught by the next request
        if self._catalog is None or self._catalog[0] != revision:
            s, names = self.settings, self.engine.names
            # with every task dropped (deleted from the registry), any request is refused for its task, after parsing
            chars = max((self.max_chars(name) for name in names), default=s.max_text_chars or 2**16)
            limits = Limits(s.max_body_bytes, s.max_rows_per_request, s.max_json_depth, chars)
            self._catalog = revision, Catalog(names, limits)
        return self._catalog[1]

    def max_chars(self, name: str) -> int:
        """Most characters per string in a row for capsule `name`: by default 8 per token of its max_length
        (`ServeSettings.max_text_chars`)."""
        return self.settings.max_text_chars or 8 * int(self.engine.served(name).collator.max_length)

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
    """The bound Serve application for `settings` (and, for the tests, capsules given directly)."""
    return server_deployment(settings).bind(asdict(settings), list(capsules) if capsules is not None else None)


def server_deployment(settings: ServeSettings, server: type[CapsuleServer] = CapsuleServer) -> serve.Deployment:
    """`server` (the benchmark's times itself) as the Serve deployment behind `routes.app`, with its options."""
    return serve.deployment(serve.ingress(routes.app)(server), name="capsules", num_replicas=settings.num_replicas,
                            ray_actor_options={"num_cpus": settings.num_cpus, "num_gpus": settings.num_gpus},
                            max_ongoing_requests=settings.max_batch_requests * 4)


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


class Reloader:
    """Applies `RegistrySource.changes` to `engine`; `wanted` None follows every task (``--all``), a list only
    those tasks (``--tasks``: a listed task that comes back is served again, an unlisted one never)."""

    def __init__(self, source: RegistrySource, engine: CapsuleEngine, wanted: Collection[str] | None) -> None:
        self.source, self.engine, self.wanted = source, engine, wanted
        self.refused: dict[str, int] = {}
        """{task: version} that failed a check: warned about once, fetched again at every poll."""

    def poll(self) -> None:
        """Read the registry once and apply what changed; never raises (the replica keeps serving)."""
        try:
            changes = self.source.changes(self.engine.versions(), self.wanted)
        except Exception:  # noqa: BLE001 - a poll that fails must not end the poller
            logger.exception("The registry poll failed; serving %s as before", self.engine.versions())
            return
        if changes is None:
            return
        for task in changes.drop:
            logger.warning("%s has no version at alias %r any more (model deleted or alias removed): task %r is "
                           "no longer served", self.source.name(task), self.source.alias, task)
            self.engine.retire(task)
        for task, version in changes.load.items():
            self._load(task, version)

    def _load(self, task: str, version: int) -> None:
        """Fetch, check and serve one version; a refusal is logged (once per version) and the current state kept."""
        name, serving = self.source.name(task), self.engine.versions().get(task)
        keeps = f"still serving version {serving}" if serving is not None else f"task {task!r} stays unserved"
        capsule = None
        try:
            capsule = self.source.fetch(task, version)
            check_finite(self.source, capsule)
            self.engine.add(capsule)
        except CaptError as err:  # the version itself is bad (today): warned about once
            if capsule is not None:
                self.source.discard(capsule)
            if self.refused.get(task) != version:
                logger.warning("Version %d of %s (alias %r) is refused: %s; %s; checked again at every poll",
                               version, name, self.source.alias, str(err).rstrip("."), keeps)
            self.refused[task] = version
        except Exception as err:  # noqa: BLE001 - e.g. the server was down: tried again next poll
            logger.warning("Could not load version %d of %s (%s); %s; trying again at the next poll", version, name,
                           err, keeps)
        else:
            if self.refused.pop(task, None) == version:
                logger.info("Version %d of %s (alias %r), refused before, passes its checks now: serving it",
                               version, name, self.source.alias)
