"""Spooled MLflow operations: apply one (start, resume, params, metrics, finish, end), replay a trial's
spool in order, and `sync_pending` for every state dir under a folder."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlflow import MlflowClient
from mlflow.entities import Metric, Param
from mlflow.exceptions import RestException

from pipelines.tracking.client import (
    TRIAL_KEY_TAG,
    TrackingError,
    _client,
    _dir_lock,
    _own_http_retries,
    is_transient,
)
from pipelines.tracking.pyfunc import _register
from pipelines.tracking_spool import (
    FAILED_FILE,
    PARAMS_PER_BATCH,
    PENDING_FILE,
    RetryPolicy,
    Spool,
    call_with_retry,
    chunks,
    final_metrics,
    find_state_dirs,
    read_run_record,
    write_run_record,
)

logger = logging.getLogger(__name__)
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


def _record_finished(state_dir: Path, version: str | None) -> None:
    """Mark the run record: a restarted trial must neither reopen this run nor register a second version."""
    record = read_run_record(state_dir)
    if record is not None:
        write_run_record(state_dir, {**record, "status": "FINISHED", "model_version": version})


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
        version = _apply_finish(client, uri, run_id, op)
        _record_finished(state_dir, version)
        return version
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
