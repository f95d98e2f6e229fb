"""What `pipelines.promote` may choose on: the selection metric, the metrics whose direction is known, and the
check of its arguments (every bad one named at once, before any server is asked)."""

from __future__ import annotations

import math

from capt.errors import CaptError
from capt.tasks.registry import TASK_NAMES
from pipelines.tracking.run_content import project_metric_name

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
