"""A finished trial's result.json, reused by a restarted sweep, must say what its MLflow run logged.

result.json carries its own digest (`pipelines.training.cached`), which catches an edit but not someone who
recomputes it; the run's metrics live in the tracking database, out of reach of whoever can only write the
output folder. So a reused result's scores are compared with the run's (the final metrics and the last
best-validation score it logged); any difference refuses the trial with the way out.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

from pipelines.tracking.client import mlflow_client
from pipelines.tracking.run_content import final_metrics, mlflow_metric_name, project_metric_name
from pipelines.training.cached import WAY_OUT, CachedResultError

logger = logging.getLogger(__name__)


def score_mismatches(logged: Mapping[str, float], result: Mapping[str, Any]) -> list[str]:
    """``name: result.json X, run Y`` for every score of `result` that the run's `logged` metrics (MLflow names)
    lack or hold another value of."""
    expected = dict(final_metrics(result))
    best = result.get("metrics", {}).get("best_validation_score")
    if isinstance(best, int | float) and math.isfinite(best):
        expected[mlflow_metric_name("best_validation_score")] = float(best)
    return [f"{project_metric_name(name)}: result.json {value!r}, run {logged.get(name)!r}"
            for name, value in sorted(expected.items())
            if name not in logged or not math.isclose(logged[name], value, rel_tol=1e-9, abs_tol=1e-12)]


def verify_against_run(uri: str, run_id: str, result: Mapping[str, Any], result_path: str) -> None:
    """Refuse (`CachedResultError`) a reused result whose scores differ from those run `run_id` logged.

    When the server cannot be read now, the result is reused on its own digests, with a warning.
    """
    try:
        logged = mlflow_client(uri).get_run(run_id).data.metrics
    except Exception as err:  # noqa: BLE001 - an unreachable server must not fail a verified result
        logger.warning("Cannot compare the reused result %s with its MLflow run %s now (%s); reusing it on its "
                       "own digests.", result_path, run_id, err)
        return
    mismatches = score_mismatches(logged, result)
    if mismatches:
        raise CachedResultError(
            f"The finished result {result_path} is not reused: its scores differ from those its MLflow run {run_id} "
            f"at {uri} logged ({'; '.join(mismatches)}); it was edited after the run finished. {WAY_OUT}")
