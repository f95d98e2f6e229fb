"""Promote the best registered capsule of one (base model, task): aliases champion/challenger, tags.

    python -m pipelines.promote --model tiny-t5 --task rte [--metric test_score] [--min 70]
                                [--stage Production] [--tracking-uri http://127.0.0.1:5000]

Policy: the version with the highest `--metric` (a version tag, else its run's metric) becomes
``champion``; ties keep the current champion, otherwise the newest version wins. A previous champion
that loses the alias becomes ``challenger``. The champion gets ``validation_status=approved``,
``promoted_at`` and the metric's value as tags. ``--min`` refuses (exit 1, nothing changed) when the
best is below it; ``--stage`` also moves the legacy stage (deprecated in MLflow since 2.9).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
from dataclasses import dataclass
from datetime import UTC, datetime

from capt.errors import CaptError
from pipelines.cli_errors import add_debug_flag, run_cli
from pipelines.config import TASKS, model_slug
from pipelines.services import ServiceError
from pipelines.services.mlflow_probe import check_mlflow_server
from pipelines.tracking import Registry, TrackingError, VersionInfo
from pipelines.tracking_spool import registered_model_name

logger = logging.getLogger(__name__)

CHAMPION, CHALLENGER = "champion", "challenger"
STAGES = ("Staging", "Production", "Archived", "None")


class PromotionError(CaptError, RuntimeError):
    """Promotion was refused or impossible; nothing was changed. The message says why and what to do."""


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


def metric_value(version: VersionInfo, metric: str) -> float | None:
    """`metric` of a version: its tag, else its run's metric; None when neither is a finite number."""
    for raw in (version.tags.get(metric), version.metrics.get(metric)):
        try:
            value = float(raw)
        except (TypeError, ValueError):
            continue
        if math.isfinite(value):
            return value
    return None


def choose_best(versions: list[VersionInfo], metric: str) -> tuple[VersionInfo, float]:
    """The best version by `metric` (ties: the current champion, else the newest); PromotionError if none."""
    scored = [(v, value) for v in versions if (value := metric_value(v, metric)) is not None]
    if not scored:
        raise PromotionError(f"No version has a numeric {metric!r} (as a version tag or a run metric); "
                             f"pass --metric with one of: {', '.join(_known_metrics(versions)) or 'none'}.")
    return max(scored, key=lambda pair: (pair[1], CHAMPION in pair[0].aliases, pair[0].version))


def _known_metrics(versions: list[VersionInfo]) -> list[str]:
    return sorted({k for v in versions for k in v.metrics if not k.startswith("system/")})


def _versions(registry: Registry, name: str, model: str, task: str) -> list[VersionInfo]:
    try:
        versions = registry.versions(name)
    except TrackingError as err:
        known = registry.model_names()
        raise PromotionError(
            f"There is no registered model {name!r} (model {model!r}, task {task!r}) at {registry.uri}. "
            f"Capsules are registered by CaPT trials run with tracking on; registered capsule models there: "
            f"{', '.join(known) or 'none'}. Check --model (a name like google-t5/t5-base or its slug "
            f"t5-base), --task and --tracking-uri.") from err
    if not versions:
        raise PromotionError(f"The registered model {name!r} at {registry.uri} has no versions yet: run a CaPT "
                             "trial with tracking on first.")
    return versions


def promote(model: str, task: str, metric: str = "test_score", min_value: float | None = None,
            stage: str | None = None, tracking_uri: str | None = None) -> Promotion:
    """Apply the promotion policy (module docstring) to `capt-<slug(model)>-<task>`."""
    if task not in TASKS:
        raise PromotionError(f"Unknown task {task!r}; tasks: {', '.join(TASKS)}.")
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
    best, value = choose_best(versions, metric)
    if min_value is not None and value < min_value:
        raise PromotionRefused(f"Refused: the best version of {name} is {best.version} with {metric}={value:.4g}, "
                             f"below --min {min_value:g}. Nothing was changed.")
    previous = next((v for v in versions if CHAMPION in v.aliases), None)
    changed = previous is None or previous.version != best.version
    if previous is not None and changed:
        registry.set_alias(name, CHALLENGER, previous.version)
    elif CHALLENGER in best.aliases:
        registry.delete_alias(name, CHALLENGER)
    registry.set_alias(name, CHAMPION, best.version)
    registry.set_tags(name, best.version, {"validation_status": "approved", "promoted_metric": metric,
                                           "promoted_value": value,
                                           "promoted_at": datetime.now(UTC).isoformat(timespec="seconds")})
    if stage:
        logger.warning("Model Registry stages are deprecated since MLflow 2.9 (aliases replace them); "
                       "moving version %d to stage %s anyway.", best.version, stage)
        registry.transition_stage(name, best.version, stage)
    return Promotion(name, best.version, value, metric, previous.version if previous and changed else None, changed)


def main(argv: list[str] | None = None) -> int:
    """CLI; exit 0 when promoted, 1 when refused by --min, 2 for any other problem."""
    parser = argparse.ArgumentParser(prog="python -m pipelines.promote", description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="base model name or slug (google-t5/t5-base, t5-base)")
    parser.add_argument("--task", required=True, help="task name (rte, boolq, ...)")
    parser.add_argument("--metric", default="test_score", help="higher is better (default: test_score)")
    parser.add_argument("--min", dest="min_value", type=float, default=None, help="refuse below this value")
    parser.add_argument("--stage", choices=STAGES, default=None, help="also set this legacy stage (deprecated)")
    parser.add_argument("--tracking-uri", default=None, help="default: MLFLOW_TRACKING_URI")
    add_debug_flag(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return run_cli(lambda: _promote_from_cli(args), args.debug, expected=(TrackingError,))


def _promote_from_cli(args: argparse.Namespace) -> int:
    try:
        done = promote(args.model, args.task, args.metric, args.min_value, args.stage, args.tracking_uri)
    except PromotionRefused as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    note = f"; version {done.previous} is now {CHALLENGER}" if done.previous else ""
    status = "promoted" if done.changed else "already champion"
    print(f"{done.name}: version {done.champion} {status} as {CHAMPION} ({done.metric}={done.value:.4g}){note}.")
    print(f"Load it with mlflow.pyfunc.load_model('models:/{done.name}@{CHAMPION}').")
    return 0


if __name__ == "__main__":
    sys.exit(main())
