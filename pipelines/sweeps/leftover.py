"""What a sweep leaves for later: tracking operations spooled while the MLflow server could not be reached.

A trial that cannot reach the server keeps training and spools what it would have logged
(`pipelines.tracking.spool`); the sweep still ends with every trial done. The driver then says how many
operations wait in which trial folder and the command that uploads them, and exits with
`EXIT_NOT_FULLY_TRACKED` so that a script can tell "trained, not fully tracked" from success. A server that
answers again by the sweep's end gets those operations from the driver itself (`upload_spooled`), as `sync` would
give them. The same goes for the sweep's own run when the server did not take its close: the same `sync` closes
it, and the driver names what is left after that (the champions and the report it could not make).
"""

from __future__ import annotations

import logging
from pathlib import Path

from pipelines.services.mlflow_server import mlflow_answers
from pipelines.sweeps.config import SweepConfig
from pipelines.tracking.spool import FAILED_FILE, PENDING_FILE, RetryPolicy, Spool
from pipelines.tracking.sweep_run import SWEEP_CLOSE_FILE, lines_left, read_close
from pipelines.tracking.sync import sync_pending

logger = logging.getLogger(__name__)

LOCAL_UI = "http://127.0.0.1:5000"
"""Where `make mlflow-ui` serves a local sweep's store once the sweep's own server has stopped."""
EXIT_NOT_FULLY_TRACKED = 3
"""Every trial trained, but some of what they logged is still only in their spools."""


def spooled_operations(sweep: SweepConfig, name: str = PENDING_FILE) -> dict[str, int]:
    """Trial folder name -> operations waiting in its spool `name` (folders with none left out)."""
    if "://" in sweep.storage_path:  # remote storage: the trials' folders are not on this file system
        return {}
    return {path.parent.name: count for path in sorted((sweep.folder() / "jobs").glob(f"*/{name}"))
            if (count := len(Spool(path)))}


def upload_spooled(sweep: SweepConfig, uri: str | None, moved_from: tuple[str, ...] = ()) -> list[str]:
    """Upload what the sweep's trials spooled, when the MLflow server answers now; the line that says so.

    A trial that finished during an outage leaves its calls in its folder, and no trial process runs again to replay
    them. Once every trial is done nothing else writes those spools, so the driver replays them itself
    (`pipelines.tracking.sync`, the same scope: only operations recorded for this server or one it `moved_from`).
    A server that does not answer its health check at once is not waited for: the trials spent their retry budget
    already, and the final table says what waits and how to upload it.
    """
    # a non-HTTP store is assumed to answer
    if not uri or not spooled_operations(sweep) or (uri.startswith(("http://", "https://")) and
                                                     not mlflow_answers(uri)):
        return []
    summary = sync_pending(sweep.folder(), uri, RetryPolicy(budget_s=sweep.tracking.retry_s),
                           moved_from=moved_from)
    logger.info("Uploaded %d spooled MLflow operation(s); %d still pending", summary.synced, summary.pending)
    if not summary.synced:
        return []
    trials = sum(1 for folder in summary.folders if folder.synced)
    return [f"Uploaded {_count(summary.synced, 'operation')} that {_count(trials, 'trial')} spooled while the MLflow "
            "server could not be reached."]


def leftover_lines(sweep: SweepConfig, uri: str | None, local_server: bool) -> list[str]:
    """The lines the final table ends with when operations or the sweep's run wait (empty when everything reached
    MLflow)."""
    pending, dead = spooled_operations(sweep), spooled_operations(sweep, FAILED_FILE)
    folder, lines = sweep.folder(), []
    if pending:
        lines.append(f"Not fully tracked: {_count(sum(pending.values()), 'operation')} of "
                     f"{_count(len(pending), 'trial')} wait in their folders ({PENDING_FILE}) for the MLflow server:")
        lines += [f"  {name}: {count}" for name, count in pending.items()]
        lines.append("Upload them once the server answers: " + sync_command(folder, uri, local_server))
    lines += unclosed_run_lines(sweep, uri, local_server, told_to_sync=bool(pending))
    if dead:
        lines.append(f"Refused by the server and set aside: {_count(sum(dead.values()), 'operation')} of "
                     f"{_count(len(dead), 'trial')} ({FAILED_FILE} in {', '.join(dead)}), never replayed "
                     "automatically.")
    return lines


def unclosed_run_lines(sweep: SweepConfig, uri: str | None, local_server: bool, told_to_sync: bool) -> list[str]:
    """What the sweep's run still waits for when the server did not take its close (`SWEEP_CLOSE_FILE` in the
    sweep folder), then what is left to do once it is closed; empty when nothing waits."""
    folder = sweep.folder()
    if "://" in sweep.storage_path or not (folder / SWEEP_CLOSE_FILE).is_file():
        return []
    command = "the same sync" if told_to_sync else sync_command(folder, uri, local_server)
    try:
        close = read_close(folder)
    except (OSError, ValueError) as err:
        return [f"The sweep's run is not closed, and its close in {folder / SWEEP_CLOSE_FILE} is refused ({err}): "
                "fix or delete it, then close the run in the MLflow UI."]
    lines = [f"The sweep's run {close.run_id} is not closed: the MLflow server did not take its status "
             f"{close.status}, summary and description, kept in {folder / SWEEP_CLOSE_FILE}. Close it once the "
             f"server answers: {command}."]
    return lines + lines_left(close, LOCAL_UI if local_server else uri, " once it is closed")


def sync_command(folder: Path, uri: str | None, local_server: bool) -> str:
    """The `tracking sync` command for `folder`: a local sweep's server has stopped, so its store is served
    again by `make mlflow-ui` at another address, which the operations must be told about."""
    command = f"python -m pipelines.tracking sync --root {folder}"
    if local_server and uri:
        return f"`make mlflow-ui`, then `{command} --tracking-uri {LOCAL_UI} --moved-from {uri}`"
    return f"`{command}`"


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" + ("" if number == 1 else "s")
