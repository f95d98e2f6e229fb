"""A replica's poll: what the registry's alias names now, applied to the running engine without a restart.

Every poll the replica serves what ``capt-<model>-<task>@<alias>`` names: a moved alias's version, a task
registered (or given the alias) since the start, and no task whose registered model was deleted or lost the
alias. A version to load passes the checks of the start (`RegistrySource.fetch`: digests and provenance;
`preflight.check_finite`: finite values; the engine: base model, method and fit to the loaded weights). One
that fails is skipped with a warning, once per version, and whatever was served keeps answering: a bad capsule
in the registry never takes a replica down. A refused version is fetched again at every poll while the alias names
it (a store repaired since serves it; its refused copy is not kept), and said again only once it passes.
"""

from __future__ import annotations

import logging
from collections.abc import Collection

from capt.errors import CaptError
from pipelines.serving.engine import CapsuleEngine
from pipelines.serving.preflight import check_finite
from pipelines.serving.source import RegistrySource

logger = logging.getLogger(__name__)


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
