"""promote, report and serve find the tracking store by one rule: the flag, MLFLOW_TRACKING_URI, or the local store
`make demo` wrote (outputs/mlflow under the current directory), which they serve for the command and name."""

from __future__ import annotations

import os
from pathlib import Path

import mlflow
import pytest
from helpers.bad_inputs import call_entry

from pipelines.services import LocalMlflowServer
from pipelines.services.folder_lock import held_folder
from pipelines.services.mlflow_server import LOCAL_STORE, STORE_LOCK_FILE

pytestmark = pytest.mark.integration


def test_promote_uses_the_local_server_holding_the_store_and_promote_and_report_serve_it_themselves_once_stopped(
        tmp_path: Path, capsys) -> None:
    """A sweep's server holds its store: a command run meanwhile (no URI) logs there instead of being refused, and
    leaves it running. Once that server stopped, promote and report (no URI) serve the store `make demo` wrote
    themselves, say so, and let go of it. (One server start for both: the store's experiment is created on it.)"""
    from pipelines.services.mlflow_server import mlflow_answers

    store = tmp_path / LOCAL_STORE
    server = LocalMlflowServer(store).start()  # as a running sweep's
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    try:
        mlflow.MlflowClient(server.uri).create_experiment("capt-demo-store")
        promoted = call_entry("promote", ["--model", "tiny-t5", "--task", "rte"], env, tmp_path, capsys)
        assert (f"Tracking store: the local store {store} (served at {server.uri} by the local MLflow server already "
                "running on it)") in promoted.stderr, promoted.stderr
        assert promoted.returncode == 2 and "There is no registered model 'capt-tiny-t5-rte'" in promoted.stderr
        assert mlflow_answers(server.uri), "the command left the sweep's server running"
    finally:
        server.stop()

    promoted = call_entry("promote", ["--model", "tiny-t5", "--task", "rte"], env, tmp_path, capsys)
    assert f"Tracking store: the local store {store} (served at http://127.0.0.1:" in promoted.stderr
    assert "already running" not in promoted.stderr, "it served the store itself"
    assert promoted.returncode == 2 and "There is no registered model 'capt-tiny-t5-rte'" in promoted.stderr
    reported = call_entry("report", ["--experiment", "capt-demo-store", "--out", str(tmp_path / "reports")], env,
                          tmp_path, capsys)
    assert f"Tracking store: the local store {store}" in reported.stderr
    assert "No experiment 'capt-demo-store'" not in reported.stderr, "the report read the local store"
    with held_folder(store / STORE_LOCK_FILE):  # each command's server stopped and let go of the store
        pass
