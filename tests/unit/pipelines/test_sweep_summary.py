"""The end of a sweep: the printed table sets each trial beside the majority class, chance and its untrained
self, and the sweep folder gets summary.md, summary.csv and a README of its layout."""

from __future__ import annotations

import csv
from pathlib import Path

from ray.tune import Result

from pipelines.sweeps.config import load_sweep_config
from pipelines.sweeps.summary import data_kinds, results_table, reuse_line, write_summary

SMOKE = Path(__file__).resolve().parents[3] / "pipelines" / "configs" / "smoke.yaml"
SCORES = {("cb", "minilm"): (36.0, 33.1, 20.0, 93.75, 83.6666), ("rte", "minilm"): (58.0, 50.2, 42.0, 100.0, 98.0)}
"""(task, model) -> (majority, chance, untrained, best validation, test), as a trial reports them."""


def _grid(reused: tuple[float, ...] = (0.0, 0.0)) -> list[Result]:
    metrics = ("test_majority_score", "test_chance_score", "test_untrained_score", "best_validation_score",
               "test_score")
    return [Result(metrics={**dict(zip(metrics, scores, strict=True)), "reused": flag,
                            "config": {"point": {"task": task, "model": model, "method": "capt", "seed": 0}}},
                   checkpoint=None, error=None, path="unused")
            for ((task, model), scores), flag in zip(SCORES.items(), reused, strict=True)]


def test_the_printed_table_shows_majority_chance_and_untrained_beside_the_scores(tmp_path):
    sweep = load_sweep_config(SMOKE, [f"storage_path={tmp_path}", "data_source=generated", "models=[minilm]"])
    text, rows = results_table(_grid(), data_kinds(sweep))
    header, _, cb, rte, *notes = text.splitlines()
    assert header.split() == ["task", "model", "method", "seed", "data", "majority", "chance", "untrained", "valid",
                              "test", "status"]
    assert cb.split() == ["cb", "minilm", "capt", "0", "generated", "36.0", "33.1", "20.0", "93.8", "83.7", "done"]
    assert rte.split()[5:10] == ["58.0", "50.2", "42.0", "100.0", "98.0"]
    assert any("majority: always the most frequent training label" in n for n in notes)
    assert any("data=generated" in n and "not benchmark data" in n for n in notes)
    assert [r["data"] for r in rows] == ["generated", "generated"]


def test_the_sweep_folder_gets_summary_files_and_a_readme(tmp_path):
    sweep = load_sweep_config(SMOKE, [f"storage_path={tmp_path}", "data_source=generated", "models=[minilm]"])
    _, rows = results_table(_grid(), data_kinds(sweep))
    said = write_summary(sweep, rows)
    folder = tmp_path / "smoke"
    assert str(folder / "summary.md") in said
    summary = (folder / "summary.md").read_text()
    assert summary.startswith("# Sweep `smoke`: results on generated data (not benchmark data)")
    header = "| task | model | method | seed | data | majority | chance | untrained | validation | test | status |"
    assert header in summary
    assert "| cb | minilm | capt | 0 | generated | 36.0 | 33.1 | 20.0 | 93.8 | 83.7 | done |" in summary
    with (folder / "summary.csv").open() as handle:
        table = list(csv.DictReader(handle))
    assert [(r["task"], r["majority"], r["untrained"], r["test"], r["chosen"]) for r in table] == [
        ("cb", "36.0", "20.0", "83.67", "True"), ("rte", "58.0", "42.0", "98.0", "True")]
    readme = (folder / "README.md").read_text()
    assert "jobs/<task>-<model>-<method>-s<seed>-<config hash>/" in readme and "--resume" in readme
    assert "capt-smoke" in readme


def test_a_summary_that_cannot_be_written_is_reported_not_raised(tmp_path):
    (tmp_path / "smoke").write_text("a file where the sweep folder goes")
    sweep = load_sweep_config(SMOKE, [f"storage_path={tmp_path}", "data_source=generated"])
    assert write_summary(sweep, []).startswith("No summary files: ")


def test_a_rerun_that_reused_every_trial_says_so_in_one_line(tmp_path):
    sweep = load_sweep_config(SMOKE, [f"storage_path={tmp_path}", "data_source=generated", "models=[minilm]"])
    jobs = tmp_path / "smoke" / "jobs"
    _, rows = results_table(_grid(reused=(1.0, 1.0)), data_kinds(sweep))
    said = write_summary(sweep, rows).splitlines()
    assert said[0] == f"All 2 trials reused from {jobs}; nothing trained."
    assert said[1].startswith("Summary: ")
    _, some = results_table(_grid(reused=(1.0, 0.0)), data_kinds(sweep))
    assert reuse_line(sweep, some) == f"1 of 2 trials reused from {jobs}; 1 trained or failed now."
    _, none = results_table(_grid(), data_kinds(sweep))
    assert reuse_line(sweep, none) is None and write_summary(sweep, none).startswith("Summary: ")


def test_a_refusal_is_the_trials_own_input_and_its_row_says_why():
    """Errors of the trial's own input are refused (not retried); a held folder or a full disk is the machine's
    state and is retried. The refused trial's row carries the reason instead of scores."""
    from types import SimpleNamespace

    from capt.tasks import TaskDataError
    from pipelines.sweeps.summary import result_rows
    from pipelines.sweeps.trial_process import is_refusal, refusal_report
    from pipelines.training.disk_full import NoSpaceError
    from pipelines.training.outputs import CachedResultError, JobFolderError

    assert is_refusal(TaskDataError("bad label")) and is_refusal(CachedResultError("edited"))
    assert not any(is_refusal(e) for e in (JobFolderError("held"), NoSpaceError("full"), RuntimeError("lost")))
    report = refusal_report(TaskDataError("train.jsonl: line 4:\n field 'label'  " + "x" * 400))
    assert report["refused"].startswith("TaskDataError: train.jsonl: line 4: field 'label' x")
    assert report["refused"].endswith("...") and len(report["refused"]) < 330
    assert report["validation_score"] == float("-inf")
    point = {"task": "cb", "model": "tiny-t5", "method": "capt", "seed": 0}
    [row] = result_rows([SimpleNamespace(config={"point": point}, metrics=report, error=None)])
    assert row["status"] == f"refused: {report['refused']}" and row["test"] is None
