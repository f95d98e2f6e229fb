"""T5's own SuperGLUE input format ("t5_superglue"): the exact strings and label words of T5's preprocessors,
for T5 models only, refused for CommonsenseQA and other families."""

from __future__ import annotations

import pytest

from capt import tasks
from capt.tasks.decoding import text_to_label
from capt.tasks.formats import render_input
from capt.tasks.input_formats import formatted_spec
from capt.tasks.records import Example

FIELDS = {
    "boolq": {"question": "is it wet", "passage": "Rain is wet."},
    "cb": {"premise": "A said B.", "hypothesis": "B is true"},
    "copa": {"premise": "The man fell.", "question": "cause", "choice1": "He slipped.", "choice2": "He sang."},
    "multirc": {"paragraph": "<b>Sent 1: </b>It rained.<br><b>Sent 2: </b>It stopped.", "question": "What rained?",
                "answer": "It"},
    "rte": {"premise": "Paris is in France.", "hypothesis": "Paris is French."},
    "wic": {"word": "bank", "sentence1": "The river bank.", "sentence2": "The bank lent money."},
}
EXPECTED = {  # (input, label words in label-id order), as T5's `glue` preprocessor renders SuperGLUE
    "boolq": ("boolq passage: Rain is wet. question: is it wet", ("False", "True")),
    "cb": ("cb hypothesis: B is true premise: A said B.", ("entailment", "contradiction", "neutral")),
    "copa": ("copa choice1: He slipped. choice2: He sang. premise: The man fell. question: cause",
             ("choice1", "choice2")),
    "multirc": ("multirc question: What rained? answer: It paragraph: Sent 1: It rained. Sent 2: It stopped.",
                ("False", "True")),
    "rte": ("rte hypothesis: Paris is French. premise: Paris is in France.", ("entailment", "not_entailment")),
    "wic": ("wic sentence1: The river bank. sentence2: The bank lent money. word: bank", ("False", "True")),
}


@pytest.mark.parametrize("task", sorted(EXPECTED))
def test_each_superglue_task_renders_as_t5_saw_it(task):
    spec = formatted_spec(task, "t5_superglue")
    text, words = EXPECTED[task]
    assert render_input(spec, FIELDS[task], "t5") == text
    assert spec.verbalizers == words
    for label, word in enumerate(words):  # generated T5 label words map back to the label ids
        assert text_to_label(task, word, Example(task, "x", FIELDS[task], label)) == label


def test_the_collator_tokenises_the_t5_format_and_its_label_words():
    tokenizer = tasks.test_tokenizer("t5")
    collator = tasks.Collator(tokenizer, "t5", max_length=128, capsule_slots=1, input_format="t5_superglue")
    batch = collator([Example("boolq", "0", FIELDS["boolq"], 1)])
    assert tokenizer.decode(batch["input_ids"][0], skip_special_tokens=True).replace(" ", "") == \
        EXPECTED["boolq"][0].replace(" ", "")
    answer = batch["labels"][0][batch["labels"][0] >= 0]
    assert tokenizer.decode(answer, skip_special_tokens=True).replace(" ", "") == "True"
    candidates = collator.candidate_batch([Example("boolq", "0", FIELDS["boolq"], 1)])
    words = [tokenizer.decode(row[row >= 0], skip_special_tokens=True).replace(" ", "") for row in candidates["labels"]]
    assert words == ["False", "True"]


def test_the_t5_format_is_refused_for_other_families_and_for_csqa():
    with pytest.raises(ValueError, match="for T5-family models only"):
        tasks.Collator(tasks.test_tokenizer("decoder"), "decoder", input_format="t5_superglue")
    with pytest.raises(ValueError, match="T5's mixture had no csqa format"):
        formatted_spec("csqa", "t5_superglue")
    with pytest.raises(ValueError, match="input_format='t5' .allowed: capt, t5_superglue"):
        formatted_spec("rte", "t5")
