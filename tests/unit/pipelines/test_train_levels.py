"""A job measures what its test score is compared with: majority class, chance and (on request) its untrained self."""

from __future__ import annotations

from helpers.jobs import tiny_job

from capt.tasks.levels import chance_score, majority_score
from pipelines.training.checkpoint import LoopState
from pipelines.training.loop import run
from pipelines.training.setup import load_data


def test_a_job_reports_the_majority_class_chance_and_its_untrained_score(tmp_path):
    config = tiny_job(tmp_path / "trained", "tiny-t5", "capt", "train.score_untrained=true", "train.max_steps=3",
                      "train.eval_every_steps=3")
    trained = run(config)["metrics"]
    # With zero task vectors the untrained capsule is the training-free instance-mean capsule: the same scores.
    free = run(tiny_job(tmp_path / "free", "tiny-t5", "capt", method={"options": {"task_vector": False}}))["metrics"]
    assert trained["test_untrained_score"] == free["test_score"]
    assert "test_untrained_score" not in free, "scored only with train.score_untrained"
    splits = load_data(config)
    assert trained["test_majority_score"] == majority_score(splits.train, splits.test) == free["test_majority_score"]
    assert trained["test_chance_score"] == chance_score(splits.test)


def test_a_resumed_job_keeps_the_untrained_score_of_its_first_start():
    assert LoopState.from_json(LoopState(step=4, untrained_score=37.5).to_json()).untrained_score == 37.5
