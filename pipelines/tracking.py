"""MLflow tracking: runs, metrics, artifacts, the capsule pyfunc and the Model Registry.

This is the ONLY module of the project that imports mlflow; `promote`, `report` and the sweep go
through the functions and classes here. Conventions (DESIGN.md §6): one run per trial named
``<task>/<model-slug>/<method>/s<seed>``, every config field as a param, tags from the caller (task,
model, method, seed, sweep), metrics per validation, system metrics on; each CaPT trial registers a
new version of ``capt-<model-slug>-<task>`` (a pyfunc predicting label names for raw task rows) tagged
``validation_status=pending``.

Resilience: every call retries with backoff (30 s budget by default); when the server stays down the
operation is appended to ``<state_dir>/mlflow_pending.jsonl`` and the trial goes on. The tracker
replays the spool itself once the server answers again (probing at most every ``reconnect_s``), and

    python -m pipelines.tracking sync --root OUTPUTS_DIR [--tracking-uri URI]

replays whatever is left. Replays are idempotent: applied operations leave the spool, metric points
keep their original timestamps, registration first looks for the run's version.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd
import requests
from mlflow import MlflowClient
from mlflow.entities import Metric, Param
from mlflow.exceptions import MlflowException, RestException

from pipelines.tracking_spool import (
    FAILED_FILE,
    PARAMS_PER_BATCH,
    PENDING_FILE,
    RetryPolicy,
    Spool,
    TrackingUnavailable,
    call_with_retry,
    chunks,
    final_metrics,
    find_state_dirs,
    numeric_metrics,
    param_strings,
    read_run_record,
    registered_model_name,
    write_run_record,
)

logger = logging.getLogger(__name__)

__all__ = ["CapsulePyfunc", "Registry", "RetryPolicy", "TrackingError", "TrackingUnavailable", "TrialTracker",
           "VersionInfo", "experiment_runs", "sync_pending"]

CAPSULE_MODEL = "capsule"
TRIAL_KEY_TAG = "capt.trial_key"
_TRANSIENT_STATUS = (429, 500, 502, 503, 504)
_REQUIREMENTS = ("mlflow", "torch", "transformers", "safetensors", "tokenizers", "numpy", "pandas", "pydantic")


class TrackingError(RuntimeError):
    """A tracking or registry request failed for a reason the user must fix; the message says which."""


def is_transient(exc: BaseException) -> bool:
    """True for errors worth retrying: no connection, timeouts, 429 and 5xx answers."""
    if isinstance(exc, RestException):
        return exc.get_http_status_code() in _TRANSIENT_STATUS
    if isinstance(exc, MlflowException):  # how MLflow wraps connection errors and timeouts
        return str(exc.message).startswith("API request to") and " failed with " in str(exc.message)
    if isinstance(exc, requests.HTTPError) and exc.response is not None:
        return exc.response.status_code in _TRANSIENT_STATUS
    return isinstance(exc, requests.ConnectionError | requests.Timeout | ConnectionError | TimeoutError)


def _own_http_retries() -> None:
    """Turn off MLflow's own HTTP retries (7 by default, minutes when the server is down): ours bound them."""
    os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "0"
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")


def _now_ms() -> int:
    return int(time.time() * 1000)


def _client(uri: str) -> MlflowClient:
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


@contextlib.contextmanager
def _fluent_uri(uri: str) -> Iterator[None]:
    """Point MLflow's fluent API (needed by log_model / register_model) at `uri`, then restore it.

    The registry URI is left unset so it follows the tracking URI; the previous state, "unset"
    included, comes back afterwards (`mlflow.set_tracking_uri` also writes MLFLOW_TRACKING_URI).
    """
    from mlflow.tracking._tracking_service import utils as tracking_utils

    saved, saved_env = tracking_utils._tracking_uri, os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(saved)
        if saved_env is not None:
            os.environ["MLFLOW_TRACKING_URI"] = saved_env


@contextlib.contextmanager
def _dir_lock(directory: Path) -> Iterator[None]:
    """An exclusive advisory lock on a directory (a tracker and a `sync` never replay one spool at once)."""
    import fcntl

    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


# ----------------------------------------------------------------------------------------- operations

def _experiment_id(client: MlflowClient, name: str) -> str:
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        try:
            return client.create_experiment(name)
        except RestException as err:  # another trial created it meanwhile
            if err.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
            experiment = client.get_experiment_by_name(name)
    if experiment.lifecycle_stage == "deleted":
        client.restore_experiment(experiment.experiment_id)
    return experiment.experiment_id


def _apply_start(client: MlflowClient, uri: str, state_dir: Path, op: dict) -> str:
    """Create the run (or find the one a previous replay created, by its trial key) and record it."""
    experiment_id = _experiment_id(client, op["experiment"])
    key = op["trial_key"]
    found = client.search_runs([experiment_id], f"tags.`{TRIAL_KEY_TAG}` = '{key}'", max_results=1)
    run = found[0] if found else client.create_run(
        experiment_id, start_time=op["timestamp"], run_name=op["run_name"], tags={**op["tags"], TRIAL_KEY_TAG: key})
    write_run_record(state_dir, {"run_id": run.info.run_id, "experiment_id": experiment_id, "tracking_uri": uri,
                                 "run_name": op["run_name"], "trial_key": key})
    return run.info.run_id


def _apply_resume(client: MlflowClient, uri: str, state_dir: Path, op: dict) -> str:
    """Mark a restarted trial's run RUNNING again; if the server does not know it, start a new one."""
    try:
        client.update_run(op["run_id"], status="RUNNING")
        return op["run_id"]
    except RestException as err:
        if err.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        logger.warning("Run %s is unknown to %s: starting a new run for this trial", op["run_id"], uri)
        return _apply_start(client, uri, state_dir, op["start"])


def _apply_params(client: MlflowClient, run_id: str, op: dict) -> None:
    existing = client.get_run(run_id).data.params
    changed = sorted(k for k, v in op["params"].items() if k in existing and existing[k] != v)
    if changed:
        logger.warning("Run %s keeps its first values of %s (MLflow params cannot change; a restarted "
                       "trial with another config?)", run_id, ", ".join(changed))
    params = [Param(k, v) for k, v in op["params"].items() if k not in existing]
    for chunk in chunks(params, PARAMS_PER_BATCH):
        client.log_batch(run_id, params=chunk)


def _apply_metrics(client: MlflowClient, run_id: str, op: dict) -> None:
    metrics = [Metric(k, v, op["timestamp"], op["step"]) for k, v in op["metrics"].items()]
    if metrics:
        client.log_batch(run_id, metrics=metrics)


def _apply_finish(client: MlflowClient, uri: str, run_id: str, op: dict) -> str | None:
    """Final metrics, result.json, the artifact directory, the registry version; then end the run."""
    result, artifact_dir = op["result"], Path(op["artifact_dir"])
    _apply_metrics(client, run_id, {"metrics": final_metrics(result), "timestamp": op["timestamp"],
                                    "step": int(result.get("steps", 0))})
    client.log_dict(run_id, result, "result.json")
    if artifact_dir.is_dir():
        client.log_artifacts(run_id, str(artifact_dir), "artifact")
    else:
        logger.warning("Artifact directory %s is missing; run %s gets no artifact", artifact_dir, run_id)
    version = None
    if op["register"] and artifact_dir.is_dir():
        try:
            version = _register(client, uri, run_id, result, artifact_dir)
        except Exception as exc:
            if is_transient(exc):
                raise
            logger.error("Could not register the capsule of run %s: %s", run_id, exc, exc_info=exc)
            client.set_tag(run_id, "registration_error", f"{type(exc).__name__}: {exc}"[:5000])
    client.set_terminated(run_id, status=op["status"], end_time=op["timestamp"])
    return version


def _apply(client: MlflowClient, uri: str, state_dir: Path, op: dict) -> Any:
    """Apply one operation; the run comes from the op or from the trial's run record."""
    kind = op["op"]
    if kind == "start":
        return _apply_start(client, uri, state_dir, op)
    if kind == "resume":
        return _apply_resume(client, uri, state_dir, op)
    record = read_run_record(state_dir)
    if record is None:
        raise TrackingError(f"{state_dir} has no MLflow run record: cannot apply a {kind!r} operation")
    run_id = record["run_id"]
    if kind == "params":
        return _apply_params(client, run_id, op)
    if kind == "metrics":
        return _apply_metrics(client, run_id, op)
    if kind == "finish":
        return _apply_finish(client, uri, run_id, op)
    if kind == "end":
        return client.set_terminated(run_id, status=op["status"], end_time=op["timestamp"])
    raise TrackingError(f"Unknown pending operation {kind!r} in {state_dir / PENDING_FILE}")


@dataclass
class _Replayer:
    """Replays a trial's spool in order; applied operations leave the file one by one."""

    state_dir: Path
    tracking_uri: str | None = None
    applied: int = 0
    _clients: dict[str, MlflowClient] = field(default_factory=dict)

    def uri_for(self, op: dict) -> str:
        """The override URI, else the one recorded with the op, else MLFLOW_TRACKING_URI."""
        uri = self.tracking_uri or op.get("tracking_uri") or os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            raise TrackingError("No tracking URI: pass --tracking-uri or set MLFLOW_TRACKING_URI.")
        return uri

    def apply(self, op: dict) -> Any:
        """Apply one operation now (no spool involved)."""
        uri = self.uri_for(op)
        client = self._clients.setdefault(uri, _client(uri))
        return _apply(client, uri, self.state_dir, op)

    def replay(self) -> int:
        """Apply every pending op; transient errors propagate (the rest stays pending)."""
        spool = Spool(self.state_dir / PENDING_FILE)
        ops = spool.read()
        while ops:
            try:
                self.apply(ops[0])
            except Exception as exc:
                if is_transient(exc):
                    raise
                _dead_letter(self.state_dir, ops[0], exc)
            ops = ops[1:]
            spool.replace(ops)
            self.applied += 1
        return self.applied


def _dead_letter(state_dir: Path, op: dict, exc: BaseException) -> None:
    logger.error("MLflow %s operation of %s failed (%s: %s); kept in %s", op.get("op"), state_dir,
                 type(exc).__name__, exc, state_dir / FAILED_FILE, exc_info=exc)
    Spool(state_dir / FAILED_FILE).append({**op, "error": f"{type(exc).__name__}: {exc}"})


def sync_pending(root: str | os.PathLike[str], tracking_uri: str | None = None,
                 retry: RetryPolicy | None = None) -> int:
    """Replay the pending operations of `root` (a state dir, or any folder above state dirs).

    Returns how many operations were applied. Raises `TrackingUnavailable` (after the retry budget)
    when the server does not answer; what was applied before stays applied.
    """
    _own_http_retries()
    total = 0
    for state_dir in find_state_dirs(root):
        replayer = _Replayer(state_dir, tracking_uri)
        with _dir_lock(state_dir):
            try:
                call_with_retry(replayer.replay, is_transient, retry or RetryPolicy(), f"sync {state_dir}")
            finally:
                total += replayer.applied
        logger.info("Synced %d operation(s) from %s", replayer.applied, state_dir)
    return total


# -------------------------------------------------------------------------------------------- tracker

class TrialTracker:
    """One trial's MLflow run, from world rank 0 only; a restarted trial (same `state_dir`) reuses it.

    Never raises for tracking problems: an unreachable server spools operations (see the module
    docstring), any other failure is logged and kept in ``mlflow_failed.jsonl``.
    """

    def __init__(self, tracking_uri: str, experiment: str, run_name: str, tags: Mapping[str, Any],
                 state_dir: str | os.PathLike[str], *, retry: RetryPolicy | None = None,
                 reconnect_s: float = 60.0, system_metrics: bool = True,
                 system_metrics_interval_s: float = 10.0) -> None:
        self.tracking_uri = tracking_uri
        self.experiment = experiment
        self.run_name = run_name
        self.tags = {str(k): str(v) for k, v in tags.items()}
        self.state_dir = Path(state_dir).resolve()
        self.retry = retry or RetryPolicy()
        self.reconnect_s = reconnect_s
        self.system_metrics = system_metrics
        self.system_metrics_interval_s = system_metrics_interval_s
        self.spool = Spool(self.state_dir / PENDING_FILE)
        self.run_id: str | None = None
        self.offline = False
        self.model_version: str | None = None
        self._failed_at = 0.0
        self._monitor: Any = None
        self._replayer = _Replayer(self.state_dir)
        _own_http_retries()

    def start(self) -> str | None:
        """Create (or, for a restarted trial, reopen) the run; None while the server is unreachable."""
        record = read_run_record(self.state_dir)
        start = {"op": "start", "experiment": self.experiment, "run_name": self.run_name, "tags": self.tags,
                 "trial_key": uuid.uuid4().hex, "timestamp": _now_ms()}
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
        self._submit({"op": "params", "params": param_strings(params)})

    def log_metrics(self, metrics: Mapping[str, Any], step: int) -> None:
        """Numeric entries of `metrics` at `step` (a `step` key in the dict is ignored)."""
        self._submit({"op": "metrics", "metrics": numeric_metrics(metrics), "step": int(step),
                      "timestamp": _now_ms()})

    def finish(self, result: Mapping[str, Any], artifact_dir: str | os.PathLike[str], register: bool) -> str | None:
        """Final metrics, result.json and the artifact; register a version when `register`; end FINISHED.

        Returns the new registry version (None when not registering or when spooled).
        """
        self._stop_monitor()
        plain = json.loads(json.dumps(dict(result), default=str))  # what result.json holds
        self._submit({"op": "finish", "result": plain, "artifact_dir": str(Path(artifact_dir).resolve()),
                      "register": bool(register), "status": "FINISHED", "timestamp": _now_ms()}, force=True)
        return self.model_version

    def fail(self) -> None:
        """End the run FAILED (the trial raised)."""
        self._stop_monitor()
        self._submit({"op": "end", "status": "FAILED", "timestamp": _now_ms()}, force=True)

    def __enter__(self) -> TrialTracker:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: Any) -> None:
        if exc_type is not None:
            self.fail()

    def _submit(self, op: dict | None, force: bool = False) -> None:
        """Replay the spool, then apply `op`; spool `op` when the server does not answer."""
        if op is not None:
            op["tracking_uri"] = self.tracking_uri
        if self.offline and not force and time.monotonic() - self._failed_at < self.reconnect_s:
            if op is not None:
                self.spool.append(op)
            return
        policy = self.retry if force or not self.offline else RetryPolicy(budget_s=0.0)
        try:
            with _dir_lock(self.state_dir):
                value = call_with_retry(lambda: self._replay_then(op), is_transient, policy,
                                        f"MLflow at {self.tracking_uri}")
        except TrackingUnavailable as err:
            self._go_offline(op, err)
            return
        except Exception as exc:  # noqa: BLE001 - tracking must never fail the trial
            if op is not None:
                _dead_letter(self.state_dir, op, exc)
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
        if self._monitor is not None:
            self._monitor.finish()
            self._monitor = None


# ------------------------------------------------------------------------------------ registry model

class CapsulePyfunc(mlflow.pyfunc.PythonModel):
    """A registered capsule: `predict` takes raw task rows (official jsonl fields) and returns label names.

    Artifacts: ``capsule`` (the job's artifact directory) and ``result`` (its result.json, which names
    the base model, method options and evaluation mode). Loading rebuilds the base model by name
    (built-in tiny models offline, hub ids from the Hugging Face cache or hub) and needs this project
    installed; see `pipelines.registry_model`.
    """

    def load_context(self, context: mlflow.pyfunc.PythonModelContext) -> None:
        """Rebuild the base model and load the trained capsule onto it."""
        from pipelines.registry_model import CapsulePredictor

        self._predictor = CapsulePredictor.from_paths(context.artifacts["capsule"], context.artifacts["result"])

    def predict(self, context: mlflow.pyfunc.PythonModelContext, model_input: pd.DataFrame,
                params: dict[str, Any] | None = None) -> list[str]:
        """Label names, one per row (one per answer for MultiRC)."""
        return self._predictor.predict_frame(model_input)


def _requirements() -> list[str]:
    """Pinned pip requirements of the pyfunc (explicit: inferring them would load the model again)."""
    pins = []
    for name in _REQUIREMENTS:
        with contextlib.suppress(metadata.PackageNotFoundError):
            pins.append(f"{name}=={metadata.version(name)}")
    return pins


def _signature(task: str, label_names: tuple[str, ...]) -> tuple[Any, pd.DataFrame]:
    """(signature or None, input example) from schema-valid unlabelled rows of `task`."""
    from pipelines.registry_model import example_rows

    example = pd.DataFrame(example_rows(task, 2))
    try:
        return mlflow.models.infer_signature(example, [label_names[0]] * len(example)), example
    except Exception as exc:  # noqa: BLE001 - nested layouts (MultiRC, CSQA): no column schema
        logger.info("No input signature for %s rows (%s); logging the input example only", task, exc)
        return None, example


def _register(client: MlflowClient, uri: str, run_id: str, result: Mapping[str, Any], artifact_dir: Path) -> str:
    """Log the capsule pyfunc to the run and register it (once per run) as a new version."""
    from capt.tasks import get as task_spec

    name = registered_model_name(result["model_slug"], result["task"])
    existing = client.search_model_versions(f"name='{name}' and run_id='{run_id}'")
    if existing:
        return str(existing[0].version)
    signature, example = _signature(result["task"], task_spec(result["task"]).label_names)
    metrics = result.get("metrics", {})
    tags = {"task": result["task"], "method": result["method"], "base_model": result["model"],
            "model_slug": result["model_slug"], "seed": str(result.get("seed")), "validation_status": "pending",
            **{k: str(metrics[k]) for k in ("test_score", "best_validation_score") if k in metrics}}
    with tempfile.TemporaryDirectory() as tmp, _fluent_uri(uri), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        result_path = Path(tmp) / "result.json"
        result_path.write_text(json.dumps(result, indent=2, default=str), encoding="utf-8")
        with mlflow.start_run(run_id=run_id):
            info = mlflow.pyfunc.log_model(
                name=CAPSULE_MODEL, python_model=CapsulePyfunc(), signature=signature, input_example=example,
                artifacts={"capsule": str(artifact_dir), "result": str(result_path)},
                pip_requirements=_requirements())
        version = mlflow.register_model(info.model_uri, name, tags=tags)
    with contextlib.suppress(MlflowException):
        for key in ("task", "base_model", "model_slug"):
            client.set_registered_model_tag(name, key, tags[key])
    logger.info("Registered %s version %s (run %s)", name, version.version, run_id)
    return str(version.version)


@dataclass
class VersionInfo:
    """One registry version with what promotion needs."""

    name: str
    version: int
    run_id: str | None
    tags: dict[str, str]
    aliases: list[str]
    stage: str
    metrics: dict[str, float]
    """The metrics of the run that produced it."""
    created_ms: int


class Registry:
    """Model Registry operations for `pipelines.promote` (aliases, tags, legacy stages)."""

    def __init__(self, tracking_uri: str | None = None) -> None:
        self.uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or mlflow.get_tracking_uri()
        self.client = _client(self.uri)

    def model_names(self, prefix: str = "capt-") -> list[str]:
        """Registered model names starting with `prefix`."""
        models = self.client.search_registered_models(filter_string=f"name LIKE '{prefix}%'")
        return sorted(m.name for m in models)

    def versions(self, name: str) -> list[VersionInfo]:
        """Every version of `name`, oldest first; raises TrackingError when the model does not exist."""
        try:
            model = self.client.get_registered_model(name)
        except RestException as err:
            if err.error_code == "RESOURCE_DOES_NOT_EXIST":
                raise TrackingError(f"No registered model {name!r} at {self.uri}.") from err
            raise
        aliases: dict[str, list[str]] = {}
        for alias, version in (model.aliases or {}).items():  # search results do not carry aliases
            aliases.setdefault(str(version), []).append(alias)
        found = self.client.search_model_versions(f"name='{name}'")
        return sorted((self._info(v, aliases.get(str(v.version), [])) for v in found), key=lambda v: v.version)

    def _info(self, v: Any, aliases: list[str]) -> VersionInfo:
        metrics: dict[str, float] = {}
        if v.run_id:
            with contextlib.suppress(MlflowException):
                metrics = dict(self.client.get_run(v.run_id).data.metrics)
        return VersionInfo(v.name, int(v.version), v.run_id, dict(v.tags or {}), sorted(aliases),
                           v.current_stage or "None", metrics, int(v.creation_timestamp or 0))

    def set_alias(self, name: str, alias: str, version: int) -> None:
        """Point `alias` at `version` (moving it from any other version)."""
        self.client.set_registered_model_alias(name, alias, str(version))

    def delete_alias(self, name: str, alias: str) -> None:
        """Remove `alias` from the model (no-op when unset)."""
        with contextlib.suppress(RestException):
            self.client.delete_registered_model_alias(name, alias)

    def set_tags(self, name: str, version: int, tags: Mapping[str, Any]) -> None:
        """Set version tags (values stringified)."""
        for key, value in tags.items():
            self.client.set_model_version_tag(name, str(version), key, str(value))

    def transition_stage(self, name: str, version: int, stage: str, archive_existing: bool = False) -> None:
        """Legacy stage transition (deprecated in MLflow since 2.9; aliases replace it)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            self.client.transition_model_version_stage(name, str(version), stage,
                                                       archive_existing_versions=archive_existing)


def experiment_runs(experiment: str, tracking_uri: str | None = None) -> list[dict[str, Any]]:
    """Every run of `experiment` as {run_id, run_name, status, tags, metrics}; TrackingError if unknown."""
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or mlflow.get_tracking_uri()
    client = _client(uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        names = sorted(e.name for e in client.search_experiments())
        raise TrackingError(f"No experiment {experiment!r} at {uri}; experiments there: {', '.join(names) or 'none'}.")
    runs, token = [], None
    while True:
        page = client.search_runs([found.experiment_id], max_results=1000, page_token=token)
        runs += [{"run_id": r.info.run_id, "run_name": r.info.run_name, "status": r.info.status,
                  "tags": dict(r.data.tags), "metrics": dict(r.data.metrics)} for r in page]
        token = page.token
        if not token:
            return runs


# ------------------------------------------------------------------------------------------------ CLI

def main(argv: list[str] | None = None) -> int:
    """`python -m pipelines.tracking sync --root DIR [--tracking-uri URI]`."""
    parser = argparse.ArgumentParser(prog="python -m pipelines.tracking", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    sync = commands.add_parser("sync", help="upload the operations spooled while the server was down")
    sync.add_argument("--root", required=True, help="a trial's state dir or any folder above several")
    sync.add_argument("--tracking-uri", default=None, help="override the URI recorded with each operation")
    sync.add_argument("--retry-s", type=float, default=30.0, help="retry budget per trial (seconds)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        count = sync_pending(args.root, args.tracking_uri, RetryPolicy(budget_s=args.retry_s))
    except (TrackingUnavailable, TrackingError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    left = sum(len(Spool(d / PENDING_FILE)) for d in find_state_dirs(args.root))
    print(f"Synced {count} operation(s) under {args.root}; {left} still pending.")
    return 0 if left == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
