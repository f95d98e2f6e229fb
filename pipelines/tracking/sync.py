"""`sync_pending`: replay the spools of every trial under a folder and say, per folder, what happened.

Nothing is deleted: an operation leaves a trial's ``mlflow_pending.jsonl`` only once the server took it
or once it was written to the trial's ``mlflow_failed.jsonl`` (the dead-letter file) with the reason.
Which folders and which operations a sync may touch: `pipelines.tracking.scope` (a job or sweep folder tree,
never left through a link; only operations recorded for the server synced to).
A sweep folder holding the close of its parent run that the server did not take at the sweep's end
(`sweep_run.SWEEP_CLOSE_FILE`) gets it applied after its trials' spools, on the same rules, and the file removed.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import requests
from mlflow.exceptions import MlflowException

from pipelines.tracking import scope, spool
from pipelines.tracking.client import TrackingError, dir_lock, is_transient, mlflow_client, own_http_retries
from pipelines.tracking.operations import Replayer
from pipelines.tracking.run_content import RUN_KIND_TAG
from pipelines.tracking.sweep_run import SWEEP_CLOSE_FILE, SweepClose, log_close, read_close

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
    skipped: str | None = None
    """Why this folder's spool was left whole, unread by any server (None when it was replayed)."""


@dataclass
class SweepRunSync:
    """What a sync did with the parent-run close kept in a sweep folder."""

    sweep_dir: Path
    close: SweepClose | None = None
    """The close kept there (None: the file was refused, see `error`)."""
    uri: str | None = None
    """The server the run was closed on (None: it is not closed yet)."""
    waiting: int = 0
    """Its trials' operations still pending: the run is closed after them, by a later sync."""
    skipped: str | None = None
    """Why the close is not for this sync's server (None when it is)."""
    error: str | None = None
    """Why the close failed (None when it went through or was not tried)."""


def _total(name: str, doc: str) -> property:
    """A read-only sum of `FolderSync.<name>` over a summary's folders."""
    return property(lambda summary: sum(getattr(f, name) for f in summary.folders), doc=doc)


@dataclass
class SyncSummary:
    """Per-folder results of `sync_pending`, with totals."""

    root: Path
    server: scope.ServerScope = field(default_factory=scope.ServerScope)
    """Where the operations went (`ServerScope.target` None: each to the server recorded with it)."""
    folders: list[FolderSync] = field(default_factory=list)
    links: list[Path] = field(default_factory=list)
    """Symbolic links under the root that were not followed (to folders, or named like a spool)."""
    sweeps: list[SweepRunSync] = field(default_factory=list)
    """The sweep folders whose parent run waited to be closed."""
    synced = _total("synced", "Operations applied by this sync, all folders together.")
    dead_lettered = _total("dead_lettered", "Operations and lines this sync dead-lettered, all folders together.")
    pending = _total("pending", "Lines still pending, all folders together.")
    dead_letters = _total("dead_letters", "Entries in dead-letter files, all folders together.")

    @property
    def skipped(self) -> int:
        """Lines still pending in the folders whose spool was left whole (counted in `pending` too)."""
        return sum(folder.pending for folder in self.folders if folder.skipped)

    @property
    def complete(self) -> bool:
        """True when everything under the root reached the server: nothing pending, no dead letter, every sweep's
        run closed."""
        return self.pending == 0 and self.dead_letters == 0 and all(s.uri for s in self.sweeps)


def sync_pending(root: str | os.PathLike[str], tracking_uri: str | None = None,
                 retry: spool.RetryPolicy | None = None, *, moved_from: tuple[str, ...] = (),
                 accept_unrecorded: bool = False) -> SyncSummary:
    """Replay the spools under `root` (a job folder, a sweep folder, or a folder at most two levels above them).

    With `tracking_uri`, only operations recorded for that server (or for one of `moved_from`) go there; without,
    each goes to the server recorded with it. Operations recorded for no server go to `tracking_uri` (else
    MLFLOW_TRACKING_URI) only when `accept_unrecorded`. A folder with any other operation is skipped whole and
    listed. Every folder is tried; a server that did not answer within the retry budget is not asked again for
    the later folders that use it (they are reported pending with the same error). What was applied stays
    applied. Then each sweep folder's kept parent-run close is applied on the same rules, once its trials have
    nothing pending (`SweepRunSync`). Raises `TrackingError`, before reading anything below it, when `root` is not
    such a folder.
    """
    root = checked_root(root)
    unrecorded = (tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")) if accept_unrecorded else None
    server = scope.ServerScope(tracking_uri, tuple(moved_from) if tracking_uri else (), unrecorded)
    own_http_retries()
    spools = (spool.PENDING_FILE, spool.FAILED_FILE)
    found, links = scope.state_dirs(root, (*spools, SWEEP_CLOSE_FILE))
    summary, unreachable, retry = SyncSummary(root, server, links=links), {}, retry or spool.RetryPolicy()
    for link in links:
        logger.info("Not followed (sync never leaves --root): %s -> %s", link, os.readlink(link))
    for state_dir in _holding(found, spools):
        summary.folders.append(_sync_folder(state_dir, server, retry, unreachable))
    for sweep_dir in _holding(found, (SWEEP_CLOSE_FILE,)):
        summary.sweeps.append(_close_sweep_run(sweep_dir, summary, retry, unreachable))
    return summary


def _holding(folders: list[Path], names: tuple[str, ...]) -> list[Path]:
    """The `folders` holding one of `names` as a regular file (not a link)."""
    return [folder for folder in folders
            if any((folder / name).is_file() and not (folder / name).is_symlink() for name in names)]


def checked_root(root: str | os.PathLike[str]) -> Path:
    """`root` resolved; TrackingError when it may not be synced (`pipelines.tracking.scope`), saying what may be."""
    given = Path(root).expanduser()
    resolved, home = given.resolve(), Path.home().resolve()
    if not given.exists():
        why = "it does not exist"
    elif not given.is_dir():
        why = "it is not a directory"
    elif resolved.parent == resolved:
        why = "it is a filesystem root"
    elif resolved == home or resolved in home.parents:
        why = "it is the home folder" if resolved == home else f"it is above the home folder {home}"
    elif not scope.has_marker(resolved):
        why = f"neither it nor any folder up to {scope.MARKER_DEPTH} levels below it is a job folder or a sweep folder"
    else:
        return resolved
    raise TrackingError(
        f"--root {str(given)!r} is refused: {why}. Give the output folder "
        f"of a job (it holds {', '.join(sorted(scope.JOB_MARKERS))}), a sweep folder (<storage_path>/<name>, "
        f"holding {', '.join(sorted(scope.SWEEP_MARKERS))} and jobs/), or a folder at most {scope.MARKER_DEPTH} "
        "levels above one, such as outputs/sweeps; never a filesystem root or the home folder. Nothing was synced.")


CREDENTIAL_ENV = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN")
"""The variables MLflow's client sends to every server it calls (HTTP Basic or a bearer token)."""


def why_left_alone(server: scope.ServerScope, ops: list[dict], uri: str | None) -> str | None:
    """Why operations `ops`, bound for `uri`, are left alone: not for `server` (`ServerScope.refusal`), or the
    operator's MLflow credentials are set and `uri` is a server only the folder's own records name (not
    --tracking-uri, not MLFLOW_TRACKING_URI): a file must never decide where the operator's credentials go. None
    when they may be sent."""
    if (why := server.refusal(ops)) or not uri:
        return why
    held = [name for name in CREDENTIAL_ENV if os.environ.get(name)]
    named = [u for u in (server.target, os.environ.get("MLFLOW_TRACKING_URI")) if u]
    if not held or any(scope.same_server(uri, given) for given in named):
        return None
    return (f"its operations are recorded for {uri}, a server that only the folder's records name, and "
            f"{', '.join(held)} {'is' if len(held) == 1 else 'are'} set: your credentials are never sent to a server "
            f"you did not name. Sync it with --tracking-uri {uri} (your credentials then go there), or without "
            "those variables")


def _attempt(work: Callable[[], object], uri: str | None, retry: spool.RetryPolicy,
             unreachable: dict[str, str]) -> str | None:
    """`work()` against `uri`, retried within `retry`; None when it went through, else why not. A server that did
    not answer is remembered in `unreachable` and not asked again by this sync."""
    if uri is not None and uri in unreachable:
        return unreachable[uri]
    try:
        spool.call_with_retry(work, is_transient, retry, f"MLflow at {uri}")
    except spool.TrackingUnavailable as err:
        unreachable[uri or ""] = str(err)
        return str(err)
    except (TrackingError, MlflowException, requests.RequestException, OSError, RuntimeError) as err:
        logger.debug("Sync against %s stopped", uri, exc_info=err)
        return f"{type(err).__name__}: {err}"
    return None


def _sync_folder(state_dir: Path, server: scope.ServerScope, retry: spool.RetryPolicy,
                 unreachable: dict[str, str]) -> FolderSync:
    """Replay one folder's spool (unless it is not for `server`, or its server already failed to answer) and count
    what is left."""
    folder, replayer = FolderSync(state_dir), Replayer(state_dir, server)
    pending = spool.Spool(state_dir / spool.PENDING_FILE)
    with dir_lock(state_dir):
        ops = pending.read()
        uri = server.destination(ops[0]) if ops else None
        folder.skipped = why_left_alone(server, ops, uri)
        if folder.skipped:
            logger.warning("%s skipped: %s", state_dir, folder.skipped)
        elif pending.path.exists():
            folder.error = _attempt(replayer.replay, uri, retry, unreachable)
        folder.synced, folder.dead_lettered = replayer.synced, replayer.dead_lettered
        folder.pending, folder.dead_letters = len(pending), len(spool.Spool(state_dir / spool.FAILED_FILE))
    logger.info("%s: %d synced, %d dead-lettered, %d pending", state_dir, folder.synced, folder.dead_lettered,
                folder.pending)
    return folder


def _close_sweep_run(sweep_dir: Path, summary: SyncSummary, retry: spool.RetryPolicy,
                     unreachable: dict[str, str]) -> SweepRunSync:
    """Apply the parent-run close kept in `sweep_dir` (`SweepRunSync` says why not: refused file, not this sync's
    server, trials still pending, no answer) and remove it once the server took it."""
    result = SweepRunSync(sweep_dir)
    result.waiting = sum(f.pending for f in summary.folders if sweep_dir in f.state_dir.parents)
    with dir_lock(sweep_dir):
        try:
            result.close = close = read_close(sweep_dir)
        except (OSError, ValueError) as err:
            result.error = (f"{SWEEP_CLOSE_FILE} is refused ({err}); nothing of it was sent: fix it, or delete it "
                            "and close the run in the MLflow UI")
            return result
        uri = summary.server.destination({"tracking_uri": close.tracking_uri})
        result.skipped = why_left_alone(summary.server, [{"tracking_uri": close.tracking_uri}], uri)
        if result.skipped or result.waiting:
            return result
        result.error = _attempt(lambda: _apply_close(uri, sweep_dir, close), uri, retry, unreachable)
        if result.error:
            return result
        (sweep_dir / SWEEP_CLOSE_FILE).unlink()
    result.uri = uri
    logger.info("Closed the sweep's run %s (%s) at %s", close.run_id, close.status, uri)
    return result


def _apply_close(uri: str, sweep_dir: Path, close: SweepClose) -> None:
    """`log_close` to the run at `uri`, once it is known there as a sweep's run."""
    client = mlflow_client(uri)
    run = client.get_run(close.run_id)
    if run.data.tags.get(RUN_KIND_TAG) != "sweep":
        raise TrackingError(f"run {close.run_id} at {uri} is not a sweep's run ({RUN_KIND_TAG} is not 'sweep')")
    log_close(client, sweep_dir, close)
