"""`sync_pending`: replay the spools of every trial under a folder and say, per folder, what happened.

Nothing is deleted: an operation leaves a trial's ``mlflow_pending.jsonl`` only once the server took it
or once it was written to the trial's ``mlflow_failed.jsonl`` (the dead-letter file) with the reason.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import requests
from mlflow.exceptions import MlflowException

from pipelines.tracking import spool
from pipelines.tracking.client import TrackingError, dir_lock, is_transient, own_http_retries
from pipelines.tracking.operations import Replayer

logger = logging.getLogger(__name__)


@dataclass
class FolderSync:
    """What a sync did in one trial's state directory."""

    state_dir: Path
    synced: int = 0
    """Operations applied to the server by this sync."""
    dead_lettered: int = 0
    """Operations and corrupt lines this sync moved to the dead-letter file."""
    pending: int = 0
    """Lines still in the pending file afterwards."""
    dead_letters: int = 0
    """Entries in the dead-letter file afterwards (this sync's and earlier ones)."""
    error: str | None = None
    """Why this folder's replay stopped early (None when it ran to the end)."""


def _total(name: str, doc: str) -> property:
    """A read-only sum of `FolderSync.<name>` over a summary's folders."""
    return property(lambda summary: sum(getattr(f, name) for f in summary.folders), doc=doc)


@dataclass
class SyncSummary:
    """Per-folder results of `sync_pending`, with totals."""

    root: Path
    folders: list[FolderSync] = field(default_factory=list)
    synced = _total("synced", "Operations applied by this sync, all folders together.")
    dead_lettered = _total("dead_lettered", "Operations and lines this sync dead-lettered, all folders together.")
    pending = _total("pending", "Lines still pending, all folders together.")
    dead_letters = _total("dead_letters", "Entries in dead-letter files, all folders together.")

    @property
    def complete(self) -> bool:
        """True when everything under the root reached the server: nothing pending, no dead letter."""
        return self.pending == 0 and self.dead_letters == 0


def sync_pending(root: str | os.PathLike[str], tracking_uri: str | None = None,
                 retry: spool.RetryPolicy | None = None) -> SyncSummary:
    """Replay the spools of `root` (a trial's state dir, or any folder above several).

    Every folder is tried; a server that did not answer within the retry budget is not asked again for
    the later folders that use it (they are reported pending with the same error). What was applied
    stays applied. Raises `TrackingError` when `root` is not a directory.
    """
    root = Path(root)
    if not root.is_dir():
        raise TrackingError(f"--root {str(root)!r} is not a directory{'' if root.exists() else ' (it does not exist)'}. "
                            "Give the output folder of a job or a sweep (or any folder above them): the "
                            f"folders holding {spool.PENDING_FILE} under it are synced.")
    own_http_retries()
    summary, unreachable = SyncSummary(root), {}
    for state_dir in spool.find_state_dirs(root, (spool.PENDING_FILE, spool.FAILED_FILE)):
        summary.folders.append(_sync_folder(state_dir, tracking_uri, retry or spool.RetryPolicy(), unreachable))
    return summary


def _sync_folder(state_dir: Path, tracking_uri: str | None, retry: spool.RetryPolicy,
                 unreachable: dict[str, str]) -> FolderSync:
    """Replay one folder's spool (unless its server already failed to answer) and count what is left."""
    folder, replayer = FolderSync(state_dir), Replayer(state_dir, tracking_uri)
    pending = spool.Spool(state_dir / spool.PENDING_FILE)
    with dir_lock(state_dir):
        ops = pending.read()
        uri = (tracking_uri or ops[0].get("tracking_uri") or os.environ.get("MLFLOW_TRACKING_URI")) if ops else None
        if uri is not None and uri in unreachable:
            folder.error = unreachable[uri]
        elif pending.path.exists():
            try:
                spool.call_with_retry(replayer.replay, is_transient, retry, f"MLflow at {uri}")
            except spool.TrackingUnavailable as err:
                unreachable[uri or ""] = folder.error = str(err)
            except (TrackingError, MlflowException, requests.RequestException, OSError, RuntimeError) as err:
                folder.error = f"{type(err).__name__}: {err}"
                logger.debug("Sync of %s stopped", state_dir, exc_info=err)
        folder.synced, folder.dead_lettered = replayer.synced, replayer.dead_lettered
        folder.pending, folder.dead_letters = len(pending), len(spool.Spool(state_dir / spool.FAILED_FILE))
    logger.info("%s: %d synced, %d dead-lettered, %d pending", state_dir, folder.synced, folder.dead_lettered,
                folder.pending)
    return folder
