"""Spooled MLflow operations: apply one (start, resume, params, metrics, finish, end) and replay a trial's
spool in order (`pipelines.tracking.sync` replays every state dir under a folder).

A finish logs the summary tags, the run's dataset input, result.json, the artifact, the logged capsule model
(registered as a new version), the final metrics linked to model and dataset, then the run's end (`apply_finish`)."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd
from mlflow import MlflowClient
from mlflow.entities import Dataset, DatasetInput, InputTag, Metric, Param, RunTag
from mlflow.exceptions import MlflowException, RestException
from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

from capt.digest import link_problem
from pipelines.tracking.client import TRIAL_KEY_TAG, TrackingError, ensure_experiment, is_transient, mlflow_client
from pipelines.tracking.pyfunc import register_capsule
from pipelines.tracking.run_content import final_metrics, summary_tags
from pipelines.tracking.scope import ServerScope
from pipelines.tracking.spool import (
    FAILED_FILE,
    PARAMS_PER_BATCH,
    PENDING_FILE,
    Spool,
    read_run_record,
    write_run_record,
)

logger = logging.getLogger(__name__)


def _apply_start(client: MlflowClient, uri: str, state_dir: Path, op: dict) -> str:
    """Create the run (or find the one a previous replay created, by its trial key) and record it."""
    experiment_id = ensure_experiment(client, op["experiment"])
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
    for start in range(0, len(params), PARAMS_PER_BATCH):
        client.log_batch(run_id, params=params[start:start + PARAMS_PER_BATCH])


_SOURCE_TYPES = {"generated": "code", "hub": "hugging_face", "local": "local"}
"""MLflow dataset source types of the project's data sources."""


def dataset_entity(card: Mapping[str, Any]) -> Dataset:
    """The MLflow dataset of a result's ``dataset`` card (`pipelines.training.result.dataset_card`): schema from the
    sample rows, profile with split sizes, label counts, generated or real, and the sample rows themselves."""
    sample = pd.DataFrame(card["sample_rows"])
    schema = mlflow.models.infer_signature(sample).inputs if not sample.empty else None
    profile = {key: card[key] for key in ("generated", "sizes", "label_counts", "sample_rows")}
    return Dataset(name=card["name"], digest=card["digest"], source_type=_SOURCE_TYPES.get(card["source"], "local"),
                   source=json.dumps({"uri": card["origin"], "task": card["task"]}),
                   schema=json.dumps({"mlflow_colspec": schema.to_dict()}) if schema else None,
                   profile=json.dumps(profile))


def apply_finish(client: MlflowClient, uri: str, run_id: str, op: dict) -> str | None:
    """Everything a finished trial logs (module docstring); returns the new registry version, if any.

    An artifact folder holding a symbolic link is refused before anything of the finish is logged (TrackingError:
    the operation is dead-lettered with the link named), so a run never uploads, or registers, the bytes a link
    leads to."""
    result, artifact_dir = op["result"], Path(op["artifact_dir"])
    if problem := link_problem(artifact_dir, f"The artifact folder {artifact_dir} of run {run_id}"):
        raise TrackingError(f"{problem} Nothing of the run's finish was logged.")
    tags = summary_tags(result, artifact_dir)
    client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])
    dataset = dataset_entity(result["dataset"]) if result.get("dataset") else None
    if dataset is not None:
        client.log_inputs(run_id, datasets=[DatasetInput(dataset, [InputTag(MLFLOW_DATASET_CONTEXT, "training")])])
    client.log_dict(run_id, result, "result.json")
    if artifact_dir.is_dir():
        client.log_artifacts(run_id, str(artifact_dir), "artifact")
    else:
        logger.warning("Artifact directory %s is missing; run %s gets no artifact", artifact_dir, run_id)
    version, model_id = None, None
    if op["register"] and artifact_dir.is_dir():
        try:
            described = {**result, "capsule_bytes": tags.get("capsule_bytes")}
            version, model_id = register_capsule(client, uri, run_id, described, artifact_dir, op.get("ui_uri") or uri)
        except Exception as exc:
            if is_transient(exc):
                raise
            logger.error("Could not register the capsule of run %s: %s", run_id, exc, exc_info=exc)
            client.set_tag(run_id, "registration_error", f"{type(exc).__name__}: {exc}"[:5000])
    linked = {"model_id": model_id, "dataset_name": dataset.name if dataset else None,
              "dataset_digest": dataset.digest if dataset else None}
    # step 0: the MLflow UI charts a metric logged at step 0 only as bars across runs
    metrics = [Metric(k, v, op["timestamp"], 0, run_id=run_id, **linked) for k, v in final_metrics(result).items()]
    if metrics:
        client.log_batch(run_id, metrics=metrics)
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
        if op["metrics"]:
            client.log_batch(run_id, metrics=[Metric(k, v, op["timestamp"], op["step"])
                                              for k, v in op["metrics"].items()])
        return None
    if kind == "finish":
        version = apply_finish(client, uri, run_id, op)
        # a restarted trial must neither reopen this run nor register a second version
        write_run_record(state_dir, {**record, "status": "FINISHED", "model_version": version})
        return version
    if kind == "end":
        if op.get("error"):  # the job's error, ``<type>: <message>``
            client.set_tag(run_id, "error", str(op["error"])[:5000])
        return client.set_terminated(run_id, status=op["status"], end_time=op["timestamp"])
    raise TrackingError(f"Unknown pending operation {kind!r} in {state_dir / PENDING_FILE}")


@dataclass
class Replayer:
    """Replays a trial's spool in order; each operation leaves the file once applied or dead-lettered."""

    state_dir: Path
    server: ServerScope = field(default_factory=ServerScope)
    """Where each operation goes, by the server recorded with it (`pipelines.tracking.scope`)."""
    synced: int = 0
    """Operations applied to the server."""
    dead_lettered: int = 0
    """Operations the server refused and corrupt lines, moved to the dead-letter file."""
    _clients: dict[str, MlflowClient] = field(default_factory=dict)

    def uri_for(self, op: dict) -> str:
        """The server `op` goes to (`ServerScope.destination`); TrackingError when it is not for this replay."""
        uri = self.server.destination(op)
        if not uri:
            recorded = op.get("tracking_uri") or "no server"
            raise TrackingError(f"A {op.get('op')!r} operation spooled in {self.state_dir} was recorded for "
                                f"{recorded}, not for the server of this replay; it stays pending. "
                                f"{self.server.refusal([op])}.")
        return uri

    def apply(self, op: dict) -> Any:
        """Apply one operation now (no spool involved)."""
        uri = self.uri_for(op)
        client = self._clients.setdefault(uri, mlflow_client(uri))
        return _apply(client, uri, self.state_dir, op)

    def replay(self) -> int:
        """Apply every pending op; how many were synced so far.

        Transient errors, refused credentials and a missing URI propagate (the rest stays pending);
        an operation the server refuses for any other reason, and a corrupt line, is dead-lettered.
        """
        spool, dead_letters = Spool(self.state_dir / PENDING_FILE), Spool(self.state_dir / FAILED_FILE)
        self.dead_lettered += spool.quarantine(dead_letters)
        while (line := spool.first()) is not None:
            if line.op is None:
                self.dead_lettered += spool.quarantine(dead_letters)  # torn by a writer during this replay
                continue
            self.uri_for(line.op)
            try:
                self.apply(line.op)
                self.synced += 1
            except Exception as exc:
                # 401/403: the credentials are wrong for the whole server, not this operation; keep it pending
                if is_transient(exc) or (isinstance(exc, RestException) and exc.get_http_status_code() in (401, 403)):
                    raise
                dead_letter(self.state_dir, line.op, exc)
                self.dead_lettered += 1
            spool.drop_first(line)
        return self.synced


def dead_letter(state_dir: Path, op: dict, exc: BaseException) -> None:
    logger.error("MLflow %s operation of %s failed (%s: %s); kept in %s", op.get("op"), state_dir,
                 type(exc).__name__, exc, state_dir / FAILED_FILE,
                 exc_info=None if isinstance(exc, TrackingError | MlflowException) else exc)  # a bug shows its stack
    Spool(state_dir / FAILED_FILE).append({**op, "error": f"{type(exc).__name__}: {exc}"})
