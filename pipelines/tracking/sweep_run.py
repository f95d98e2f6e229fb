"""The sweep's own MLflow run: the parent under which the UI nests every trial's run, holding what belongs to the
sweep as a whole (its resolved config, the summary files, the report and its picture).

The run's id is kept in the sweep folder (`SWEEP_RUN_FILE`), so a resumed or repeated sweep reopens the same run
instead of adding a second parent. The sweep goes on without it when the server does not answer: trials track
themselves, and the parent is a view over them. A close the server did not take is kept in the sweep folder
(`SWEEP_CLOSE_FILE`, with what the outage left undone) until ``python -m pipelines.tracking sync`` applies it
(`pipelines.tracking.sweep_close`).
"""

from __future__ import annotations

import json
import logging
import shlex
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mlflow.exceptions import MlflowException

from capt.atomic import write_atomically
from pipelines.tracking.client import is_transient, mlflow_client, own_http_retries
from pipelines.tracking.run_content import DESCRIPTION_TAG, RUN_KIND_TAG
from pipelines.tracking.spool import RetryPolicy, TrackingUnavailable, call_with_retry

logger = logging.getLogger(__name__)
SWEEP_RUN_FILE = "mlflow_sweep_run.json"
"""In the sweep folder: the parent run's id and the server it lives on."""
PARENT_TAG = "mlflow.parentRunId"
"""The tag by which the MLflow UI nests a run under its parent."""
SWEEP_CLOSE_FILE = "mlflow_sweep_close.json"
"""In the sweep folder while the parent run waits to be closed: the `SweepClose` the server did not take."""


@dataclass
class SweepClose:
    """What closing the sweep's parent run logs, and what the sweep could not do while the server was down."""

    run_id: str
    tracking_uri: str
    """The server the run lives on, as the sweep knew it."""
    status: str
    """FINISHED, FAILED or KILLED."""
    config: dict[str, Any]
    """The resolved sweep config (logged as sweep_config.json)."""
    counts: dict[str, int] = field(default_factory=dict)
    """Trials per outcome (logged as metrics trials/<outcome>)."""
    description: str | None = None
    """The run's Markdown description."""
    files: list[str] = field(default_factory=list)
    """Files of the sweep folder to log, relative to it (summary.md, the report, ...)."""
    promote: list[list[str]] = field(default_factory=list)
    """[model, task] of every champion the sweep could not promote."""
    report: dict[str, str] | None = None
    """The report not built: `pipelines.report`'s experiment, sweep and out folder."""


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
            (sweep_dir / SWEEP_CLOSE_FILE).unlink(missing_ok=True)  # this sweep closes it: no stale close for sync
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


def close_sweep_run(sweep_dir: Path, close: SweepClose, retry_s: float) -> bool:
    """Log `close` to the parent run and end it with its status; False (logged) when the server did not take it
    within `retry_s` seconds. A close that went through removes the one left for `sync` by an earlier try."""
    client = mlflow_client(close.tracking_uri)
    try:
        call_with_retry(lambda: log_close(client, sweep_dir, close), is_transient, RetryPolicy(budget_s=retry_s),
                        f"MLflow at {close.tracking_uri}")
    except (TrackingUnavailable, MlflowException, OSError) as err:
        logger.warning("The sweep's parent run %s did not get its summary and status %s: %s", close.run_id,
                       close.status, err)
        return False
    (sweep_dir / SWEEP_CLOSE_FILE).unlink(missing_ok=True)
    return True


def log_close(client: Any, sweep_dir: Path, close: SweepClose) -> None:
    """Log the config, description, files and counts of `close` to its run, then end the run with its status."""
    client.log_dict(close.run_id, dict(close.config), "sweep_config.json")
    if close.description is not None:
        client.set_tag(close.run_id, DESCRIPTION_TAG, close.description)
    for path in (sweep_dir / name for name in close.files):
        if path.is_file():
            client.log_artifact(close.run_id, str(path))
    for key, value in close.counts.items():
        client.log_metric(close.run_id, f"trials/{key}", float(value))
    client.set_terminated(close.run_id, status=close.status)


def keep_for_sync(sweep_dir: Path, close: SweepClose) -> Path:
    """Write `close` into the sweep folder (atomically) for ``python -m pipelines.tracking sync``; its path."""
    return write_atomically(sweep_dir / SWEEP_CLOSE_FILE, json.dumps(asdict(close), indent=1, default=str))


def commands_left(close: SweepClose, uri: str) -> list[str]:
    """The commands that do what the outage left undone, against the server at `uri`: one promote per champion the
    sweep could not set, and the report it could not build."""
    target = ["--tracking-uri", uri]
    commands = [["python", "-m", "pipelines.promote", "--model", model, "--task", task, *target]
                for model, task in close.promote]
    if close.report:
        commands.append(["python", "-m", "pipelines.report", "--experiment", close.report["experiment"], "--sweep",
                         close.report["sweep"], "--out", close.report["out"], *target])
    return [shlex.join(command) for command in commands]


def lines_left(close: SweepClose, uri: str, when: str = "") -> list[str]:
    """What is left once the sweep's run is closed, in words, then the commands (`commands_left`); none: empty.
    `when`: words that say when to run them (e.g. " once synced")."""
    undone = [what for what, left in (("promote its champions", close.promote), ("build its report", close.report))
              if left]
    if not undone:
        return []
    return [f"Left to do{when}: the MLflow server was down when the sweep ended, so it could not "
            f"{' or '.join(undone)}. Run:", *(f"  {command}" for command in commands_left(close, uri))]
