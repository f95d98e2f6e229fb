"""Reference levels (`capt.tasks.levels`): majority class and chance, on the task's own metrics."""

from __future__ import annotations

import pytest

from capt.tasks import Example
from capt.tasks.levels import chance_score, majority_label, majority_score, reference_levels


def _examples(task: str, labels: list[int], groups: list[str] | None = None) -> list[Example]:
    return [Example(task, f"{task}/x/{i}", {}, label, None if groups is None else groups[i])
            for i, label in enumerate(labels)]


def test_the_majority_label_is_the_most_frequent_training_label_ties_to_the_lowest_id():
    assert majority_label(_examples("cb", [2, 1, 2, 0])) == 2
    assert majority_label(_examples("cb", [2, 1, 1, 2])) == 1
    with pytest.raises(ValueError, match="No training examples"):
        majority_label([])


def test_the_majority_score_is_the_task_score_of_always_predicting_it():
    train, test = _examples("cb", [0, 0, 1]), _examples("cb", [0, 0, 1, 2])
    # accuracy 50; macro-F1 over classes {0, 1, 2}: F1(0) = 2*2 / (2*2 + 2 + 0) = 66.7, F1(1) = F1(2) = 0
    assert majority_score(train, test) == pytest.approx((50.0 + 200.0 / 9) / 2)
    rte = _examples("rte", [1, 1, 0])
    assert majority_score(rte, _examples("rte", [1, 0, 0, 0])) == pytest.approx(25.0)


def test_chance_is_the_expected_score_of_uniform_guessing_and_is_deterministic():
    test = _examples("rte", [0, 1] * 200)
    assert chance_score(test) == pytest.approx(50.0, abs=1.0) and chance_score(test) == chance_score(test)
    assert chance_score(_examples("csqa", [0, 1, 2, 3, 4] * 80)) == pytest.approx(20.0, abs=1.0)


def test_multirc_levels_use_its_question_groups():
    labels, groups = [1, 0, 0, 0, 1, 0], ["q1", "q1", "q1", "q2", "q2", "q2"]
    test = _examples("multirc", labels, groups)
    # always 0: F1a 0, and no question has every row right (each has one positive)
    assert majority_score(_examples("multirc", [0, 0, 1]), test) == 0.0
    levels = reference_levels(_examples("multirc", [0, 0, 1]), test)
    assert set(levels) == {"majority_score", "chance_score"} and 0.0 < levels["chance_score"] < 50.0
