"""The runs of trials that a stopped sweep left behind: ended KILLED, as MLflow marks a run its process lost.

A trial whose process Tune stops cannot end its own run, which would show RUNNING forever. The sweep's driver
ends each such run once Tune has returned: a run its record names that is still RUNNING on its server.
"""

from __future__ import annotations

import logging
from pathlib import Path

from pipelines.tracking.client import mlflow_client, own_http_retries
from pipelines.tracking.scope import same_server
from pipelines.tracking.spool import RUN_FILE, read_run_record

logger = logging.getLogger(__name__)


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
