"""What a trial's MLflow run holds: metric names MLflow groups, params, tags and the per-run summary.

The project's own names (result.json, Tune, `promote --metric`, `report --metric`) stay flat: ``test_score``,
``best_validation_score``, ``train_loss``. MLflow groups a chart section per prefix before ``/``, so the
run logs them as ``test/score``, ``validation/best_score``, ``train/loss``; `project_metric_name` maps
back when runs are read (`pipelines.tracking.registry`). Needs no mlflow.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipelines.config.schema import flatten

METRIC_GROUPS = ("train", "validation", "test")
"""Prefixes of the project's flat metric names that become MLflow chart groups (``train_loss`` -> ``train/loss``)."""
PERF_METRICS = ("wall_time_s", "tokens_per_second", "peak_memory_mb")
"""Whole-run throughput and memory figures, logged once under ``perf/`` (promotion may choose by them)."""
_RENAMED = {"best_validation_score": "validation/best_score", "epoch": "train/epoch",
            **{name: f"perf/{name}" for name in PERF_METRICS}}
_RENAMED_BACK = {v: k for k, v in _RENAMED.items()}
_CURVES = ("train_loss", "best_validation_score")
"""Final metrics that the validation records already logged step by step."""
SUMMARY_KEYS = ("steps", "epochs", "best_step", "stopped_early", "trainable_parameters", "processes")
"""One-off numbers of a finished run: tags, so they are never drawn as single dots among the curves."""
PATH_PARAMS = {"output_dir": "output_dir", "task.data_dir": "data_dir"}
"""Config fields holding paths (different in every run): logged as these tags, never as params."""
HEAD_PARAMS = ("optim.head_lr",)
"""Config fields that only mean something for a model with a classifier head (encoder family)."""
DESCRIPTION_TAG = "mlflow.note.content"
"""The tag MLflow shows as a run's (or an experiment's) description."""
RUN_KIND_TAG = "run_kind"
"""``sweep`` on a sweep's parent run, ``job`` on a single job's run (a trial's run carries its task, model, method
and seed instead)."""


def mlflow_metric_name(name: str) -> str:
    """The MLflow name of a project metric: ``test_score`` -> ``test/score``; ``system/...`` and others unchanged."""
    if name in _RENAMED:
        return _RENAMED[name]
    group, _, rest = name.partition("_")
    return f"{group}/{rest}" if group in METRIC_GROUPS and rest else name


def project_metric_name(name: str) -> str:
    """The project name of an MLflow metric (inverse of `mlflow_metric_name`)."""
    if name in _RENAMED_BACK:
        return _RENAMED_BACK[name]
    group, _, rest = name.partition("/")
    return f"{group}_{rest}" if group in METRIC_GROUPS and rest else name


def mlflow_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
    return {mlflow_metric_name(k): v for k, v in metrics.items()}


def project_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
    return {project_metric_name(k): v for k, v in metrics.items()}


def numeric_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Finite numbers only, as floats (bools, NaN and infinities dropped): what Tune and MLflow take as metrics."""
    return {k: float(v) for k, v in metrics.items()
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(float(v))}


def final_metrics(result: Mapping[str, Any]) -> dict[str, float]:
    """The one-off metrics of a finished trial (MLflow names): test scores and perf figures.

    They are logged at step 0, which the MLflow UI draws as bar charts across runs (a single point at a later
    step is drawn as a lone dot on a line chart). ``train_loss`` and ``best_validation_score`` are left out:
    the validation records already logged them as curves.
    """
    chosen = {k: v for k, v in result.get("metrics", {}).items() if k not in _CURVES}
    chosen.update({k: result[k] for k in PERF_METRICS if k in result})
    return mlflow_metrics(numeric_metrics(chosen))


def summary_tags(result: Mapping[str, Any], artifact_dir: Path) -> dict[str, str]:
    """The per-run summary as tags: steps, best step, trainable parameters, capsule bytes, ..."""
    tags = {key: str(result[key]) for key in SUMMARY_KEYS if key in result}
    if result.get("artifact_digest"):  # what a reused result and a registered version are verified against
        tags["artifact_digest"] = str(result["artifact_digest"])
    if artifact_dir.is_dir():
        tags["capsule_bytes"] = str(sum(p.stat().st_size for p in artifact_dir.rglob("*") if p.is_file()))
    return tags


def run_params(config: Mapping[str, Any], classifier_head: bool) -> tuple[dict[str, Any], dict[str, str]]:
    """(params, tags) of a resolved job config: paths become tags; None, empty values and, for a model
    without a classifier head (`ArchSpec.classifier_head`), head-only fields are left out."""
    flat = flatten(dict(config))
    params = {key: value for key, value in flat.items() if key not in PATH_PARAMS and value not in (None, {}, [])
              and not (key in HEAD_PARAMS and not classifier_head)}
    tags = {PATH_PARAMS[key]: str(value) for key, value in flat.items() if key in PATH_PARAMS and value is not None}
    return params, tags
