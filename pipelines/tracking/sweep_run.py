"""The sweep's own MLflow run: the parent under which the UI nests every trial's run, holding what belongs to the
sweep as a whole (its resolved config, the summary files, the report and its picture).

The run's id is kept in the sweep folder (`SWEEP_RUN_FILE`), so a resumed or repeated sweep reopens the same run
instead of adding a second parent. The sweep goes on without it when the server does not answer: trials track
themselves, and the parent is a view over them.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from mlflow.exceptions import MlflowException

from pipelines.tracking.client import is_transient, mlflow_client, own_http_retries
from pipelines.tracking.spool import RetryPolicy, TrackingUnavailable, call_with_retry

logger = logging.getLogger(__name__)
SWEEP_RUN_FILE = "mlflow_sweep_run.json"
"""In the sweep folder: the parent run's id and the server it lives on."""
PARENT_TAG = "mlflow.parentRunId"
"""The tag by which the MLflow UI nests a run under its parent."""
DESCRIPTION_TAG = "mlflow.note.content"
"""The tag MLflow shows as the run's description."""
RUN_KIND_TAG = "run_kind"
"""`sweep` on the parent run (a trial's run carries its task, model, method and seed instead)."""


def open_sweep_run(uri: str, experiment_id: str, sweep_dir: Path, name: str, tags: Mapping[str, Any],
                   retry_s: float) -> str | None:
    """The id of the sweep's parent run at `uri`, created on the first start and reopened (RUNNING) on a later one;
    None when the server did not answer within `retry_s` seconds (`tracking.retry_s`, as for the trials' calls)."""
    own_http_retries()
    client = mlflow_client(uri)
    record = sweep_dir / SWEEP_RUN_FILE

    def open_run() -> str:
        run_id = _recorded_run(client, record, experiment_id)
        if run_id is not None:
            client.update_run(run_id, status="RUNNING")
            return run_id
        run = client.create_run(experiment_id, run_name=f"{name} (sweep)",
                                tags={**{k: str(v) for k, v in tags.items()}, RUN_KIND_TAG: "sweep", "sweep": name})
        sweep_dir.mkdir(parents=True, exist_ok=True)
        partial = record.with_suffix(".tmp")
        partial.write_text(json.dumps({"run_id": run.info.run_id, "tracking_uri": uri}))
        partial.replace(record)
        return run.info.run_id

    try:
        return call_with_retry(open_run, is_transient, RetryPolicy(budget_s=retry_s), f"MLflow at {uri}")
    except (TrackingUnavailable, MlflowException) as err:
        logger.warning("The sweep %s gets no parent run in MLflow (its trials' runs are not nested): %s", name, err)
        return None


def _recorded_run(client: Any, record: Path, experiment_id: str) -> str | None:
    """The recorded run id when that run exists in `experiment_id` on this server and is a sweep run. The server's
    address is not compared: a sweep's local server comes back on another port, and a run id (a UUID) found in
    this experiment is the run that was recorded."""
    try:
        recorded = json.loads(record.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(recorded, dict):
        return None
    try:
        run = client.get_run(str(recorded.get("run_id")))
    except MlflowException:
        return None
    if run.info.experiment_id != experiment_id or run.data.tags.get(RUN_KIND_TAG) != "sweep":
        return None
    return run.info.run_id


def close_sweep_run(uri: str, run_id: str, files: Iterable[Path], config: Mapping[str, Any],
                    counts: Mapping[str, int], status: str, retry_s: float, description: str | None = None) -> bool:
    """Log the sweep's resolved config, its `files` (summary, report, ...), trial counts and `description` (the
    run's Markdown description, when given) to the parent run and end it with `status`; False (logged) when the
    server did not take them within `retry_s` seconds."""
    client = mlflow_client(uri)

    def close() -> None:
        client.log_dict(run_id, dict(config), "sweep_config.json")
        if description is not None:
            client.set_tag(run_id, DESCRIPTION_TAG, description)
        for path in files:
            if path.is_file():
                client.log_artifact(run_id, str(path))
        for key, value in counts.items():
            client.log_metric(run_id, f"trials/{key}", float(value))
        client.set_terminated(run_id, status=status)

    try:
        call_with_retry(close, is_transient, RetryPolicy(budget_s=retry_s), f"MLflow at {uri}")
        return True
    except (TrackingUnavailable, MlflowException, OSError) as err:
        logger.warning("The sweep's parent run %s did not get its summary and status %s: %s", run_id, status, err)
        return False
