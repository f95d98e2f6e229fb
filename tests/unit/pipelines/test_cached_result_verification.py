"""A finished result is verified before it is reused, never believed (`pipelines.training.outputs`), and a job
artifact's task, base model and method must match where it is loaded (`pipelines.provenance`).

Without tracking: a result.json edited by hand, or whose artifact changed, is refused with the way out and
nothing in the folder changes; `train.overwrite=true` trains afresh. With tracking, the scores of a reused
result must equal those its run logged (`pipelines.tracking.tracker.score_mismatches`; against a real server
in tests/integration/test_artifact_integrity.py).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers.jobs import tiny_job
from safetensors.torch import load_file, save_file

from capt import digest
from capt.errors import ArtifactIntegrityError
from pipelines.capsule_predictor import CapsulePredictor
from pipelines.provenance import ProvenanceError, check_provenance, verify_job_artifact
from pipelines.tracking.run_content import final_metrics, mlflow_metric_name
from pipelines.tracking.tracker import score_mismatches
from pipelines.training.loop import run
from pipelines.training.outputs import CachedResultError, result_digest

TRAIN = {"max_steps": 2, "eval_every_steps": 2, "resume": True}


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("finished") / "job"
    run(tiny_job(folder, train=TRAIN))
    return folder


def _copy(finished: Path, tmp_path: Path) -> Path:
    """A copy of the finished job whose result.json names the copy's artifact (re-sealed, as a move would)."""
    folder = tmp_path / "job"
    shutil.copytree(finished, folder, ignore=shutil.ignore_patterns("job.lock"))
    _edit_result(folder, lambda result: result.update(artifact_dir=str(folder / "artifact")), reseal=True)
    return folder


def _edit_result(folder: Path, change, reseal: bool = False) -> dict:
    path = folder / "result.json"
    result = json.loads(path.read_text())
    change(result)
    if reseal:
        result["result_digest"] = result_digest(result)
    path.write_text(json.dumps(result, indent=2))
    return result


def _stamps(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*")
            if p.is_file() and p.name not in ("job.lock", "job_config.json")}  # both rewritten by every claim


def test_an_untouched_result_is_reused_as_it_stands(finished: Path, tmp_path: Path) -> None:
    folder = _copy(finished, tmp_path)
    stored, before = json.loads((folder / "result.json").read_text()), _stamps(folder)
    assert run(tiny_job(folder, train=TRAIN)) == stored
    assert _stamps(folder) == before
    assert stored["artifact_digest"] == digest.verify(folder / "artifact")
    assert stored["result_digest"] == result_digest(stored)


def test_an_edited_result_is_refused_with_the_way_out_and_nothing_changes(finished: Path, tmp_path: Path) -> None:
    folder = _copy(finished, tmp_path)
    _edit_result(folder, lambda r: r["metrics"].update(test_score=99.9, best_validation_score=99.9))
    before = _stamps(folder)
    with pytest.raises(CachedResultError) as err:
        run(tiny_job(folder, train=TRAIN))
    message = str(err.value)
    found = result_digest(json.loads((folder / "result.json").read_text()))
    assert str(folder / "result.json") in message and found in message and "train.overwrite=true" in message
    assert "\n" not in message
    assert _stamps(folder) == before


def test_a_changed_artifact_is_refused_even_when_result_json_was_resealed(finished: Path, tmp_path: Path) -> None:
    folder = _copy(finished, tmp_path)
    weights = folder / "artifact" / "capsule.safetensors"
    recorded = digest.file_sha256(weights)
    save_file({k: t * -100 for k, t in load_file(weights).items()}, weights, metadata={"format": "pt"})
    digest.seal(folder / "artifact")  # whoever edits the weights may re-seal the manifest too
    with pytest.raises(CachedResultError) as err:
        run(tiny_job(folder, train=TRAIN))
    message = str(err.value)
    assert "capsule.safetensors" in message and recorded in message and digest.file_sha256(weights) in message


def test_overwrite_trains_afresh_instead_of_reusing_an_edited_result(finished: Path, tmp_path: Path) -> None:
    folder = _copy(finished, tmp_path)
    _edit_result(folder, lambda r: r["metrics"].update(test_score=99.9))
    result = run(tiny_job(folder, train={**TRAIN, "overwrite": True}))
    assert result["metrics"]["test_score"] != 99.9
    assert json.loads((folder / "result.json").read_text())["result_digest"] == result_digest(result)


def test_scores_are_compared_with_the_runs_logged_metrics(finished: Path) -> None:
    result = json.loads((finished / "result.json").read_text())
    logged = {**final_metrics(result),
              mlflow_metric_name("best_validation_score"): result["metrics"]["best_validation_score"]}
    assert score_mismatches(logged, result) == []
    edited = {**result, "metrics": {**result["metrics"], "test_score": 99.9}}
    [problem] = score_mismatches(logged, edited)
    assert problem.startswith("test_score: result.json 99.9, run ")


def test_a_task_or_name_mismatch_is_refused(finished: Path, tmp_path: Path) -> None:
    folder = _copy(finished, tmp_path)
    result = json.loads((folder / "result.json").read_text())
    artifact = folder / "artifact"
    verify_job_artifact(artifact, result, "job", "capt-tiny-t5-rte", result["artifact_digest"])
    with pytest.raises(ProvenanceError, match="belongs under 'capt-tiny-t5-rte', not under 'capt-tiny-t5-cb'"):
        check_provenance(artifact, result, "job", "capt-tiny-t5-cb")
    data = json.loads((artifact / "capsule.json").read_text())
    (artifact / "capsule.json").write_text(json.dumps({**data, "task": "cb"}, indent=2, sort_keys=True))
    with pytest.raises(ProvenanceError, match="capsule.json records task 'cb', result.json 'rte'"):
        check_provenance(artifact, result, "job", "capt-tiny-t5-rte")
    digest.seal(artifact)  # re-sealed: the manifest agrees, the digest recorded in result.json does not
    with pytest.raises(ArtifactIntegrityError, match="capsule.json"):
        verify_job_artifact(artifact, result, "job", "capt-tiny-t5-rte")


def test_the_predictor_refuses_a_tampered_artifact_and_loads_an_untouched_one(finished: Path, tmp_path: Path) -> None:
    folder = _copy(finished, tmp_path)
    result = json.loads((folder / "result.json").read_text())
    rows = [{"premise": "A cat sat.", "hypothesis": "A cat exists."}]
    reference = CapsulePredictor(finished / "artifact", result).predict_rows(rows)
    assert CapsulePredictor(folder / "artifact", result, registered_name="capt-tiny-t5-rte").predict_rows(rows) \
        == reference
    (folder / "artifact" / "method.json").write_text(json.dumps({"method": "capt", "task": "rte"}))
    with pytest.raises(ArtifactIntegrityError, match="method.json"):
        CapsulePredictor(folder / "artifact", result)
