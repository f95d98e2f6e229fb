"""Tracking plumbing that needs no MLflow: bounded retries, the pending-operation spool, run records.

A trial keeps two small files in its state directory (usually the job's output directory):

- ``mlflow_run.json``: the MLflow run this trial logs to (run id, experiment id, tracking URI). A
  restarted trial finds it and reuses the run instead of creating a duplicate.
- ``mlflow_pending.jsonl``: operations (start, params, metrics, finish, end) that could not reach the
  tracking server, one JSON object a line, in order. `pipelines.tracking.sync_pending` replays them.
  Every operation carries what it needs to be replayed later by another process (metric timestamps
  included, so a replay logs the very same points and MLflow drops exact duplicates), and the tracking URI
  it was written for (``tracking_uri``): a sync replays it into that server only (`pipelines.tracking.scope`).

Operations that failed for a reason other than an unreachable server go to ``mlflow_failed.jsonl``
(the dead-letter file: never replayed automatically; the error is logged), and so do lines of the
pending file that are not operations (a line torn by a crash during an append, a hand edit), with their
raw text, file, line number and the reason. Nothing is ever dropped from the pending file unless it
was applied or dead-lettered first.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from capt.atomic import write_atomically
from pipelines.config.schema import flatten
from pipelines.services.folder_lock import exclusive

logger = logging.getLogger(__name__)

PENDING_FILE = "mlflow_pending.jsonl"
FAILED_FILE = "mlflow_failed.jsonl"
RUN_FILE = "mlflow_run.json"
PARAM_VALUE_LIMIT = 500
"""Longest param value we send (MLflow's historical limit; newer servers take more)."""
PARAMS_PER_BATCH = 100
_TRUNCATED = "...[truncated]"
T = TypeVar("T")


class TrackingUnavailable(RuntimeError):
    """The tracking server did not answer within the retry budget."""


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff bounded by a total time budget."""

    budget_s: float = 30.0
    """Give up once this much time has passed since the first attempt (0: a single attempt)."""
    first_delay_s: float = 0.5
    """Pause after the first failure; doubles after each further failure."""
    max_delay_s: float = 8.0
    """Longest single pause."""


def call_with_retry(fn: Callable[[], T], is_transient: Callable[[BaseException], bool], policy: RetryPolicy,
                    what: str, sleep: Callable[[float], None] = time.sleep,
                    clock: Callable[[], float] = time.monotonic) -> T:
    """`fn()`, retried on transient errors until `policy.budget_s` is spent.

    Raises `TrackingUnavailable` (chained to the last error) when the budget runs out; any other error
    propagates at once. Not MLflow's own HTTP retries (`MLFLOW_HTTP_REQUEST_MAX_RETRIES`, cut to one immediate
    re-send by `client.own_http_retries`): those count attempts per request and are set for the whole process, while an
    operation here (several requests) gets a time budget of its own (`tracking.retry_s`; a single attempt while a
    tracker is offline, the full budget for a sync in the same process).
    """
    deadline = clock() + policy.budget_s
    delay, attempt = policy.first_delay_s, 1
    while True:
        try:
            return fn()
        except Exception as exc:
            if not is_transient(exc):
                raise
            remaining = deadline - clock()
            if remaining <= 0:
                raise TrackingUnavailable(f"{what}: no answer after {attempt} attempt(s) "
                                          f"in {policy.budget_s:.0f} s ({exc})") from exc
            logger.debug("%s failed (attempt %d, %s); retrying in %.1f s", what, attempt, exc, delay)
            sleep(min(delay, remaining))
            delay, attempt = min(delay * 2, policy.max_delay_s), attempt + 1


OPERATIONS = ("start", "resume", "params", "metrics", "finish", "end")
"""The kinds of operation a spool holds (the ``op`` key of each line)."""


@dataclass(frozen=True)
class SpoolLine:
    """One non-blank line of a spool file: its operation, or its raw text and why it is not one."""

    number: int
    """1-based line number in the file."""
    raw: bytes
    """The line exactly as stored, without its newline."""
    op: dict[str, Any] | None
    """The parsed operation; None when the line is corrupt."""
    reason: str | None = None
    """Why the line is not an operation (None when it is one)."""


def _parse_line(number: int, raw: bytes) -> SpoolLine:
    try:
        op = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        return SpoolLine(number, raw, None, f"not UTF-8 text ({err.reason} at byte {err.start})")
    except json.JSONDecodeError as err:
        return SpoolLine(number, raw, None, f"not valid JSON ({err.msg} at column {err.colno}); a line torn "
                                            "by a crash while it was being written looks like this")
    if not isinstance(op, dict) or op.get("op") not in OPERATIONS:
        return SpoolLine(number, raw, None, "not a tracking operation (a JSON object whose 'op' is one of "
                                            f"{', '.join(OPERATIONS)})")
    return SpoolLine(number, raw, op)


class Spool:
    """An append-only JSON-lines file of pending operations, guarded by an advisory file lock.

    Nothing here deletes a line it cannot parse: `first` hands a corrupt line to the caller like any
    other, and `quarantine` moves corrupt lines to another spool (the dead-letter file) before removing
    them. Every write holds the lock, so an append never races a rewrite.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock_path = self.path.with_name(self.path.name + ".lock")

    def locked(self) -> contextlib.AbstractContextManager[None]:
        """Hold an exclusive lock on the file (not re-entrant: never nest two on one spool)."""
        return exclusive(self._lock_path)

    def append(self, op: Mapping[str, Any]) -> None:
        """Add one operation durably (flushed and fsynced).

        A torn last line (a crash during an earlier append) is first closed with a newline, so that it
        stays a line of its own (dead-lettered later) instead of swallowing this operation.
        """
        line = json.dumps(op, default=str).encode("utf-8") + b"\n"
        with self.locked(), self.path.open("ab") as handle:
            if handle.tell() > 0:
                with self.path.open("rb") as tail:
                    tail.seek(-1, os.SEEK_END)
                    line = line if tail.read(1) == b"\n" else b"\n" + line
            handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())

    def lines(self) -> list[SpoolLine]:
        """Every non-blank line in order, corrupt ones included (their `op` is None)."""
        try:  # read without the lock (e.g. `TrialTracker.finished`): a flush may remove the file meanwhile
            data = self.path.read_bytes().split(b"\n")
        except (FileNotFoundError, IsADirectoryError):
            return []
        return [_parse_line(number, raw) for number, raw in enumerate(data, 1) if raw.strip()]

    def read(self) -> list[dict[str, Any]]:
        """The operations in order; corrupt lines are left out here but stay in the file (see `lines`)."""
        return [line.op for line in self.lines() if line.op is not None]

    def records(self) -> list[dict[str, Any]]:
        """Every non-blank line as JSON (for the dead-letter file, whose entries are not operations)."""
        if not self.path.is_file():
            return []
        text = self.path.read_text(encoding="utf-8", errors="backslashreplace")
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def first(self) -> SpoolLine | None:
        """The first non-blank line (parsed or corrupt), or None when the spool is empty."""
        with self.locked():
            lines = self.lines()
        return lines[0] if lines else None

    def drop_first(self, expected: SpoolLine) -> None:
        """Remove the first line, which must still be `expected` (lines appended meanwhile are kept)."""
        with self.locked():
            lines = self.lines()
            if not lines or lines[0].raw != expected.raw:
                raise RuntimeError(f"{self.path} changed under a replay: its first line is no longer line "
                                   f"{expected.number}; nothing was removed")
            self._rewrite(line.raw for line in lines[1:])

    def quarantine(self, dead_letters: Spool) -> int:
        """Move every corrupt line to `dead_letters` (raw text, file, line number, reason); return how many.

        The dead letters are written (fsynced) before the lines leave this file: a crash in between
        leaves a line in both files, never in neither.
        """
        with self.locked():
            lines = self.lines()
            corrupt = [line for line in lines if line.op is None]
            for line in corrupt:  # enough to inspect and repair it by hand
                dead_letters.append({"raw": line.raw.decode("utf-8", errors="backslashreplace"), "file": str(self.path),
                                     "line": line.number, "reason": line.reason,
                                     "dead_lettered_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
            if corrupt:
                self._rewrite(line.raw for line in lines if line.op is not None)
        for line in corrupt:
            logger.error("%s:%d is %s; moved to %s", self.path, line.number, line.reason, dead_letters.path)
        return len(corrupt)

    def _rewrite(self, raws: Iterable[bytes]) -> None:
        """Atomically replace the file's content (caller holds the lock); no lines removes the file."""
        data = b"".join(raw + b"\n" for raw in raws)
        if not data:
            self.path.unlink(missing_ok=True)
            return
        write_atomically(self.path, data)

    def __len__(self) -> int:
        """How many lines wait here, corrupt ones included."""
        return len(self.lines())


def read_run_record(state_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The run record of a trial (`mlflow_run.json`), or None when it has no run yet."""
    path = Path(state_dir) / RUN_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def write_run_record(state_dir: str | os.PathLike[str], record: Mapping[str, Any]) -> None:
    path = Path(state_dir) / RUN_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, json.dumps(dict(record), indent=2))


def param_strings(params: Mapping[str, Any]) -> dict[str, str]:
    """Flatten nested dicts and stringify values (JSON for lists), truncating values to the limit."""
    out = {}
    for key, value in flatten(dict(params)).items():
        text = json.dumps(value) if isinstance(value, list | tuple | dict) else str(value)
        if len(text) > PARAM_VALUE_LIMIT:
            text = text[:PARAM_VALUE_LIMIT - len(_TRUNCATED)] + _TRUNCATED
        out[str(key)] = text
    return out
