"""Decoding helpers: text normalisation, generated text -> label, rank classification."""

from __future__ import annotations

import numpy as np
import pytest

from capt.tasks import INVALID, get, names, normalize_text, rank_classify, text_to_label, texts_to_labels
from capt.tasks.records import Example


def test_normalize_text():
    assert normalize_text("  The  Answer, is: YES! ") == "answer is yes"
    assert normalize_text("an apple a day") == "apple day"
    assert normalize_text("not_entailment.") == "notentailment"
    assert normalize_text("") == ""


@pytest.mark.parametrize("task", names())
def test_every_verbalizer_maps_back(task):
    spec = get(task)
    for label, word in enumerate(spec.verbalizers):
        assert text_to_label(task, word) == label
        assert text_to_label(task, f" {word.upper()}.\n") == label
    normalised = [normalize_text(w) for w in spec.verbalizers]
    assert len(set(normalised)) == spec.num_labels and all(normalised)


def test_text_to_label_cases():
    assert text_to_label("rte", "Not entailment") == INVALID  # space is not the underscore
    assert text_to_label("rte", "not_entailment") == 1
    assert text_to_label("boolq", "True") == 1  # label names are accepted too
    assert text_to_label("boolq", "maybe") == INVALID
    assert text_to_label("boolq", "") == INVALID
    assert text_to_label("cb", "the neutral") == 2


def test_choice_text_is_accepted_with_the_example():
    ex = Example("copa", "copa/val/0", {"premise": "p", "question": "cause", "choice1": "The sun rose.",
                                        "choice2": "It rained."}, 1)
    assert text_to_label("copa", "it rained", ex) == 1
    assert text_to_label("copa", "it rained") == INVALID
    assert texts_to_labels("copa", ["2", "the sun rose"], [ex, ex]) == [1, 0]


def test_rank_classify():
    assert rank_classify([[0.1, 0.9], [-1.0, -2.0], [3.0, 3.0]]) == [1, 0, 0]
    assert rank_classify(np.zeros((0, 3))) == []
    with pytest.raises(ValueError, match="shape"):
        rank_classify([1.0, 2.0])


def test_rank_classify_torch_tensor():
    torch = pytest.importorskip("torch")
    assert rank_classify(torch.tensor([[0.0, 1.0, 2.0]], dtype=torch.bfloat16)) == [2]
