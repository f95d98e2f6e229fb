"""The capsule pyfunc of the Model Registry: `CapsulePyfunc`, its signature, requirements and registration, and
the description of each version (task, base model, scores, capsule size and a loading snippet to copy, run as it
stands against the registry's server).

Each version is logged as models from code (`pipelines/tracking/capsule_model.py`), never as a pickle.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
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
from mlflow.models import Model, ModelSignature
from packaging.version import InvalidVersion, Version

from capt.tasks import example_rows
from capt.tasks import get as task_spec
from pipelines.provenance import registered_model_name
from pipelines.tracking.bundle import DATA_FOLDER, code_size, code_tags, write_code_archive
from pipelines.tracking.client import fluent_uri
from pipelines.tracking.registry import download_to

logger = logging.getLogger(__name__)

_REQUIREMENTS = ("mlflow", "torch", "transformers", "safetensors", "tokenizers", "numpy", "pandas", "pydantic")
PROJECT_DISTRIBUTION = "capt"
"""The distribution that ships the `capt` and `pipelines` packages (pyproject.toml)."""
REGISTERED_MODEL_KEY = "registered_model"
"""The key of a version's result.json that names the registered model it was logged for."""
MODEL_CODE = Path(__file__).with_name("capsule_model.py")
"""The models-from-code file of every registered version."""


class CapsulePyfunc(mlflow.pyfunc.PythonModel):
    """A registered capsule: `predict` takes raw task rows (official jsonl fields) and returns label names.

    Artifacts: ``capsule`` (the job's artifact directory) and ``result`` (its result.json, which names
    the base model, method options and evaluation mode). Loading rebuilds the base model by name
    (built-in tiny models offline, hub ids from the Hugging Face cache or hub) with the version's own
    copy of this project's code (`pipelines.tracking.bundle`); see `pipelines.capsule_predictor`. MLflow builds it
    from `capsule_model.py` (models from code), never from a pickle.
    """

    def load_context(self, context: mlflow.pyfunc.PythonModelContext) -> None:
        """Verify the capsule (its digests, and its task, base model and method against the registered model its
        result.json says it was logged for), rebuild the base model and load the capsule onto it."""
        from pipelines.capsule_predictor import CapsulePredictor

        result = json.loads(Path(context.artifacts["result"]).read_text(encoding="utf-8"))
        name = result.get(REGISTERED_MODEL_KEY)
        label = f"The capsule of {name} ({context.artifacts['capsule']})" if name else None
        self._predictor = CapsulePredictor(context.artifacts["capsule"], result, registered_name=name, label=label)

    def predict(self, context: mlflow.pyfunc.PythonModelContext, model_input: pd.DataFrame,
                params: dict[str, Any] | None = None) -> list[str]:
        """Label names, one per row (one per answer for MultiRC)."""
        return self._predictor.predict_frame(model_input)


def _public_version(version: str) -> str:
    """`version` without its local tag (torch's CPU wheel reports ``2.13.0+cpu``, which no index serves)."""
    try:
        return Version(version).public
    except InvalidVersion:
        return version.split("+", 1)[0]


def _requirements() -> list[str]:
    """Pinned pip requirements of the pyfunc (explicit: inferring them would load the model again).

    Versions are public ones (no ``+cpu``) so that a fresh environment can install them; the project
    itself is named with its version (``capt==X``) so a version says which release it needs.
    """
    pins = []
    for name in (*_REQUIREMENTS, PROJECT_DISTRIBUTION):
        try:
            pins.append(f"{name}=={_public_version(metadata.version(name))}")
        except metadata.PackageNotFoundError:
            logger.warning("%s is not installed: the registered pyfunc's requirements leave it out", name)
    return pins


def pyfunc_signature(task: str, label_names: tuple[str, ...]) -> tuple[ModelSignature, pd.DataFrame]:
    """(signature, input example) from schema-valid unlabelled rows of `task`.

    Always a signature: without one MLflow would load the model to infer it from the example. Rows
    whose layout has no column schema get an output-only signature.
    """
    example, outputs = pd.DataFrame(example_rows(task, 2)), [label_names[0]] * 2
    try:
        return mlflow.models.infer_signature(example, outputs), example
    except Exception as exc:  # noqa: BLE001 - a layout MLflow cannot describe as columns
        logger.info("No input schema for %s rows (%s); the signature describes the output only", task, exc)
        return ModelSignature(inputs=None, outputs=mlflow.models.infer_signature(example.iloc[:, :1],
                                                                                  outputs).outputs), example


class _PyfuncWithoutServingCheck:
    """`mlflow.pyfunc` as `Model.log`'s flavor, logged without the serving-input check.

    That check loads the just-saved model and predicts on the input example: for a capsule, a rebuild
    of the base model in the middle of every trial's finish. The example is still stored and checked
    against the (explicit) signature; the model's own loading is tested where it belongs, on load.
    `Model.log` hands its ``validate_serving_input`` keyword to the flavor too, which pyfunc's
    `save_model` would refuse, hence this wrapper.
    """

    __name__ = "mlflow.pyfunc"

    @staticmethod
    def save_model(*, validate_serving_input: bool = True, **kwargs: Any) -> None:
        mlflow.pyfunc.save_model(**kwargs)


def capsule_model_name(model_slug: str, task: str) -> str:
    """The logged model's name, as the UI lists it: ``capsule-<model-slug>-<task>``."""
    return f"capsule-{model_slug}-{task}"


def log_pyfunc(signature: ModelSignature, example: pd.DataFrame, artifacts: dict[str, str], name: str,
                tags: Mapping[str, str], step: int, model_code: Path = MODEL_CODE) -> Any:
    """Log the models-from-code pyfunc `model_code` to the active run; nothing loads the model on the way.

    `step`: the run's metrics at that step are linked to the logged model (MLflow 3 logged models).
    """
    with tempfile.TemporaryDirectory() as code:
        return Model.log(
            artifact_path=None, name=name, flavor=_PyfuncWithoutServingCheck, validate_serving_input=False,
            flavor_name="pyfunc.ModelFromCode", python_model=str(model_code), signature=signature, tags=dict(tags),
            step=step, input_example=example, artifacts=artifacts, pip_requirements=_requirements(),
            code_paths=[str(write_code_archive(Path(code)))])


def _version_tags(result: Mapping[str, Any]) -> dict[str, str]:
    metrics = result.get("metrics", {})
    return {"task": result["task"], "method": result["method"], "base_model": result["model"],
            "model_slug": result["model_slug"], "seed": str(result.get("seed")), "validation_status": "pending",
            "config_hash": str(result.get("config_hash")),
            **({"artifact_digest": str(result["artifact_digest"])} if result.get("artifact_digest") else {}),
            **{k: str(metrics[k]) for k in ("test_score", "best_validation_score") if k in metrics}}


def _logged_code_tags(client: MlflowClient, uri: str, model_id: str, folder: Path) -> dict[str, str]:
    """`code_tags` of logged model `model_id` as the artifact store at `uri` holds it: everything but its
    ``artifacts/`` folder (the capsule, checked by its own digests) downloaded into `folder` and hashed."""
    location = client.get_logged_model(model_id).artifact_location.rstrip("/")
    for entry in client.list_logged_model_artifacts(model_id):
        if entry.path != DATA_FOLDER:
            download_to(uri, f"{location}/{entry.path}", folder)
    return code_tags(folder)


def register_capsule(client: MlflowClient, uri: str, run_id: str, result: Mapping[str, Any], artifact_dir: Path,
                     ui_uri: str) -> tuple[str, str | None]:
    """Log the capsule pyfunc to the run and register it (once per run) as a new version with a description.

    Returns (version, logged model id). `ui_uri` is the server the description's loading snippet names.
    """
    name = registered_model_name(result["model_slug"], result["task"])
    existing = client.search_model_versions(f"name='{name}' and run_id='{run_id}'")
    if existing:
        return str(existing[0].version), getattr(existing[0], "model_id", None)
    signature, example = pyfunc_signature(result["task"], task_spec(result["task"]).label_names)
    tags = _version_tags(result)
    source = {k: v for k, v in client.get_run(run_id).data.tags.items() if k.startswith("mlflow.source.")}
    with tempfile.TemporaryDirectory() as tmp, fluent_uri(uri), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        result_path = Path(tmp) / "result.json"
        # The version's result.json names the registered model it belongs under: the pyfunc checks it on load.
        result_path.write_text(json.dumps({**result, REGISTERED_MODEL_KEY: name}, indent=2, default=str),
                               encoding="utf-8")
        with mlflow.start_run(run_id=run_id):
            info = log_pyfunc(signature, example, {"capsule": str(artifact_dir), "result": str(result_path)},
                               capsule_model_name(result["model_slug"], result["task"]),
                               {**source, "task": result["task"], "base_model": result["model"]},
                               int(result.get("steps", 0)))
        # what runs on load, hashed as the store holds it, recorded where the store cannot change it
        version = mlflow.register_model(info.model_uri, name, tags={**tags, **_logged_code_tags(
            client, uri, info.model_id, Path(tmp) / "logged")})
    code = code_size()
    client.update_model_version(name, version.version, description=version_description(
        name, str(version.version), result, ui_uri, example_rows(result["task"], 1), code))
    with contextlib.suppress(MlflowException):
        for key in ("task", "base_model", "model_slug"):
            client.set_registered_model_tag(name, key, tags[key])
        if not client.get_registered_model(name).description:
            client.update_registered_model(name, description=registered_model_description(
                name, result["task"], result["model"]))
    logger.info("Registered %s version %s (run %s); its logged model carries %d KB of project code in %d files "
                "(one archive)", name, version.version, run_id, code[0] // 1024, code[1])
    return str(version.version), info.model_id


SNIPPET_FENCE = re.compile(r"```python\n(.*?)```", re.S)
"""Finds the loading snippet in a description."""


def _score(metrics: Mapping[str, Any], key: str) -> str:
    value = metrics.get(key)
    return "-" if not isinstance(value, int | float) else f"{value:.2f}"


def _size(raw: Any) -> str:
    try:
        size = int(raw)
    except (TypeError, ValueError):
        return "-"
    return f"{size / 1024:.1f} KiB" if size < 2**20 else f"{size / 2**20:.1f} MiB"


def _digest_lines(result: Mapping[str, Any]) -> list[str]:
    """The artifact's SHA-256 digests (every reader verifies them before use), when the job recorded them."""
    if not result.get("artifact_digest"):
        return []
    files = ", ".join(f"`{name}` {sha}" for name, sha in sorted((result.get("artifact_files") or {}).items()))
    return [f"Artifact digest (SHA-256 of its files' digests, verified on every load): `{result['artifact_digest']}`"
            + (f"; files: {files}." if files else "."), ""]


def code_line(logged_model: str, code: tuple[int, int] | None) -> list[str]:
    """Why the logged model is far larger than the capsule: `code` (bytes, files) of this project's code in it."""
    if code is None:
        return []
    size, files = code
    return [f"The logged model `{logged_model}` holds more than the capsule: `code/project_code.zip` packs this "
            f"project's code, {_size(size)} in {files} files (the `capt` and `pipelines` packages), copied into every "
            "version so that loading it runs the code that trained and wrote this capsule; its digest, with the model "
            "file's and MLmodel's, is the version's `code_digest` tag, which the loader below checks before anything "
            "of it runs.", ""]


def version_description(name: str, version: str, result: Mapping[str, Any], tracking_uri: str,
                        rows: list[dict[str, Any]], code: tuple[int, int] | None = None) -> str:
    """Markdown for the version page (MLflow renders a version's description as Markdown); `code`: the (bytes,
    files) of project code in the logged model (`code_line`)."""
    metrics = result.get("metrics", {})
    data = "data generated by the project (not benchmark data)" if result.get("generated_data") else "real task data"
    return "\n".join([
        f"CaPT capsule for **{result['task']}** on base model **{result['model']}** (method `{result['method']}`, "
        f"seed {result.get('seed')}), trained on {data}.",
        "",
        "| validation score (best) | test score | capsule size | trainable parameters | steps |",
        "|---:|---:|---:|---:|---:|",
        f"| {_score(metrics, 'best_validation_score')} | {_score(metrics, 'test_score')} | "
        f"{_size(result.get('capsule_bytes'))} | {result.get('trainable_parameters', '-')} | "
        f"{result.get('steps', '-')} |",
        "",
        "What the test score has to beat, on the same test split: the majority class "
        f"{_score(metrics, 'test_majority_score')}, chance {_score(metrics, 'test_chance_score')}, the untrained "
        f"model {_score(metrics, 'test_untrained_score')} (`train.score_untrained`; - when not scored).",
        "",
        *code_line(capsule_model_name(result.get("model_slug", result["model"]), result["task"]), code),
        *_digest_lines(result),
        "Load it and predict label names for raw task rows (needs this project installed; the loader verifies the "
        "version's code and capsule against its tags first, the base model is rebuilt by name and the capsule "
        "loaded onto it):",
        "",
        "```python",
        # the verified loader: plain `mlflow.pyfunc.load_model` would run the version's bundled code unchecked
        "import pandas as pd\n\nfrom pipelines.tracking import load_capsule_model\n",
        f"model = load_capsule_model({f'models:/{name}/{version}'!r}, tracking_uri={tracking_uri!r})",
        f"rows = pd.DataFrame({rows!r})\nprint(model.predict(rows))",
        "```",
    ])


def registered_model_description(name: str, task: str, model: str) -> str:
    """Markdown for the registered model's page: what its versions are and how one becomes the champion."""
    return (f"CaPT capsules for task **{task}** on base model **{model}**, one version per trained trial. Each version "
            "says its scores, data and digest, and how to load it. `champion` names the best version on the "
            f"validation score (`python -m pipelines.promote --model {model} --task {task}`, which never looks at "
            f"the test score); serve it with `python -m pipelines.serve --model {model} --tasks {task}`.")
