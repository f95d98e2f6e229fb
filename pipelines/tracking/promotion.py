"""The promotion policy of `python -m pipelines.promote` (its docstring states it): the best registered capsule of one
(base model, task) by its source run's metric becomes ``champion``, after its artifact is verified; what the other
versions' tags then say; what it may choose on (the selection metric, the metrics whose direction is known) and the
check of its arguments (every bad one named at once, before any server is asked)."""

from __future__ import annotations

import logging
import math
import os
import tempfile
import warnings
from dataclasses import dataclass, field
from datetime import UTC, datetime

from capt.errors import CaptError
from capt.tasks.registry import TASK_NAMES
from pipelines.config.schema import model_slug
from pipelines.provenance import registered_model_name
from pipelines.services import ServiceError
from pipelines.services.mlflow_server import check_mlflow_server
from pipelines.tracking.client import TrackingError
from pipelines.tracking.registry import Registry, VersionInfo, download_verified_version, registered_names
from pipelines.tracking.run_content import project_metric_name

logger = logging.getLogger(__name__)

SELECTION_METRIC = "best_validation_score"
"""The default: the validation score of the job's best checkpoint."""
_SCORES = ("score", "accuracy", "macro_f1", "f1a", "em")
METRIC_DIRECTIONS: dict[str, bool] = {
    SELECTION_METRIC: True, "train_loss": False, "tokens_per_second": True, "wall_time_s": False,
    "peak_memory_mb": False, **{f"{split}_{name}": True for split in ("validation", "test") for name in _SCORES},
}
"""Run metrics whose direction is known: True when higher is better."""


class PromotionError(CaptError, RuntimeError):
    """Promotion was refused or impossible; nothing was changed. The message says why and what to do."""


def check_arguments(task: str, metric: str, min_value: float | None, higher_is_better: bool | None) -> None:
    """PromotionError naming every bad argument at once (before any server is asked): a `--min` that is NaN or
    infinite (argparse's float accepts both), an unknown task, a metric whose direction is unknown or given wrong."""
    problems = []
    if min_value is not None and not math.isfinite(min_value):
        problems.append(f"--min {min_value}: not a finite number. Give a plain number (e.g. --min 70), or leave "
                        "--min out.")
    if task not in TASK_NAMES:
        problems.append(f"Unknown task {task!r}; tasks: {', '.join(TASK_NAMES)}.")
    try:
        metric_direction(project_metric_name(metric), higher_is_better)
    except PromotionError as err:
        problems.append(str(err))
    if problems:
        raise PromotionError(" ".join(problems))


def metric_direction(metric: str, higher_is_better: bool | None = None) -> bool:
    """Whether higher `metric` is better: `higher_is_better` when given, else the known direction.

    PromotionError when the direction is unknown and not given, or given against the known one.
    """
    known = METRIC_DIRECTIONS.get(metric)
    if higher_is_better is None and known is None:
        raise PromotionError(
            f"--metric {metric!r}: its direction is unknown, so the best version cannot be chosen. Known metrics: "
            f"{', '.join(sorted(METRIC_DIRECTIONS))}; for another metric add --lower-is-better or --higher-is-better.")
    if higher_is_better is not None and known is not None and higher_is_better != known:
        said, really = ("higher", "lower") if higher_is_better else ("lower", "higher")
        raise PromotionError(f"--metric {metric!r} with --{said}-is-better: for this metric {really} is better; "
                             "drop the direction flag.")
    return known if higher_is_better is None else higher_is_better


CHAMPION, CHALLENGER = "champion", "challenger"
STATUS_TAG, REASON_TAG = "validation_status", "validation_reason"
STAGES = ("Staging", "Production", "Archived", "None")


class PromotionRefused(PromotionError):
    """The best version is below the required minimum (`--min`)."""


@dataclass
class Promotion:
    """What a promotion did."""

    name: str
    champion: int
    value: float
    metric: str
    previous: int | None
    """The former champion (now challenger), if it changed."""
    changed: bool
    """Whether the champion alias moved."""
    changes: list[str] = field(default_factory=list)
    """Every change made to the registry, one phrase each (aliases moved, tags set, stage moved); empty: none."""


def metric_value(version: VersionInfo, metric: str) -> float | None:
    """`metric` as the version's source run logged it; None when the run is unknown or its value is not finite.

    Version tags are never read: they can be edited by anyone with registry write access.
    """
    value = None if version.run_error else version.metrics.get(metric)
    return value if value is not None and math.isfinite(value) else None


def unscored_reason(version: VersionInfo, metric: str) -> str:
    """Why `metric_value` of `version` is None, in words."""
    if version.run_error:
        return version.run_error
    if metric not in version.metrics:
        return f"its source run {version.run_id} logged no {metric!r}"
    return f"its source run {version.run_id} logged {metric}={version.metrics[metric]}, not a finite number"


def choose_best(versions: list[VersionInfo], metric: str, higher_is_better: bool = True) -> tuple[VersionInfo, float]:
    """The best version by `metric` as logged by its source run (ties: the current champion, else the newest).

    A version without a finite value is skipped, with the reason logged; PromotionError when none is left.
    """
    scored = [(v, value) for v in versions if (value := metric_value(v, metric)) is not None]
    skipped = [f"version {v.version}: {unscored_reason(v, metric)}"
               for v in versions if metric_value(v, metric) is None]
    for text in skipped:
        logger.warning("Not a candidate for %s of %s: %s", CHAMPION, versions[0].name, text)
    if not scored:
        known = sorted({k for v in versions for k in v.metrics if not k.startswith("system/")})
        raise PromotionError(f"No version's source run logged a numeric {metric!r} (skipped: {'; '.join(skipped)}); "
                             f"pass --metric with one of: {', '.join(known) or 'none'}.")
    sign = 1.0 if higher_is_better else -1.0
    return max(scored, key=lambda pair: (sign * pair[1], CHAMPION in pair[0].aliases, pair[0].version))


def _versions(registry: Registry, name: str, model: str, task: str) -> list[VersionInfo]:
    try:
        versions = registry.versions(name)
    except TrackingError as err:
        known = registered_names(registry.uri)
        raise PromotionError(
            f"There is no registered model {name!r} (model {model!r}, task {task!r}) at {registry.uri}. "
            f"Capsules are registered by CaPT trials run with tracking on; registered capsule models there: "
            f"{', '.join(known) or 'none'}. Check --model (a name like google-t5/t5-base or its slug "
            f"t5-base), --task and --tracking-uri.") from err
    if not versions:
        raise PromotionError(f"The registered model {name!r} at {registry.uri} has no versions yet: run a CaPT "
                             "trial with tracking on first.")
    return versions


def promote(model: str, task: str, metric: str = SELECTION_METRIC, min_value: float | None = None,
            stage: str | None = None, tracking_uri: str | None = None,
            higher_is_better: bool | None = None) -> Promotion:
    """Apply the promotion policy (module docstring) to `capt-<slug(model)>-<task>`."""
    check_arguments(task, metric, min_value, higher_is_better)
    metric = project_metric_name(metric)  # the UI's name (test/score) or the project's (test_score)
    higher = metric_direction(metric, higher_is_better)
    if metric.startswith("test_"):
        logger.warning("Choosing the champion on %s, a test metric: the test split is then no longer a fair "
                       "estimate of the champion's quality. The default, %s, selects on validation.",
                       metric, SELECTION_METRIC)
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        raise PromotionError("No tracking server: pass --tracking-uri or set MLFLOW_TRACKING_URI.")
    try:
        check_mlflow_server(uri, "MLflow tracking server (--tracking-uri or MLFLOW_TRACKING_URI)")
    except ServiceError as err:
        raise PromotionError(str(err)) from err
    registry = Registry(uri)
    name = registered_model_name(model_slug(model), task)
    versions = _versions(registry, name, model, task)
    best, value = choose_best(versions, metric, higher)
    if min_value is not None and (value < min_value if higher else value > min_value):
        worse = "below" if higher else "above"
        raise PromotionRefused(f"Refused: the best version of {name} is {best.version} with {metric}={value:.4g}, "
                               f"{worse} --min {min_value:g}. Nothing was changed.")
    _verify_artifact(registry, name, best)
    previous = next((v for v in versions if CHAMPION in v.aliases), None)
    changed = previous is None or previous.version != best.version
    changes = _move_aliases(registry, name, versions, best, previous)
    changes += _tag_champion(registry, name, best, metric, value, changed)
    holder = previous if changed else next((v for v in versions if CHALLENGER in v.aliases), None)
    changes += _tag_others(registry, name, versions, best, metric, value, holder)
    if stage:
        changes += _set_stage(registry, name, best, stage)
    return Promotion(name, best.version, value, metric, previous.version if previous and changed else None, changed,
                     changes)


def _verify_artifact(registry: Registry, name: str, best: VersionInfo) -> None:
    """Download the chosen version and verify it (digests recorded by the tracking database, result.json and its
    manifest; task and base model against `name`) before any alias moves; PromotionError when it fails."""
    with tempfile.TemporaryDirectory(prefix="capt-promote-") as tmp:
        try:
            download_verified_version(registry.uri, name, best.version, tmp)
        except (CaptError, TrackingError) as err:
            raise PromotionError(f"Refused: version {best.version} of {name}, the best by its run's metrics, "
                                 f"cannot be promoted. {err} Nothing was changed.") from err


def _version(version: VersionInfo | None) -> str:
    return "none" if version is None else f"version {version.version}"


def _move_aliases(registry: Registry, name: str, versions: list[VersionInfo], best: VersionInfo,
                  previous: VersionInfo | None) -> list[str]:
    """Champion to `best`; a displaced champion becomes challenger; the champion is never also challenger."""
    if previous is not None and previous.version == best.version:
        if CHALLENGER not in best.aliases:
            return []
        registry.delete_alias(name, CHALLENGER)
        return [f"alias {CHALLENGER} removed from version {best.version} (it is the {CHAMPION})"]
    challenger = next((v for v in versions if CHALLENGER in v.aliases), None)
    registry.client.set_registered_model_alias(name, CHAMPION, str(best.version))
    changes = [f"alias {CHAMPION} moved from {_version(previous)} to version {best.version}"]
    if previous is not None:
        registry.client.set_registered_model_alias(name, CHALLENGER, str(previous.version))
        changes.append(f"alias {CHALLENGER} moved from {_version(challenger)} to version {previous.version}")
    elif challenger is not None and challenger.version == best.version:
        registry.delete_alias(name, CHALLENGER)
        changes.append(f"alias {CHALLENGER} removed from version {best.version} (it is the {CHAMPION})")
    return changes


def _tag_champion(registry: Registry, name: str, best: VersionInfo, metric: str, value: float,
                  changed: bool) -> list[str]:
    """The champion's approval tags, set when it became champion or was chosen by another metric than before."""
    tags = {STATUS_TAG: "approved", "promoted_metric": metric, "promoted_value": str(value)}
    if not changed and all(best.tags.get(key) == text for key, text in tags.items()):
        return []
    tags["promoted_at"] = datetime.now(UTC).isoformat(timespec="seconds")
    registry.set_tags(name, best.version, tags)
    return [f"tags of version {best.version} set: " + ", ".join(f"{key}={text}" for key, text in tags.items())]


def _tag_others(registry: Registry, name: str, versions: list[VersionInfo], best: VersionInfo, metric: str,
                value: float, challenger: VersionInfo | None) -> list[str]:
    """Every version but the champion tagged with what this promotion decided of it (module docstring); only tags
    that change are written, so that a repeated promotion changes nothing."""
    changes = []
    for version in versions:
        if version.version == best.version:
            if REASON_TAG in version.tags:  # a reason why it was not chosen, from an earlier promotion
                registry.delete_tag(name, version.version, REASON_TAG)
                changes.append(f"tag {REASON_TAG} removed from version {version.version} (it is the {CHAMPION})")
            continue
        score = metric_value(version, metric)
        if score is None:
            tags = {STATUS_TAG: "not_evaluated", REASON_TAG: f"not a candidate: {unscored_reason(version, metric)}"}
        else:
            held = challenger is not None and challenger.version == version.version
            tags = {STATUS_TAG: CHALLENGER if held else "not_promoted",
                    REASON_TAG: f"{metric}={score:.4g}, not better than {CHAMPION} version {best.version} "
                                f"({value:.4g})"}
        new = {key: text for key, text in tags.items() if version.tags.get(key) != text}
        if new:
            registry.set_tags(name, version.version, new)
            changes.append(f"tags of version {version.version} set: "
                           + ", ".join(f"{key}={text}" for key, text in new.items()))
    return changes


def _set_stage(registry: Registry, name: str, best: VersionInfo, stage: str) -> list[str]:
    if best.stage == stage:
        return []
    logger.warning("Model Registry stages are deprecated since MLflow 2.9 (aliases replace them); "
                   "moving version %d to stage %s anyway.", best.version, stage)
    with warnings.catch_warnings():  # MLflow's own FutureWarning says what the line above says
        warnings.simplefilter("ignore", FutureWarning)
        registry.client.transition_model_version_stage(name, str(best.version), stage)
    return [f"stage of version {best.version} moved from {best.stage} to {stage}"]
