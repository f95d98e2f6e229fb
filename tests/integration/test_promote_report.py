"""Promotion (aliases, tags, --min, errors), the registered pyfunc, and the report, on a real MLflow server."""

from __future__ import annotations

import shutil
import statistics
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd
import pytest
from helpers.jobs import tiny_job
from helpers.registry import track as track_job
from mlflow import MlflowClient

from capt.tasks import generate_rows
from pipelines import promote, report
from pipelines.capsule_predictor import CapsulePredictor
from pipelines.services import LocalMlflowServer, free_port
from pipelines.sweeps.config import SweepConfig
from pipelines.sweeps.run import promote_champions
from pipelines.training.loop import run

pytestmark = pytest.mark.integration

EXPERIMENT = "test-promote-report"
NAME = "capt-tiny-t5-rte"
# (task, method, seed): seeds 0 and 1 of CaPT on RTE score 37.5 and 62.5 on their 8 test examples.
TRIALS = [("rte", "capt", 0), ("rte", "capt", 1), ("rte", "prompt_tuning", 0), ("cb", "capt", 0)]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str, int], dict[str, Any]]:
    """The trained jobs (not yet tracked), keyed by (task, method, seed)."""
    out = tmp_path_factory.mktemp("jobs")
    trained = {}
    for task, method, seed in TRIALS:
        options = {"num_tokens": 4} if method == "prompt_tuning" else {}
        config = tiny_job(out / f"{task}-{method}-{seed}", "tiny-t5", method, f"seed={seed}", task={"name": task},
                          method={"options": options}, train={"max_epochs": 6, "eval_every_steps": 3})
        trained[(task, method, seed)] = run(config)
    low, high = (trained[("rte", "capt", s)]["metrics"]["test_score"] for s in (0, 1))
    assert low < high, "test setup: the second CaPT version must score higher than the first"
    return trained


def track(uri: str, result: dict[str, Any], experiment: str = EXPERIMENT) -> str:
    """Log a finished job as the sweep's rank-0 worker does (`helpers.registry.track`), in this file's experiment."""
    return track_job(uri, result, experiment)


def _aliases(client: MlflowClient) -> dict[str, str]:
    return dict(client.get_registered_model(NAME).aliases)


def test_promotion_lifecycle_and_the_champion_pyfunc(
        mlflow_server: LocalMlflowServer, results: dict, capsys: pytest.CaptureFixture[str]) -> None:
    uri, client = mlflow_server.uri, MlflowClient(mlflow_server.uri)
    first = results[("rte", "capt", 0)]
    track(uri, first)
    # the two versions are ordered by test score: this test is about aliases, not about the metric chosen
    done = promote.promote("tiny-t5", "rte", metric="test_score", tracking_uri=uri)
    assert (done.champion, done.previous, done.value) == (1, None, first["metrics"]["test_score"])
    assert _aliases(client) == {"champion": "1"}
    tags = client.get_model_version(NAME, "1").tags
    assert tags["validation_status"] == "approved" and tags["promoted_at"] and tags["promoted_metric"] == "test_score"

    by_test = ["--metric", "test_score"]
    assert promote.main(["--model", "tiny-t5", "--task", "rte", *by_test, "--min", "99", "--tracking-uri", uri]) == 1
    assert "below --min 99" in capsys.readouterr().err
    assert _aliases(client) == {"champion": "1"} and client.get_model_version(NAME, "1").tags == tags

    second = results[("rte", "capt", 1)]
    track(uri, second)
    assert client.get_model_version(NAME, "2").tags["validation_status"] == "pending"
    promote_by_test = ["--model", "tiny-t5", "--task", "rte", *by_test, "--stage", "Production", "--tracking-uri", uri]
    capsys.readouterr()  # what tracking printed
    assert promote.main(promote_by_test) == 0
    said = capsys.readouterr().out.splitlines()
    assert said[0].startswith(f"{NAME}: version 2 has the best test_score (") and said[0].endswith("Changed:")
    assert said[1:4] == ["  - alias champion moved from version 1 to version 2",
                         "  - alias challenger moved from none to version 1",
                         "  - tags of version 2 set: validation_status=approved, promoted_metric=test_score, "
                         f"promoted_value={second['metrics']['test_score']}, promoted_at="
                         f"{client.get_model_version(NAME, '2').tags['promoted_at']}"]
    reason = (f"test_score={first['metrics']['test_score']:.4g}, not better than champion version 2 "
              f"({second['metrics']['test_score']:.4g})")
    assert said[4:] == [f"  - tags of version 1 set: validation_status=challenger, validation_reason={reason}",
                        "  - stage of version 2 moved from None to Production"]
    assert _aliases(client) == {"champion": "2", "challenger": "1"}
    assert {k: client.get_model_version(NAME, "1").tags[k] for k in ("validation_status", "validation_reason")} == {
        "validation_status": "challenger", "validation_reason": reason}, "what promote decided, not pending"
    assert client.get_model_version(NAME, "2").current_stage == "Production"
    tags = client.get_model_version(NAME, "2").tags
    assert promote.main(promote_by_test) == 0  # idempotent, and says so in one line
    assert capsys.readouterr().out.splitlines() == [
        f"{NAME}: no change: version 2 has the best test_score ({second['metrics']['test_score']:.4g}) and is already "
        "champion."]
    assert client.get_model_version(NAME, "2").tags == tags, "an unchanged champion keeps its promotion tags"
    assert promote.promote("google/tiny-t5", "rte", "test_score", tracking_uri=uri).changes == []

    rows = [{k: v for k, v in row.items() if k != "generated"} for row in generate_rows("rte", "val", 6, seed=5)]
    mlflow.set_tracking_uri(uri)
    predicted = mlflow.pyfunc.load_model(f"models:/{NAME}@champion").predict(pd.DataFrame(rows))
    local = CapsulePredictor(second["artifact_dir"], second).predict_rows(rows)
    assert list(predicted) == local and len(local) == 6
    assert set(local) <= {"entailment", "not_entailment"}


SELECTION_SLUG = "tiny-t5-selection"  # a registered model of its own: capt-tiny-t5-selection-rte


def _track_scored(uri: str, base: dict[str, Any], folder: Path, slug: str, validation: float, test: float) -> str:
    """Register a copy of `base`'s capsule as a version of capt-<slug>-rte whose run logs these scores (the
    validation curve included, as the run metric promotion reads); the run id."""
    shutil.copytree(base["artifact_dir"], folder / "artifact")
    history = [{**record, "best_validation_score": validation} for record in base["history"]]
    return track(uri, {**base, "model_slug": slug, "artifact_dir": str(folder / "artifact"), "history": history,
                       "metrics": {**base["metrics"], "best_validation_score": validation, "test_score": test}},
                 experiment=f"test-promote-{slug}")


def test_the_default_champion_is_the_best_on_validation_not_on_test(
        mlflow_server: LocalMlflowServer, results: dict, tmp_path: Path) -> None:
    """Two versions of one real capsule whose scores are set so that the best on validation (version 1) is
    the worst on test: promotion and the sweep's automatic champion pick version 1; only an explicit
    `--metric test_score` picks version 2."""
    uri, base = mlflow_server.uri, results[("rte", "capt", 0)]
    for key, (validation, test) in {"v1": (80.0, 40.0), "v2": (60.0, 70.0)}.items():
        _track_scored(uri, base, tmp_path / key, SELECTION_SLUG, validation, test)
    rows = [{"model": SELECTION_SLUG, "task": "rte", "method": "capt", "status": "done"}]
    assert promote_champions(SweepConfig(), uri, rows) == [f"capt-{SELECTION_SLUG}-rte"]
    client = MlflowClient(uri)
    champion = client.get_model_version_by_alias(f"capt-{SELECTION_SLUG}-rte", "champion")
    assert champion.version == "1" and champion.tags["promoted_metric"] == "best_validation_score"
    other = client.get_model_version(f"capt-{SELECTION_SLUG}-rte", "2").tags
    assert (other["validation_status"], other["validation_reason"]) == (
        "not_promoted", "best_validation_score=60, not better than champion version 1 (80)")
    done = promote.promote(SELECTION_SLUG, "rte", tracking_uri=uri)
    assert (done.champion, done.metric, done.value, done.changed) == (1, "best_validation_score", 80.0, False)
    by_test = promote.promote(SELECTION_SLUG, "rte", metric="test_score", tracking_uri=uri)
    assert (by_test.champion, by_test.value, by_test.previous) == (2, 70.0, 1)
    tags = {v: client.get_model_version(f"capt-{SELECTION_SLUG}-rte", v).tags for v in ("1", "2")}
    assert [tags[v]["validation_status"] for v in ("1", "2")] == ["challenger", "approved"]
    assert "validation_reason" not in tags["2"], "the champion keeps no reason why it was not chosen"


def test_a_forged_version_tag_moves_nothing_and_a_version_without_its_run_is_skipped(
        mlflow_server: LocalMlflowServer, results: dict, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Scores come from the source run's logged metrics: a version tag or description claiming 99.5 (anyone with
    registry write access can set one) does not make a version champion; a version whose run was deleted is
    skipped with the reason logged, and with no run left promotion refuses."""
    uri, base, slug = mlflow_server.uri, results[("rte", "capt", 0)], "tiny-t5-forged"
    name, client = f"capt-{slug}-rte", MlflowClient(mlflow_server.uri)
    runs = [_track_scored(uri, base, tmp_path / key, slug, validation, 50.0)
            for key, validation in (("v1", 80.0), ("v2", 60.0))]
    assert promote.promote(slug, "rte", tracking_uri=uri).champion == 1
    client.set_model_version_tag(name, "2", "best_validation_score", "99.5")
    client.update_model_version(name, "2", description="best_validation_score: 99.5")
    done = promote.promote(slug, "rte", tracking_uri=uri)
    assert (done.champion, done.value, done.changed) == (1, 80.0, False)
    assert dict(client.get_registered_model(name).aliases) == {"champion": "1"}

    client.delete_run(runs[0])
    caplog.clear()
    moved = promote.promote(slug, "rte", tracking_uri=uri)
    assert (moved.champion, moved.value, moved.previous) == (2, 60.0, 1)
    assert f"version 1: its source run {runs[0]} was deleted" in caplog.text
    skipped = client.get_model_version(name, "1").tags
    assert (skipped["validation_status"], skipped["validation_reason"]) == (
        "not_evaluated", f"not a candidate: its source run {runs[0]} was deleted")
    client.delete_run(runs[1])
    with pytest.raises(promote.PromotionError, match="No version's source run logged a numeric 'best_validation_sc"):
        promote.promote(slug, "rte", tracking_uri=uri)
    assert dict(client.get_registered_model(name).aliases) == {"champion": "2", "challenger": "1"}


def test_promote_errors_are_clear_and_change_nothing(
        mlflow_server: LocalMlflowServer, capsys: pytest.CaptureFixture[str]) -> None:
    uri = mlflow_server.uri
    assert promote.main(["--model", "no-such-model", "--task", "rte", "--tracking-uri", uri]) == 2
    [line] = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert "capt-no-such-model-rte" in line and "--model" in line and "registered capsule models there" in line
    assert promote.main(["--model", "tiny-t5", "--task", "mnli", "--tracking-uri", uri]) == 2
    assert "Unknown task 'mnli'" in capsys.readouterr().err
    closed = f"http://127.0.0.1:{free_port()}"
    assert promote.main(["--model", "tiny-t5", "--task", "rte", "--tracking-uri", closed]) == 2
    assert closed in capsys.readouterr().err


def test_report_tables_mean_and_std_over_seeds(
        mlflow_server: LocalMlflowServer, results: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for result in results.values():
        track(mlflow_server.uri, result)  # runs the lifecycle test logged are reused, not duplicated
    assert report.main(["--experiment", EXPERIMENT, "--tracking-uri", mlflow_server.uri, "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    text = (tmp_path / "report.md").read_text()
    assert text.strip() in printed
    scores = {key: r["metrics"]["test_score"] for key, r in results.items()}
    capt_rte = [scores[("rte", "capt", 0)], scores[("rte", "capt", 1)]]
    capt_row = (f"| capt | {scores[('cb', 'capt', 0)]:.2f} | {statistics.mean(capt_rte):.2f} ± "
                f"{statistics.stdev(capt_rte):.2f} | "
                f"{statistics.mean([scores[('cb', 'capt', 0)], statistics.mean(capt_rte)]):.2f} |")
    pt = scores[("rte", "prompt_tuning", 0)]
    assert "## tiny-t5" in text and "| method | cb | rte | SuperGLUE avg (2 of 6 tasks) |" in text
    assert capt_row in text and f"| prompt_tuning | - | {pt:.2f} | {pt:.2f}* |" in text
    assert text.index("| prompt_tuning") < text.index("| capt")  # baselines first, CaPT last
    majority = {key: r["metrics"]["test_majority_score"] for key, r in results.items()}
    assert f"| majority class | {majority[('cb', 'capt', 0)]:.2f} |" in text  # measured by the jobs, logged, tabulated
    assert text.index("| majority class") < text.index("| chance") < text.index("| prompt_tuning")
    assert (tmp_path / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert report.main(["--experiment", "missing", "--tracking-uri", mlflow_server.uri, "--out", str(tmp_path)]) == 2
    assert "No experiment 'missing'" in capsys.readouterr().err
