"""`tracking sync --tracking-uri` on a real MLflow server replays only the operations recorded for it: another
server's spool and a spool recorded for no server are skipped, listed and left untouched (the latter is replayed
with --accept-unrecorded); no foreign run appears on the server."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.mlflow_runs import trial_runs
from mlflow import MlflowClient

from pipelines.services import LocalMlflowServer, free_port
from pipelines.tracking import main
from pipelines.tracking.spool import PENDING_FILE, Spool

pytestmark = pytest.mark.integration

EXPERIMENT = "test-sync-scope"


def _spool(folder: Path, uri: str | None) -> bytes:
    """A whole trial (start, params, metrics, end) spooled for `uri` (None: for no server); the spool's bytes."""
    recorded, name = ({"tracking_uri": uri} if uri else {}), folder.name
    spool = Spool(folder / PENDING_FILE)
    spool.append({"op": "start", "experiment": EXPERIMENT, "run_name": name, "tags": {"sweep": "scope"},
                  "trial_key": f"scope-{name}", "timestamp": 1_700_000_000_000, **recorded})
    spool.append({"op": "params", "params": {"seed": "0"}, **recorded})
    spool.append({"op": "metrics", "metrics": {"train/loss": 1.5}, "step": 3, "timestamp": 1_700_000_001_000,
                  **recorded})
    spool.append({"op": "end", "status": "FINISHED", "timestamp": 1_700_000_002_000, **recorded})
    return spool.path.read_bytes()


def _runs(client: MlflowClient) -> dict[str, str]:
    experiment = client.get_experiment_by_name(EXPERIMENT)
    runs = trial_runs(client, [experiment.experiment_id]) if experiment else []
    return {run.info.run_name: run.info.status for run in runs}


def test_sync_replays_only_what_was_recorded_for_its_server(
        mlflow_server: LocalMlflowServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    uri, other, client = mlflow_server.uri, f"http://127.0.0.1:{free_port()}", MlflowClient(mlflow_server.uri)
    _spool(tmp_path / "mine", uri + "/")  # the same server, spelled with a trailing slash
    foreign, old = _spool(tmp_path / "theirs", other), _spool(tmp_path / "old", None)

    assert main(["sync", "--root", str(tmp_path), "--tracking-uri", uri, "--retry-s", "5"]) == 1
    out = capsys.readouterr().out
    assert f"Synced 4 operation(s) under {tmp_path} to {uri}" in out
    assert "8 still pending (8 of them skipped, not for this server)" in out
    assert f"  theirs: 0 synced, 0 dead-lettered now (0 in mlflow_failed.jsonl), 4 still pending (skipped: 4 " \
           f"operation(s) recorded for {other}, not {uri}" in out
    assert "  old: 0 synced, 0 dead-lettered now (0 in mlflow_failed.jsonl), 4 still pending (skipped: 4 " \
           "operation(s) recorded for no server" in out
    assert _runs(client) == {"mine": "FINISHED"}
    assert client.get_metric_history(trial_runs(client,
        [client.get_experiment_by_name(EXPERIMENT).experiment_id])[0].info.run_id, "train/loss")[0].value == 1.5
    assert (tmp_path / "theirs" / PENDING_FILE).read_bytes() == foreign
    assert (tmp_path / "old" / PENDING_FILE).read_bytes() == old

    assert main(["sync", "--root", str(tmp_path), "--tracking-uri", uri, "--accept-unrecorded", "--retry-s", "5"]) == 1
    assert "Synced 4 operation(s)" in capsys.readouterr().out
    assert _runs(client) == {"mine": "FINISHED", "old": "FINISHED"}, "the other server's trial never came here"
    assert not (tmp_path / "old" / PENDING_FILE).exists()
    assert (tmp_path / "theirs" / PENDING_FILE).read_bytes() == foreign
