"""`benchmarks.capsule_influence`: a CaPT job's test score with its task vectors as trained and zeroed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from helpers.jobs import tiny_job

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `benchmarks` is a top-level folder, not an installed package
    sys.path.insert(0, str(ROOT))

from benchmarks import capsule_influence  # noqa: E402
from pipelines.training.loop import run  # noqa: E402


def trained(folder: Path, *overrides: str) -> Path:
    run(tiny_job(folder, "tiny-bert", "capt", *overrides, train={"max_steps": 6, "eval_every_steps": 3},
                 optim={"lr": 0.5}, task={"max_eval_examples": 32}))
    return folder


def test_zeroing_a_trained_capsule_is_measured_against_the_jobs_own_score(tmp_path, capsys):
    job = trained(tmp_path / "job", "model.readout=capsule")  # the head reads the slot: zeroing must tell
    out = tmp_path / "influence.json"

    assert capsule_influence.main([str(job), "--out", str(out)]) == 0

    row = json.loads(out.read_text())[0]
    assert row["test_score"] == pytest.approx(row["job_test_score"])  # the artifact reproduces the job
    assert row["vector_norm_per_layer"] > 0  # lr 0.5 for 6 steps moved the zero-initialised vectors
    assert 0 < row["changed_predictions_pct"] <= 100 and row["method"] == "capt" and row["lr"] == 0.5
    assert row["test_score_zeroed"] != row["test_score"]
    assert "| job | method | lr |" in capsys.readouterr().out


def test_a_zeroed_capsule_scores_as_the_anchor_with_the_trained_head(tmp_path):
    # A capsule trained at lr 1e-12 stays at its zero init: zeroing it changes nothing.
    row = capsule_influence.influence(trained(tmp_path / "job", "optim.lr=1e-12"))
    assert row["vector_norm_per_layer"] < 1e-9 and row["changed_predictions_pct"] == 0
    assert row["test_score_zeroed"] == pytest.approx(row["test_score"])


def test_jobs_without_task_vectors_or_files_are_refused(tmp_path, capsys):
    anchor_only = trained(tmp_path / "anchor", "method.options.task_vector=false")
    assert capsule_influence.main([str(anchor_only), str(tmp_path / "missing")]) == 2
    assert "missing: no artifact" in capsys.readouterr().err
    assert capsule_influence.main([str(anchor_only)]) == 2
    assert "has no trained task vectors" in capsys.readouterr().err
