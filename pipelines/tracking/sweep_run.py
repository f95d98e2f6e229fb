"""The sweep's own MLflow run: the parent under which the UI nests every trial's run, holding what belongs to the
sweep as a whole (its resolved config, the summary files, the report and its picture).

The run's id is kept in the sweep folder (`SWEEP_RUN_FILE`), so a resumed or repeated sweep reopens the same run
instead of adding a second parent. The sweep goes on without it when the server does not answer: trials track
themselves, and the parent is a view over them. A close the server did not take is kept in the sweep folder
(`SWEEP_CLOSE_FILE`, with what the outage left undone) until ``python -m pipelines.tracking sync`` applies it.

That kept close is read back and checked before anything of it is sent (`read_close`). The file decides nothing on
its own: which server it goes to follows the spools' rules (`pipelines.tracking.scope`, `sync.why_left_alone`),
the files it names must lie inside its sweep folder (no absolute path, no ``..``, no symbolic link), and what it asks
the user to run is built here from plain values, never taken as text.

Trials a stopped sweep left behind (`end_stopped_runs`): a trial whose process Tune stops cannot end its own run,
which would show RUNNING forever; the driver ends each such run as KILLED (as MLflow marks a run its process lost)
once Tune has returned.
"""

from __future__ import annotations

import json
import logging
import re
import shlex
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from mlflow.exceptions import MlflowException

from capt.atomic import write_atomically
from pipelines.tracking.client import is_transient, mlflow_client, own_http_retries
from pipelines.tracking.run_content import DESCRIPTION_TAG, RUN_KIND_TAG
from pipelines.tracking.scope import same_server
from pipelines.tracking.spool import RUN_FILE, RetryPolicy, TrackingUnavailable, call_with_retry, read_run_record

logger = logging.getLogger(__name__)
SWEEP_RUN_FILE = "mlflow_sweep_run.json"
"""In the sweep folder: the parent run's id and the server it lives on."""
PARENT_TAG = "mlflow.parentRunId"
"""The tag by which the MLflow UI nests a run under its parent."""
SWEEP_CLOSE_FILE = "mlflow_sweep_close.json"
"""In the sweep folder while the parent run waits to be closed: the `SweepClose` the server did not take."""
RECORD_LIMIT = 4_000_000
"""Characters of `SWEEP_CLOSE_FILE` read at most (a sweep's own record: its config and an 8,000-character
description)."""
DESCRIPTION_LIMIT = 8000
"""MLflow keeps at most this many characters in a tag."""
STATUSES = ("FINISHED", "FAILED", "KILLED")
_RUN_ID = re.compile(r"[0-9A-Za-z_-]{1,64}")
_REPORT_KEYS = {"experiment", "sweep", "out"}


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
        write_atomically(record, json.dumps({"run_id": run.info.run_id, "tracking_uri": uri}))
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


def lines_left(close: SweepClose, uri: str, when: str = "") -> list[str]:
    """What is left once the sweep's run is closed, in words, then the commands that do it against the server at
    `uri` (one promote per champion the sweep could not set, and the report it could not build); none: empty.
    `when`: words that say when to run them (e.g. " once synced")."""
    undone = [what for what, left in (("promote its champions", close.promote), ("build its report", close.report))
              if left]
    if not undone:
        return []
    target = ["--tracking-uri", uri]
    commands = [["python", "-m", "pipelines.promote", "--model", model, "--task", task, *target]
                for model, task in close.promote]
    if close.report:
        commands.append(["python", "-m", "pipelines.report", "--experiment", close.report["experiment"], "--sweep",
                         close.report["sweep"], "--out", close.report["out"], *target])
    return [f"Left to do{when}: the MLflow server was down when the sweep ended, so it could not "
            f"{' or '.join(undone)}. Run:", *(f"  {shlex.join(command)}" for command in commands)]


def read_close(sweep_dir: Path) -> SweepClose:
    """The close kept in `sweep_dir`; ValueError saying what is wrong with the file (OSError: it cannot be read)."""
    with (sweep_dir / SWEEP_CLOSE_FILE).open(encoding="utf-8") as handle:
        text = handle.read(RECORD_LIMIT + 1)
    if len(text) > RECORD_LIMIT:
        raise ValueError(f"it is longer than {RECORD_LIMIT} characters")
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("it is not a JSON object")
    checks = {  # key: (valid, what it should be), as a sweep writes it
        "run_id": (lambda v: isinstance(v, str) and _RUN_ID.fullmatch(v), "an MLflow run id"),
        "tracking_uri": (_text, "a tracking URI"),
        "status": (lambda v: v in STATUSES, " or ".join(STATUSES)),
        "config": (lambda v: isinstance(v, dict), "an object"),
        "counts": (lambda v: isinstance(v, dict) and all(_text(key) and type(count) is int for key, count in v.items()),
                   "an object of whole numbers"),
        "description": (lambda v: v is None or isinstance(v, str) and len(v) <= DESCRIPTION_LIMIT,
                        f"text of at most {DESCRIPTION_LIMIT} characters"),
        "files": (lambda v: isinstance(v, list) and all(inside(sweep_dir, name) for name in v),
                  "a list of paths inside the sweep folder"),
        "promote": (lambda v: isinstance(v, list) and all(isinstance(p, list) and len(p) == 2 and all(map(_text, p))
                                                       for p in v), "a list of [model, task]"),
        "report": (lambda v: v is None or (isinstance(v, dict) and set(v) == _REPORT_KEYS
                                            and all(map(_text, v.values()))),
                   f"null or an object of {', '.join(sorted(_REPORT_KEYS))}"),
    }
    required = {"run_id", "tracking_uri", "status", "config"}
    problems = [f"{key} is not {what}" for key, (valid, what) in checks.items()
                if (key in data or key in required) and not valid(data.get(key))]
    unknown = sorted(set(data) - {f.name for f in fields(SweepClose)})
    problems += [f"unknown key(s) {', '.join(unknown)}"] if unknown else []
    if problems:
        raise ValueError("; ".join(problems))
    return SweepClose(**data)


def _text(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= 1000


def inside(sweep_dir: Path, name: Any) -> bool:
    """Whether `name` is a path relative to `sweep_dir` that stays inside it, through no symbolic link."""
    if not _text(name) or Path(name).is_absolute() or ".." in Path(name).parts:
        return False
    return (sweep_dir / name).resolve() == sweep_dir.resolve() / name


def end_stopped_runs(jobs: Path, tracking_uri: str, moved_from: tuple[str, ...] = ()) -> list[str]:
    """End as KILLED every RUNNING run recorded in a trial folder under `jobs` for this server (at `tracking_uri`
    or, before, at an address of `moved_from`); the folders whose run was ended.

    A server that cannot be reached is logged and left: the runs stay RUNNING until a resumed sweep ends them.
    """
    own_http_retries()  # a server that went down too must not hold the stop for minutes
    client, ended = mlflow_client(tracking_uri), []
    for record_file in sorted(jobs.glob(f"*/{RUN_FILE}")):
        record = read_run_record(record_file.parent) or {}
        recorded = str(record.get("tracking_uri", ""))
        if "run_id" not in record or not any(same_server(recorded, uri) for uri in (tracking_uri, *moved_from)):
            continue
        try:
            if client.get_run(record["run_id"]).info.status == "RUNNING":
                client.set_terminated(record["run_id"], status="KILLED")
                ended.append(record_file.parent.name)
        except Exception as err:  # noqa: BLE001 - a stop must finish whatever the server answers
            logger.warning("Could not end the run of %s as KILLED (%s)", record_file.parent.name, err)
    return ended
