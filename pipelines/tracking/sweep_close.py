"""How a sweep's runs close when the sweep could not close them itself.

Trials a stopped sweep left behind (`end_stopped_runs`): a trial whose process Tune stops cannot end its own run,
which would show RUNNING forever; the driver ends each such run as KILLED (as MLflow marks a run its process lost) once
Tune has returned.

The parent-run close kept for ``sync`` (`SWEEP_CLOSE_FILE`, written by the sweep when the server did not
take it): read back and checked before anything of it is sent. The file decides nothing on its own: which server
it goes to follows the spools' rules (`pipelines.tracking.scope`, `sync.credentials_refusal`), the files it names
must lie inside its sweep folder (no absolute path, no ``..``, no symbolic link), and what it asks the user to run
is built here from plain values, never taken as text."""

from __future__ import annotations

import json
import logging
import re
from dataclasses import fields
from pathlib import Path
from typing import Any

from pipelines.tracking.client import mlflow_client, own_http_retries
from pipelines.tracking.scope import same_server
from pipelines.tracking.spool import RUN_FILE, read_run_record
from pipelines.tracking.sweep_run import SWEEP_CLOSE_FILE, SweepClose

logger = logging.getLogger(__name__)

RECORD_LIMIT = 4_000_000
"""Characters of the file read at most (a sweep's own record: its config and an 8,000-character description)."""
DESCRIPTION_LIMIT = 8000
"""MLflow keeps at most this many characters in a tag."""
STATUSES = ("FINISHED", "FAILED", "KILLED")
_RUN_ID = re.compile(r"[0-9A-Za-z_-]{1,64}")
_REPORT_KEYS = {"experiment", "sweep", "out"}


def read_close(sweep_dir: Path) -> SweepClose:
    """The close kept in `sweep_dir`; ValueError saying what is wrong with the file (OSError: it cannot be read)."""
    with (sweep_dir / SWEEP_CLOSE_FILE).open(encoding="utf-8") as handle:
        text = handle.read(RECORD_LIMIT + 1)
    if len(text) > RECORD_LIMIT:
        raise ValueError(f"it is longer than {RECORD_LIMIT} characters")
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("it is not a JSON object")
    problems = [f"{key} is not {what}" for key, what in _field_problems(data, sweep_dir)]
    unknown = sorted(set(data) - {f.name for f in fields(SweepClose)})
    problems += [f"unknown key(s) {', '.join(unknown)}"] if unknown else []
    if problems:
        raise ValueError("; ".join(problems))
    return SweepClose(**data)


def _field_problems(data: dict[str, Any], sweep_dir: Path) -> list[tuple[str, str]]:
    """(key, what it should be) for every field of `data` that is not what a sweep writes."""
    checks = {
        "run_id": (lambda v: isinstance(v, str) and _RUN_ID.fullmatch(v), "an MLflow run id"),
        "tracking_uri": (_text, "a tracking URI"),
        "status": (lambda v: v in STATUSES, " or ".join(STATUSES)),
        "config": (lambda v: isinstance(v, dict), "an object"),
        "counts": (_counts, "an object of whole numbers"),
        "description": (lambda v: v is None or isinstance(v, str) and len(v) <= DESCRIPTION_LIMIT,
                        f"text of at most {DESCRIPTION_LIMIT} characters"),
        "files": (lambda v: isinstance(v, list) and all(inside(sweep_dir, name) for name in v),
                  "a list of paths inside the sweep folder"),
        "promote": (_pairs, "a list of [model, task]"),
        "report": (_report, f"null or an object of {', '.join(sorted(_REPORT_KEYS))}"),
    }
    required = {"run_id", "tracking_uri", "status", "config"}
    return [(key, what) for key, (valid, what) in checks.items()
            if (key in data or key in required) and not valid(data.get(key))]


def _counts(value: Any) -> bool:
    return isinstance(value, dict) and all(_text(key) and type(count) is int for key, count in value.items())


def _pairs(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(pair, list) and len(pair) == 2 and all(map(_text, pair))
                                           for pair in value)


def _report(value: Any) -> bool:
    return value is None or isinstance(value, dict) and set(value) == _REPORT_KEYS and all(map(_text, value.values()))


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
