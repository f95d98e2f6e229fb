"""The sweep's parent run on a real MLflow server: its description shows the results table and links its report, so
that the run's page in the UI opens on the results (issue 54, item 4)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mlflow import MlflowClient

from pipelines.services import LocalMlflowServer
from pipelines.sweeps.config import SweepConfig
from pipelines.sweeps.parent_run import CUT_NOTE, DESCRIPTION_LIMIT, SweepRun
from pipelines.sweeps.summary import summary_markdown

pytestmark = pytest.mark.integration
DESCRIPTION = "mlflow.note.content"


def _rows(count: int) -> list[dict[str, Any]]:
    """Rows as `summary.result_rows` makes them: `count` seeds of CaPT on RTE, tiny-t5."""
    return [{"task": "rte", "model": "tiny-t5", "method": "capt", "seed": seed, "select": "", "data": "generated",
             "majority": 50.0, "chance": 50.0, "untrained": None, "validation": 60.0 + seed % 7,
             "test": 55.0 + seed % 5, "status": "done", "reused": False, "chosen": True} for seed in range(count)]


def _log_trials(client: MlflowClient, experiment_id: str, sweep: str, rows: list[dict[str, Any]]) -> None:
    """The trials' runs as the sweep's trials leave them: tagged, FINISHED, with their scores."""
    for row in rows:
        tags = {"task": row["task"], "model": row["model"], "method": row["method"], "seed": str(row["seed"]),
                "sweep": sweep, "data": row["data"]}
        run_id = client.create_run(experiment_id, run_name=f"rte/tiny-t5/capt/s{row['seed']}", tags=tags).info.run_id
        client.log_metric(run_id, "test/score", row["test"])
        client.log_metric(run_id, "validation/best_score", row["validation"])
        client.set_terminated(run_id)


def _parent(sweep: SweepConfig, uri: str, tmp_path: Path) -> tuple[MlflowClient, str, SweepRun]:
    client = MlflowClient(uri)
    experiment_id = client.create_experiment(sweep.experiment_name())
    return client, experiment_id, SweepRun(sweep, uri, experiment_id, {"config_file": "x.yaml"})


def test_the_parent_run_describes_the_results_table_and_links_its_report(mlflow_server: LocalMlflowServer,
                                                                         tmp_path: Path) -> None:
    sweep = SweepConfig(name="it-parent-described", storage_path=str(tmp_path))
    client, experiment_id, parent = _parent(sweep, mlflow_server.uri, tmp_path)
    assert "has not ended yet" in client.get_run(parent.run_id).data.tags[DESCRIPTION], "said while it runs"
    rows = _rows(2)
    _log_trials(client, experiment_id, sweep.name, rows)
    parent.finish(rows)

    run = client.get_run(parent.run_id)
    description = run.data.tags[DESCRIPTION]
    link = f"#/experiments/{experiment_id}/runs/{parent.run_id}/artifacts"
    assert description.startswith(f"**Report** of the sweep's runs (tables and picture, also in Artifacts): "
                                  f"[report.md]({link}/report.md), [report.png]({link}/report.png), "
                                  f"[summary.csv]({link}/summary.csv)."), description
    table = [line for line in summary_markdown(sweep, rows).splitlines() if line.startswith("|")]
    assert len(table) == 4 and all(line in description.splitlines() for line in table), description
    assert "| rte | tiny-t5 | capt | 1 | generated | 50.0 | 50.0 | - | 61.0 | 56.0 | done |" in table
    assert {"report.md", "report.png"} <= {f.path for f in client.list_artifacts(parent.run_id)}
    assert run.info.status == "FINISHED" and run.data.tags["config_file"] == "x.yaml"


def test_a_long_table_is_cut_to_fit_and_a_missing_report_says_why(mlflow_server: LocalMlflowServer,
                                                                  tmp_path: Path) -> None:
    sweep = SweepConfig(name="it-parent-long", storage_path=str(tmp_path))
    client, _, parent = _parent(sweep, mlflow_server.uri, tmp_path)
    rows = _rows(300)  # no trial's run in the experiment: no report
    parent.finish(rows)

    description = client.get_run(parent.run_id).data.tags[DESCRIPTION]
    assert description.startswith("**No report** (Experiment 'capt-it-parent-long' has 0 run(s) but none FINISHED")
    assert len(summary_markdown(sweep, rows)) > DESCRIPTION_LIMIT >= len(description)
    assert description.endswith(CUT_NOTE) and "| rte | tiny-t5 | capt | 0 | generated |" in description
