"""Tracking plumbing that needs no MLflow: bounded retries, the pending-operation spool, run records.

A trial keeps two small files in its state directory (usually the job's output directory):

- ``mlflow_run.json``: the MLflow run this trial logs to (run id, experiment id, tracking URI). A
  restarted trial finds it and reuses the run instead of creating a duplicate.
- ``mlflow_pending.jsonl``: operations (start, params, metrics, finish, end) that could not reach the
  tracking server, one JSON object a line, in order. `pipelines.tracking.sync_pending` replays them.
  Every operation carries what it needs to be replayed later by another process (metric timestamps
  included, so a replay logs the very same points and MLflow drops exact duplicates).

Operations that failed for a reason other than an unreachable server go to ``mlflow_failed.jsonl``
(never replayed automatically; the error is logged).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pipelines.config import flatten

logger = logging.getLogger(__name__)

PENDING_FILE = "mlflow_pending.jsonl"
FAILED_FILE = "mlflow_failed.jsonl"
RUN_FILE = "mlflow_run.json"
PARAM_VALUE_LIMIT = 500
"""Longest param value we send (MLflow's historical limit; newer servers take more)."""
PARAMS_PER_BATCH = 100
METRICS_PER_BATCH = 1000
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
    propagates at once.
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


class Spool:
    """An append-only JSON-lines file of pending operations, guarded by an advisory file lock."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock_path = self.path.with_name(self.path.name + ".lock")

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold an exclusive lock (a tracker and a `sync` never replay the same file at once)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock_path.open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def append(self, op: Mapping[str, Any]) -> None:
        """Add one operation durably (flushed and fsynced)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(op, default=str) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def read(self) -> list[dict[str, Any]]:
        """The pending operations in order; a torn last line (crash while writing) is skipped."""
        if not self.path.is_file():
            return []
        ops = []
        for number, line in enumerate(self.path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                ops.append(json.loads(line))
            except json.JSONDecodeError:
                logger.warning("%s:%d is not valid JSON (interrupted write?); skipped", self.path, number)
        return ops

    def replace(self, ops: list[dict[str, Any]]) -> None:
        """Atomically rewrite the file with `ops`; an empty list removes it."""
        if not ops:
            self.path.unlink(missing_ok=True)
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text("".join(json.dumps(op, default=str) + "\n" for op in ops), encoding="utf-8")
        os.replace(tmp, self.path)

    def __len__(self) -> int:
        return len(self.read())


def read_run_record(state_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The run record of a trial (`mlflow_run.json`), or None when it has no run yet."""
    path = Path(state_dir) / RUN_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def write_run_record(state_dir: str | os.PathLike[str], record: Mapping[str, Any]) -> None:
    """Write `mlflow_run.json` atomically."""
    path = Path(state_dir) / RUN_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(RUN_FILE + ".tmp")
    tmp.write_text(json.dumps(dict(record), indent=2), encoding="utf-8")
    os.replace(tmp, path)


def find_state_dirs(root: str | os.PathLike[str]) -> list[Path]:
    """`root` itself if it holds a pending file, plus every directory below it that does (sorted)."""
    root = Path(root)
    found = {p.parent for p in root.rglob(PENDING_FILE)} if root.is_dir() else set()
    return sorted(found)


def param_strings(params: Mapping[str, Any]) -> dict[str, str]:
    """Flatten nested dicts and stringify values (JSON for lists), truncating values to the limit."""
    out = {}
    for key, value in flatten(dict(params)).items():
        text = json.dumps(value) if isinstance(value, list | tuple | dict) else str(value)
        if len(text) > PARAM_VALUE_LIMIT:
            text = text[:PARAM_VALUE_LIMIT - len(_TRUNCATED)] + _TRUNCATED
        out[str(key)] = text
    return out


def numeric_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Numbers only (bools as 0/1), without the `step` key; NaN and infinities are dropped."""
    out = {}
    for key, value in metrics.items():
        if key == "step" or not isinstance(value, int | float):
            continue
        value = float(value)
        if math.isfinite(value):
            out[key] = value
    return out


_RESULT_SCALARS = ("steps", "epochs", "best_step", "stopped_early", "wall_time_s", "tokens_per_second",
                   "peak_memory_mb", "trainable_parameters")


def final_metrics(result: Mapping[str, Any]) -> dict[str, float]:
    """The metrics a finished trial logs: `result["metrics"]` plus throughput, memory and size figures."""
    scalars = {key: result[key] for key in _RESULT_SCALARS if key in result}
    return {**numeric_metrics(result.get("metrics", {})), **numeric_metrics(scalars)}


def registered_model_name(model_slug: str, task: str) -> str:
    """The registry name of the capsules of one (base model, task): `capt-<model-slug>-<task>`."""
    return f"capt-{model_slug}-{task}"


def chunks(items: list[T], size: int) -> Iterator[list[T]]:
    """Consecutive slices of at most `size` items."""
    for start in range(0, len(items), size):
        yield items[start:start + size]
