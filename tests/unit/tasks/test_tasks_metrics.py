"""Metrics against hand-computed values (all in percent)."""

from __future__ import annotations

import numpy as np
import pytest

from capt.tasks import accuracy, average_score, compute_metrics, exact_match, f1a, macro_f1, task_score


def test_accuracy_counts_invalid_as_wrong():
    assert accuracy([1, 0, -1, 1], [1, 0, 0, 0]) == pytest.approx(50.0)


def test_cb_macro_f1_by_hand():
    labels = [0, 0, 1, 1, 2, 2]
    preds = [0, 1, 1, 1, 2, 0]
    # class 0: tp 1, fp 1, fn 1 -> 1/2; class 1: tp 2, fp 1 -> 4/5; class 2: tp 1, fn 1 -> 2/3
    expected = 100 * (0.5 + 0.8 + 2 / 3) / 3
    assert macro_f1(preds, labels) == pytest.approx(expected)
    metrics = compute_metrics("cb", preds, labels)
    assert metrics["accuracy"] == pytest.approx(400 / 6)
    assert metrics["macro_f1"] == pytest.approx(expected)
    assert metrics["score"] == pytest.approx((400 / 6 + expected) / 2)


def test_macro_f1_ignores_invalid_as_a_class_and_absent_classes():
    # class 2 never occurs: not averaged; -1 is wrong for class 0 but not a class of its own
    assert macro_f1([0, -1, 1, 1], [0, 0, 1, 1]) == pytest.approx(100 * (2 / 3 + 1.0) / 2)


def test_multirc_f1a_and_em_by_hand():
    labels = [1, 0, 1, 0, 1, 1]
    preds = [1, 0, 1, 0, 0, 1]
    groups = ["q1", "q1", "q1", "q2", "q2", "q3"]
    # F1a: tp 3, fp 0, fn 1 -> 6/7; EM: q1 right, q2 wrong (row 4), q3 right -> 2/3
    assert f1a(preds, labels) == pytest.approx(600 / 7)
    assert exact_match(preds, labels, groups) == pytest.approx(200 / 3)
    metrics = compute_metrics("multirc", preds, labels, groups)
    assert metrics == pytest.approx({"f1a": 600 / 7, "em": 200 / 3, "score": (600 / 7 + 200 / 3) / 2})


def test_em_groups_need_not_be_contiguous():
    assert exact_match([1, 1, 0], [1, 0, 0], ["a", "b", "a"]) == pytest.approx(50.0)


def test_multirc_needs_groups():
    with pytest.raises(ValueError, match="groups"):
        compute_metrics("multirc", [1], [1])


def test_f1a_without_true_positives_is_zero():
    assert f1a([0, 0], [1, 0]) == 0.0


def test_task_score_and_average():
    assert task_score({"accuracy": 80.0, "other": 1.0}, "rte") == 80.0
    scores = {"rte": 70.0, "cb": 90.0, "boolq": 80.0}
    assert average_score(scores) == pytest.approx(80.0)
    with pytest.raises(KeyError, match="valid tasks"):
        average_score({"nope": 1.0})
    with pytest.raises(KeyError, match="missing"):
        task_score({"accuracy": 1.0}, "cb")


def test_length_mismatch_and_empty_raise():
    with pytest.raises(ValueError, match="2 predictions but 1 labels"):
        accuracy([1, 0], [1])
    with pytest.raises(ValueError, match="No examples"):
        accuracy([], [])


def test_accepts_numpy_and_every_task_has_a_score():
    from capt.tasks import names

    for task in names():
        groups = ["g0", "g0", "g1"] if task == "multirc" else None
        metrics = compute_metrics(task, np.array([0, 1, 1]), np.array([0, 1, 0]), groups)
        assert 0.0 <= metrics["score"] <= 100.0
