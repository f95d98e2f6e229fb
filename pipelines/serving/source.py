"""Where served capsules come from: the registry versions an alias names, read again at every poll, each fetched and
checked before it is served.

A replica loads its capsules only once Ray and Serve are up, a minute into the start; a capsule that fails there
surfaces as Serve's "Failed to update the deployments". The driver therefore downloads each version first and
runs the same verification the replicas run (`RegistrySource.fetch`: digests against the version's and its run's
tags, provenance against the registered name), then checks that every tensor file holds only finite values
(`check_capsules`). The capsule's fit to the base model's weights stays the replica's check: it needs the loaded
model.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from capt.errors import CaptError
from capt.tasks.registry import TASK_NAMES
from pipelines.config.schema import model_slug
from pipelines.provenance import registered_model_name
from pipelines.serving.records import ServedCapsule
from pipelines.tracking import TrackingError
from pipelines.tracking.registry import (
    alias_version,
    download_verified_version,
    registered_names,
    version_tags,
)

logger = logging.getLogger(__name__)


class ServeError(CaptError, ValueError):
    """The Serve app cannot start as asked; the message names the option and the fix."""


@dataclass
class RegistrySource:
    """The capsules `capt-<slug(model)>-<task>@<alias>` of a tracking server, downloaded below `root`."""

    uri: str
    model: str
    alias: str
    root: str | os.PathLike[str]

    def name(self, task: str) -> str:
        """The registered model of `task` for this base model."""
        return registered_model_name(model_slug(self.model), task)

    def registered_tasks(self) -> list[str]:
        """Tasks with a registered model for this base model (any version, any alias)."""
        prefix = registered_model_name(model_slug(self.model), "")
        names = set(registered_names(self.uri, prefix))
        return [task for task in TASK_NAMES if self.name(task) in names]

    def check(self, tasks: list[str]) -> dict[str, int]:
        """The version at the alias of every task; ServeError naming what is missing and how to fix it."""
        if not tasks:
            raise ServeError("--tasks: no task given; name tasks (--tasks rte,cb) or pass --all.")
        if unknown := [t for t in tasks if t not in TASK_NAMES]:
            raise ServeError(f"--tasks: unknown task(s) {', '.join(map(repr, unknown))}; "
                             f"tasks: {', '.join(TASK_NAMES)}.")
        registered = self.registered_tasks()
        if not registered:
            raise ServeError(
                f"--model {self.model!r}: no capsule of this base model is registered at {self.uri} (no registered "
                f"model named {self.name('<task>')!r}). Registered capsule models there: "
                f"{', '.join(registered_names(self.uri, 'capt-')) or 'none'}. Run a sweep with tracking on first, "
                "or check --model (a name like google-t5/t5-base or its slug t5-base) and --tracking-uri.")
        versions = {}
        for task in tasks:
            if task not in registered:
                raise ServeError(f"--tasks: no capsule of {self.model!r} for task {task!r} is registered at "
                                 f"{self.uri}; registered tasks of this model: {', '.join(registered)}.")
            version = self.check_alias(task)
            if version is None:
                raise ServeError(f"--alias {self.alias!r}: {self.name(task)} has no version with this alias at "
                                 f"{self.uri}. Promote one first: python -m pipelines.promote --model {self.model} "
                                 f"--task {task}.")
            versions[task] = version
        # one base model (two hub ids can share a slug); the replica also checks every capsule's fingerprint against
        # the base model it loads
        bases = self.base_models(versions)
        if len(set(bases.values()) - {None}) > 1:
            listed = ", ".join(f"{self.name(t)}@{self.alias} on {b!r}" for t, b in bases.items())
            raise ServeError(f"--model {self.model!r}: the capsules to serve were trained on different base models "
                             f"({listed}); one server holds one base model. Serve them separately.")
        return versions

    def check_alias(self, task: str) -> int | None:
        """The version the alias names in the task's registered model (None: no such alias)."""
        return alias_version(self.uri, self.name(task), self.alias)

    def base_models(self, versions: dict[str, int]) -> dict[str, str | None]:
        """{task: the base model its version was trained on, as the version's tags say (None: not tagged)}."""
        return {task: version_tags(self.uri, self.name(task), v).get("base_model") for task, v in versions.items()}

    def fetch(self, task: str, version: int) -> ServedCapsule:
        """Download `version` of the task's registered model, verify it (`verify_version`), describe it for the engine.

        Called at start and at every hot reload: a version that fails verification is never served (at a reload,
        the version being served keeps answering)."""
        found = download_verified_version(self.uri, self.name(task), version, self.root)
        return ServedCapsule(task, task, found.name, found.version, found.capsule_dir, found.result, found.digest)

    def discard(self, capsule: ServedCapsule) -> None:
        """Remove the download folder of a fetched version that was then refused (a later poll fetches it afresh)."""
        root = Path(self.root).resolve()
        inside = Path(capsule.capsule_dir).resolve().relative_to(root)
        shutil.rmtree(root / inside.parts[0], ignore_errors=True)

    def changes(self, serving: dict[str, int], wanted: Collection[str] | None = None) -> Changes | None:
        """What a poll must do to `serving` ({task: version}) so that it serves what the alias names now: load the
        version of a moved alias or of a newly registered task (only tasks in `wanted`; None: every task), drop the
        tasks whose registered model was deleted or lost the alias. None when the registry cannot be listed
        (everything served keeps answering).

        One search over the registered models with this base model's prefix, then one alias read per task that has
        a registered model: never a call per task that could exist.
        """
        try:
            registered = set(self.registered_tasks())
        except Exception as err:  # noqa: BLE001 - whatever failed, the versions served keep answering
            logger.warning("Cannot list the registered models %s at %s (%s); still serving %s", self.name("<task>"),
                           self.uri, err, serving)
            return None
        found = Changes({}, [task for task in serving if task not in registered])
        for task in (t for t in TASK_NAMES if t in registered and (wanted is None or t in wanted)):
            try:
                version = self.check_alias(task)
            except TrackingError:  # deleted between the search and this read
                version = None
            except Exception as err:  # noqa: BLE001 - the version served keeps answering
                logger.warning("Cannot read %s@%s (%s); serving it as before", self.name(task), self.alias, err)
                continue
            if version is None and task in serving:
                found.drop.append(task)
            elif version is not None and version != serving.get(task):
                found.load[task] = version
        return found


@dataclass
class Changes:
    """What one poll found: versions to load (moved aliases, new tasks) and tasks to drop."""

    load: dict[str, int]
    """{task: version} of a moved alias or a task registered (or given the alias) since the last poll."""
    drop: list[str]
    """Tasks served whose registered model was deleted or no longer has the alias."""


class UnservableCapsuleError(CaptError, RuntimeError):
    """A version to serve failed the driver's check; the message names the version, the file and why."""


def check_capsules(source: RegistrySource, versions: dict[str, int]) -> None:
    """Fetch and verify every (task, version) in a scratch folder; raise on the first that cannot be served."""
    with tempfile.TemporaryDirectory(prefix="capt-serve-check-") as scratch:
        checking = RegistrySource(source.uri, source.model, source.alias, root=scratch)
        for task, version in sorted(versions.items()):
            check_finite(checking, checking.fetch(task, version))


def check_finite(source: RegistrySource, fetched: ServedCapsule) -> None:
    """UnservableCapsuleError when a tensor file of a fetched capsule holds NaN or infinite values (the driver
    checks this before start, a replica's poll before it serves a new version or task)."""
    import torch
    from safetensors.torch import load_file

    for weights in sorted(Path(fetched.capsule_dir).glob("*.safetensors")):
        bad = [name for name, tensor in load_file(str(weights)).items()
               if tensor.is_floating_point() and not torch.isfinite(tensor).all()]
        if bad:
            raise UnservableCapsuleError(
                f"Version {fetched.version} of {fetched.model_name}: {weights.name} holds NaN or infinite values in "
                f"{', '.join(bad)}; it cannot be served. Promote another version (python -m "
                f"pipelines.promote --model {source.model} --task {fetched.task}) or retrain it.")
