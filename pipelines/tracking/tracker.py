"""`TrialTracker`: one trial's MLflow run, spooling operations while the server is unreachable and uploading them
from a thread of its own (`BackgroundUploader`) while training goes on."""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pipelines.tracking.client import dir_lock, is_transient, mlflow_client, now_ms, own_http_retries
from pipelines.tracking.experiment import run_url as ui_run_url
from pipelines.tracking.operations import Replayer, dead_letter
from pipelines.tracking.run_content import (
    final_metrics,
    mlflow_metric_name,
    mlflow_metrics,
    numeric_metrics,
    project_metric_name,
)
from pipelines.tracking.scope import ServerScope
from pipelines.tracking.spool import (
    FAILED_FILE,
    PENDING_FILE,
    RetryPolicy,
    Spool,
    TrackingUnavailable,
    call_with_retry,
    param_strings,
    read_run_record,
)

logger = logging.getLogger(__name__)


class TrialTracker:
    """One trial's MLflow run, from world rank 0 only; a restarted trial (same `state_dir`) reuses it.

    Never raises for tracking problems: an unreachable server spools operations (see the package
    docstring), any other failure is logged and kept in ``mlflow_failed.jsonl``. `log_metrics` never
    waits for the server: it appends the points to the spool and a background thread uploads them
    (`BackgroundUploader`); `finish` and `fail` upload what is left first, and `finish` logs what the
    thread could not upload (also in `background_problems`). With
    ``system_metrics``, MLflow samples CPU/GPU/memory every ``system_metrics_interval_s`` while the
    run is live (``system/...``); what was sampled since the last upload is uploaded when the run ends,
    so even a run shorter than one interval has its point. Metric names are the project's (``test_score``)
    and logged under MLflow's grouped names (``test/score``, `pipelines.tracking.run_content`).
    ``ui_uri``: the server a registered version's loading snippet names (default: `tracking_uri`).
    ``moved_from``: earlier addresses of the same server, whose spooled operations go to `tracking_uri`.
    """

    def __init__(self, tracking_uri: str, experiment: str, run_name: str, tags: Mapping[str, Any],
                 state_dir: str | os.PathLike[str], *, retry: RetryPolicy | None = None,
                 reconnect_s: float = 60.0, system_metrics: bool = True,
                 system_metrics_interval_s: float = 10.0, ui_uri: str | None = None,
                 moved_from: tuple[str, ...] = ()) -> None:
        self.tracking_uri = tracking_uri
        self.experiment = experiment
        self.run_name = run_name
        self.tags = {str(k): str(v) for k, v in tags.items()}
        self.state_dir = Path(state_dir).resolve()
        self.retry = retry or RetryPolicy()
        self.reconnect_s = reconnect_s
        self.system_metrics = system_metrics
        self.system_metrics_interval_s = system_metrics_interval_s
        self.ui_uri = ui_uri or tracking_uri
        self.spool = Spool(self.state_dir / PENDING_FILE)
        self.run_id: str | None = None
        self.offline = False
        self.model_version: str | None = None
        self._failed_at = 0.0
        self._monitor: Any = None
        # Its own folder: each spooled operation goes to the server it was recorded for, or, when that is an
        # earlier address of this server (`moved_from`: a local store served again at a new port), here.
        scope = (ServerScope(tracking_uri, moved_from, tracking_uri) if moved_from
                 else ServerScope(unrecorded=tracking_uri))
        self._replayer = Replayer(self.state_dir, scope)
        self._lock = threading.Lock()  # one upload at a time: the training thread's or the uploader's
        self._uploader = BackgroundUploader(self._upload_spooled, f"mlflow-upload-{run_name}")
        self._refused_in_background = 0
        own_http_retries()

    @property
    def finished(self) -> bool:
        """Whether this trial's run was already finished (or its finish is spooled): nothing more to log."""
        record = read_run_record(self.state_dir)
        if record is not None and record.get("status") == "FINISHED":
            return True
        return any(op["op"] == "finish" for op in self.spool.read())

    def start(self) -> str | None:
        """Create (or, for a restarted trial, reopen) the run; None while the server is unreachable.

        A trial restarted after its run finished only uploads what is still spooled.
        """
        if self.finished:
            self._submit(None)
            self._refresh_run_id()
            return self.run_id
        record = read_run_record(self.state_dir)
        start = {"op": "start", "experiment": self.experiment, "run_name": self.run_name, "tags": self.tags,
                 "trial_key": uuid.uuid4().hex, "timestamp": now_ms()}
        if record is not None:
            self._submit({"op": "resume", "run_id": record["run_id"], "start": start})
        elif any(op["op"] == "start" for op in self.spool.read()):
            self._submit(None)  # an earlier attempt is spooled: replay it rather than start twice
        else:
            self._submit(start)
        self._refresh_run_id()
        self._start_monitor()
        return self.run_id

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Every field of a (flat or nested) config as string params, truncated to MLflow's limit."""
        if self.finished:
            return
        self._submit({"op": "params", "params": param_strings(params)})

    def log_metrics(self, metrics: Mapping[str, Any], step: int) -> None:
        """Numeric entries of `metrics` at `step` (a `step` key in the dict is ignored).

        Returns once the points are in the spool (durable); the background thread uploads them.
        """
        if self.finished:
            return
        points = {key: value for key, value in numeric_metrics(metrics).items() if key != "step"}
        self.spool.append({"op": "metrics", "metrics": mlflow_metrics(points), "step": int(step),
                           "timestamp": now_ms(), "tracking_uri": self.tracking_uri})
        self._uploader.wake()

    @property
    def background_problems(self) -> list[str]:
        """What uploading the spooled points could not do: dead-lettered operations, unexpected errors."""
        refused = self._refused_in_background
        return ([f"{refused} spooled operation(s) dead-lettered (refused by MLflow or corrupt), kept in "
                 f"{self.state_dir / FAILED_FILE}"] if refused else []) + self._uploader.errors

    def finish(self, result: Mapping[str, Any], artifact_dir: str | os.PathLike[str], register: bool) -> str | None:
        """Final metrics, result.json and the artifact; register a version when `register`; end FINISHED.

        Returns the new registry version (None when not registering or when spooled).
        """
        self._uploader.close()
        self._upload_spooled()  # what the thread had not reached yet, counted like its own work
        for problem in self.background_problems:
            logger.error("MLflow run %s (%s): %s", self.run_id, self.state_dir, problem)
        self._stop_monitor()
        if self.finished:
            self._submit(None)
            record = read_run_record(self.state_dir) or {}
            self.model_version = record.get("model_version")
            return self.model_version
        plain = json.loads(json.dumps(dict(result), default=str))  # what result.json holds
        self._submit({"op": "finish", "result": plain, "artifact_dir": str(Path(artifact_dir).resolve()),
                      "register": bool(register), "status": "FINISHED", "timestamp": now_ms(), "ui_uri": self.ui_uri},
                     force=True)
        return self.model_version

    def verify_reused(self, result: Mapping[str, Any], result_path: str | os.PathLike[str]) -> None:
        """Refuse (`CachedResultError`) a result reused from an earlier attempt whose scores differ from those its
        finished run logged (`score_mismatches`); nothing to compare while its finish is only spooled. When the
        server cannot be read now, the result is reused on its own digests, with a warning."""
        from pipelines.training.outputs import WAY_OUT, CachedResultError

        record = read_run_record(self.state_dir)
        if record is None or record.get("status") != "FINISHED" or not record.get("run_id"):
            return
        run_id = record["run_id"]
        try:
            logged = mlflow_client(self.tracking_uri).get_run(run_id).data.metrics
        except Exception as err:  # noqa: BLE001 - an unreachable server must not fail a verified result
            logger.warning("Cannot compare the reused result %s with its MLflow run %s now (%s); reusing it on its "
                           "own digests.", result_path, run_id, err)
            return
        if mismatches := score_mismatches(logged, result):
            raise CachedResultError(
                f"The finished result {result_path} is not reused: its scores differ from those its MLflow run "
                f"{run_id} at {self.tracking_uri} logged ({'; '.join(mismatches)}); it was edited after the run "
                f"finished. {WAY_OUT}")

    def fail(self, error: BaseException | str | None = None) -> None:
        """End the run FAILED (the trial raised), unless it already finished; `error` becomes its ``error`` tag."""
        self._uploader.close()
        self._stop_monitor()
        if self.finished:
            return
        op = {"op": "end", "status": "FAILED", "timestamp": now_ms()}
        if error is not None:
            op["error"] = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        self._submit(op, force=True)

    @property
    def run_url(self) -> str | None:
        """The run's page in the MLflow UI at `ui_uri`; None while the run exists only in the spool, or when `ui_uri`
        is no web server (a ``sqlite:`` or file store)."""
        record = read_run_record(self.state_dir)
        if not record or not record.get("experiment_id") or not self.ui_uri.startswith(("http://", "https://")):
            return None
        return ui_run_url(self.ui_uri, record["experiment_id"], record["run_id"])

    def _upload_spooled(self) -> None:
        """Replay the spool (the background thread's work), counting what the server refused."""
        before = self._replayer.dead_lettered
        self._submit(None)
        self._refused_in_background += self._replayer.dead_lettered - before

    def _submit(self, op: dict | None, force: bool = False) -> None:
        """Replay the spool, then apply `op`; spool `op` when the server does not answer. One upload at a time."""
        if op is not None:
            op["tracking_uri"] = self.tracking_uri
        with self._lock:
            if self.offline and not force and time.monotonic() - self._failed_at < self.reconnect_s:
                if op is not None:
                    self.spool.append(op)
                return
            policy = self.retry if force or not self.offline else RetryPolicy(budget_s=0.0)
            try:
                with dir_lock(self.state_dir):
                    value = call_with_retry(lambda: self._replay_then(op), is_transient, policy,
                                            f"MLflow at {self.tracking_uri}")
            except TrackingUnavailable as err:
                self._go_offline(op, err)
                return
            except Exception as exc:  # noqa: BLE001 - tracking must never fail the trial
                if op is not None:
                    dead_letter(self.state_dir, op, exc)
                return
            if op is not None and op["op"] == "finish":
                self.model_version = value
            elif self._monitor is not None and not self._monitor_alive():
                self._stop_monitor()  # its thread gave up after a failed request: start a new one
                self._start_monitor()
            if self.offline:
                logger.info("MLflow at %s answers again; the spooled operations were uploaded", self.tracking_uri)
                self.offline = False
                self._refresh_run_id()
                self._start_monitor()

    def _replay_then(self, op: dict | None) -> Any:
        self._replayer.replay()
        return None if op is None else self._replayer.apply(op)

    def _go_offline(self, op: dict | None, err: TrackingUnavailable) -> None:
        if op is not None:
            self.spool.append(op)
        if not self.offline:
            logger.warning("%s. Spooling to %s; the tracker retries every %.0f s, or run `python -m "
                           "pipelines.tracking sync --root %s` later.", err, self.spool.path,
                           self.reconnect_s, self.state_dir)
        self.offline, self._failed_at = True, time.monotonic()
        self._stop_monitor()

    def _refresh_run_id(self) -> None:
        record = read_run_record(self.state_dir)
        self.run_id = record["run_id"] if record else None

    def _start_monitor(self) -> None:
        if not self.system_metrics or self.offline or self.run_id is None or self._monitor is not None:
            return
        try:
            from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

            self._monitor = SystemMetricsMonitor(self.run_id, sampling_interval=self.system_metrics_interval_s,
                                                 resume_logging=True, tracking_uri=self.tracking_uri)
            self._monitor.start()
        except Exception as exc:  # noqa: BLE001 - e.g. psutil missing: go on without system metrics
            logger.warning("System metrics are off for run %s: %s", self.run_id, exc)
            self._monitor = None

    def _monitor_alive(self) -> bool:
        thread = getattr(self._monitor, "_process", None)  # the monitor's thread (an MLflow internal)
        return thread is not None and thread.is_alive()

    def _stop_monitor(self) -> None:
        """Stop the monitor, then upload what it sampled since its last upload (MLflow's loop drops it when
        stopped)."""
        if self._monitor is not None:
            self._monitor.finish()
            try:
                if metrics := self._monitor.aggregate_metrics():
                    self._monitor.publish_metrics(metrics)
                    self._monitor.mlflow_logger.flush()
            except Exception as exc:  # noqa: BLE001 - system metrics are a nicety: never fail the run for them
                logger.warning("The last system metrics sample was not uploaded: %s", exc)
            self._monitor = None


# A finished trial's result.json, reused by a restarted sweep, must say what its MLflow run logged.
# result.json carries its own digest (`pipelines.training.outputs`), which catches an edit but not someone who
# recomputes it; the run's metrics live in the tracking database, out of reach of whoever can only write the
# output folder. So a reused result's scores are compared with the run's (the final metrics and the last
# best-validation score it logged); any difference refuses the trial with the way out.

def score_mismatches(logged: Mapping[str, float], result: Mapping[str, Any]) -> list[str]:
    """``name: result.json X, run Y`` for every score of `result` that the run's `logged` metrics (MLflow names)
    lack or hold another value of."""
    expected = dict(final_metrics(result))
    best = result.get("metrics", {}).get("best_validation_score")
    if isinstance(best, int | float) and math.isfinite(best):
        expected[mlflow_metric_name("best_validation_score")] = float(best)
    return [f"{project_metric_name(name)}: result.json {value!r}, run {logged.get(name)!r}"
            for name, value in sorted(expected.items())
            if name not in logged or not math.isclose(logged[name], value, rel_tol=1e-9, abs_tol=1e-12)]


class BackgroundUploader:
    """Runs `upload` on a daemon thread each time `wake` is called (wakes coalesce); `close` flushes.

    The training thread only appends each metric operation to the spool (a durable, fsynced line); this thread
    replays the spool against the server while training goes on. A crash at any moment loses nothing the spool
    would not have kept: a point either reached the server or is still spooled (the restarted trial, or ``python -m
    pipelines.tracking sync``, uploads it), and a replay drops a line only once it was applied or dead-lettered.
    `upload` must never raise for tracking problems (the tracker spools or dead-letters them); anything
    it still raises is a bug, kept in `errors` for the tracker to report at finish, and the thread goes on.
    """

    def __init__(self, upload: Callable[[], None], name: str) -> None:
        self._upload = upload
        self._name = name
        self._wake = threading.Event()
        self._closing = False
        self._thread: threading.Thread | None = None
        self.errors: list[str] = []
        """Unexpected exceptions of `upload`, as ``Type: message``."""

    def wake(self) -> None:
        """Ask for an upload soon (starts the thread on first use)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
            self._thread.start()
        self._wake.set()

    def close(self) -> None:
        """Let the thread finish the upload it may be doing, then stop it (the caller replays the rest)."""
        if self._thread is None:
            return
        self._closing = True
        self._wake.set()
        self._thread.join()
        self._thread = None

    def _loop(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._closing:
                return
            try:
                self._upload()
            except Exception as exc:  # noqa: BLE001 - reported at finish; the points stay spooled
                logger.error("Background MLflow upload (%s) failed: %s", self._name, exc, exc_info=exc)
                self.errors.append(f"{type(exc).__name__}: {exc}")
