"""The capsule pyfunc of the Model Registry: `CapsulePyfunc`, its signature, requirements and registration.

`CapsulePyfunc` is pickled by reference; it stays importable as `pipelines.tracking.CapsulePyfunc`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import tempfile
import warnings
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from pipelines.tracking.client import CAPSULE_MODEL, _fluent_uri
from pipelines.tracking_spool import registered_model_name

logger = logging.getLogger(__name__)

_REQUIREMENTS = ("mlflow", "torch", "transformers", "safetensors", "tokenizers", "numpy", "pandas", "pydantic")


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
            "config_hash": str(result.get("config_hash")),
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
