"""Promote the best registered capsule of one (base model, task): aliases champion/challenger, tags.

    python -m pipelines.promote --model tiny-t5 --task rte [--metric best_validation_score] [--min 70]
                                [--stage Production] [--tracking-uri http://127.0.0.1:5000]

Policy: the version with the best `--metric` becomes ``champion``; ties keep the current champion, otherwise the
newest version wins. Scores are read from the metrics that the version's source run (the run id of the model
version) logged, never from version tags or descriptions, which anyone with registry write access can edit; a
version whose source run is missing, deleted or lacks the metric is skipped, with the reason logged. The default
metric is the validation score (`best_validation_score`): selection on validation, never on test. `--metric` takes
only metrics whose direction is known (`pipelines.tracking.promotion.METRIC_DIRECTIONS`), or any metric with
`--lower-is-better` / `--higher-is-better`; choosing on a test metric is allowed but logged as a warning. A previous
champion that loses the alias becomes ``challenger``. The champion gets ``validation_status=approved``,
``promoted_at`` and the metric's value as tags, for display only (when it becomes champion, or is chosen by another
metric than before). Every other version's ``validation_status`` (``pending`` when registered) then says what this
promotion decided, with the reason in ``validation_reason``: ``challenger`` (the version holding that alias) or
``not_promoted`` (evaluated, not the best), or ``not_evaluated`` (skipped: no finite value of the metric). A refused
promotion (``--min``, a version failing its check) changes no tag. The command prints each change it made (alias moved
from which version to which, tags, stage), or that it changed nothing. ``--min`` refuses (exit 1, nothing changed) when
the best is worse than it (below it, or above it for a lower-is-better metric); it must be a finite number (NaN or
infinity: exit 2). ``--stage`` also moves the legacy stage (deprecated in MLflow since 2.9).
"""

from __future__ import annotations

import argparse
import sys

from pipelines.cli_errors import cli_main
from pipelines.tracking.client import TrackingError
from pipelines.tracking.promotion import (
    CHAMPION,
    SELECTION_METRIC,
    STAGES,
    PromotionError,
    PromotionRefused,
    check_arguments,
    promote,
)

__all__ = ["PromotionError", "main", "promote"]


def main(argv: list[str] | None = None) -> int:
    """CLI; exit 0 when promoted, 1 when refused by --min, 2 for any other problem."""
    parser = argparse.ArgumentParser(prog="python -m pipelines.promote", description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="base model name or slug (google-t5/t5-base, t5-base)")
    parser.add_argument("--task", required=True, help="task name (rte, boolq, ...)")
    parser.add_argument("--metric", default=SELECTION_METRIC,
                        help=f"metric to choose by (default: {SELECTION_METRIC}, the validation score)")
    direction = parser.add_mutually_exclusive_group()
    direction.add_argument("--lower-is-better", dest="higher_is_better", action="store_false", default=None,
                           help="the metric's direction, needed for metrics not in the known list")
    direction.add_argument("--higher-is-better", dest="higher_is_better", action="store_true", default=None,
                           help="the metric's direction, needed for metrics not in the known list")
    parser.add_argument("--min", dest="min_value", type=float, default=None,
                        help="refuse when the best is worse than this value (a finite number)")
    parser.add_argument("--stage", choices=STAGES, default=None, help="also set this legacy stage (deprecated)")
    parser.add_argument("--tracking-uri", default=None,
                        help="default: MLFLOW_TRACKING_URI, else the local store outputs/mlflow that `make demo` wrote")
    return cli_main(parser, argv, _promote_from_cli, expected=(TrackingError,))


def _promote_from_cli(args: argparse.Namespace) -> int:
    from pipelines.services.mlflow_server import tracking_store

    check_arguments(args.task, args.metric, args.min_value, args.higher_is_better)  # before a local server starts
    try:
        with tracking_store(args.tracking_uri) as store:
            print(f"Tracking store: {store.origin}", file=sys.stderr)
            done = promote(args.model, args.task, args.metric, args.min_value, args.stage, store.uri,
                           args.higher_is_better)
    except PromotionRefused as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    chosen = f"version {done.champion} has the best {done.metric} ({done.value:.4g})"
    if not done.changes:
        print(f"{done.name}: no change: {chosen} and is already {CHAMPION}.")
    else:  # one line per change
        print("\n".join([f"{done.name}: {chosen}. Changed:", *(f"  - {change}" for change in done.changes)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
