"""The finish of a trial's run: summary tags, its dataset input, result.json, the artifact, the logged capsule
model (registered as a new version), the final metrics linked to model and dataset, then the run's end."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd
from mlflow import MlflowClient
from mlflow.entities import Dataset, DatasetInput, InputTag, Metric, RunTag
from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

from capt.digest import link_problem
from pipelines.tracking.client import TrackingError, is_transient
from pipelines.tracking.pyfunc import register_capsule
from pipelines.tracking.run_content import final_metrics, summary_tags

logger = logging.getLogger(__name__)
FINAL_STEP = 0
"""The step of one-off final metrics: the MLflow UI charts a metric logged at step 0 only as bars across runs."""
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


def log_dataset(client: MlflowClient, run_id: str, card: Mapping[str, Any] | None) -> Dataset | None:
    """Log the run's dataset input (context ``training``); None when the result has no card."""
    if not card:
        return None
    dataset = dataset_entity(card)
    client.log_inputs(run_id, datasets=[DatasetInput(dataset, [InputTag(MLFLOW_DATASET_CONTEXT, "training")])])
    return dataset


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
    dataset = log_dataset(client, run_id, result.get("dataset"))
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
    metrics = [Metric(k, v, op["timestamp"], FINAL_STEP, run_id=run_id, **linked)
               for k, v in final_metrics(result).items()]
    if metrics:
        client.log_batch(run_id, metrics=metrics)
    client.set_terminated(run_id, status=op["status"], end_time=op["timestamp"])
    return version
