"""The bad-input matrix, the cases that need a real MLflow server: a registered model or an experiment
that does not exist, and an experiment without a usable run. Each entry point runs as a real process;
each case asserts exit 2, one `error:` paragraph, no traceback, and an earlier report left as it was."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.bad_inputs import assert_clean_failure, entry_env, folder_digest, run_entry
from mlflow import MlflowClient

from pipelines.services import LocalMlflowServer

pytestmark = pytest.mark.integration

EMPTY_EXPERIMENT = "bad-inputs-empty"


@pytest.fixture(scope="module")
def earlier_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    reports = tmp_path_factory.mktemp("reports")
    (reports / "report.md").write_text("# an earlier report\n", encoding="utf-8")
    return reports


@pytest.fixture(scope="module")
def uri(mlflow_server: LocalMlflowServer) -> str:
    client = MlflowClient(mlflow_server.uri)
    if client.get_experiment_by_name(EMPTY_EXPERIMENT) is None:
        client.create_experiment(EMPTY_EXPERIMENT)
    return mlflow_server.uri


@pytest.mark.parametrize(("entry", "args", "phrase"), [
    ("promote", ["--model", "google-t5/t5-base", "--task", "boolq"],
     "There is no registered model 'capt-t5-base-boolq'"),
    ("report", ["--experiment", "no-such-experiment"], "No experiment 'no-such-experiment'"),
    ("report", ["--experiment", EMPTY_EXPERIMENT], "has 0 run(s) but none FINISHED"),
], ids=["promote-missing-registered-model", "report-missing-experiment", "report-experiment-without-runs"])
def test_missing_mlflow_objects_fail_cleanly(entry: str, args: list[str], phrase: str, uri: str,
                                             earlier_report: Path, tmp_path: Path) -> None:
    out = ["--out", str(earlier_report)] if entry == "report" else []
    before = folder_digest(earlier_report)
    proc = run_entry(entry, [*args, *out, "--tracking-uri", uri], entry_env(), cwd=tmp_path)
    assert_clean_failure(proc, phrase)
    assert folder_digest(earlier_report) == before and not any(tmp_path.iterdir())
