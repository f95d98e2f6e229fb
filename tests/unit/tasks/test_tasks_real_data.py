"""Real data through CAPT_DATA_DIR: official sizes, the paper's splits, the missing BoolQ train split."""

from __future__ import annotations

from collections import Counter

import pytest

from capt.tasks import DataConfig, TaskDataError, load_split, load_splits, names, split_train_validation

OFFICIAL_SIZES = {  # (train, val) rows after flattening; BoolQ train is not in shared/data (SOURCES.md)
    "boolq": (9427, 3270),
    "cb": (250, 56),
    "copa": (400, 100),
    "multirc": (27243, 4848),
    "rte": (2490, 277),
    "wic": (5428, 638),
    "csqa": (9741, 1221),
}
MULTIRC_QUESTIONS = (5131, 953)


def official_train(official, task: str):
    """The official train split, or a skip whose reason is the loader's error (BoolQ: file missing)."""
    try:
        return official(task, "train")
    except TaskDataError as err:
        pytest.skip(f"official train split unavailable: {err}")


@pytest.mark.parametrize("task", names())
def test_official_val_sizes(official, task):
    assert len(official(task, "val")) == OFFICIAL_SIZES[task][1]
    assert not any(e.is_generated for e in official(task, "val"))


@pytest.mark.parametrize("task", names())
def test_official_train_sizes(official, task):
    assert len(official_train(official, task)) == OFFICIAL_SIZES[task][0]


def test_multirc_question_groups(official):
    for split, questions in zip(("train", "val"), MULTIRC_QUESTIONS, strict=True):
        examples = official("multirc", split)
        assert len({e.group for e in examples}) == questions
        assert all(e.group and e.uid.startswith(e.group + "-") for e in examples)


def test_boolq_train_missing_names_the_file(data_dir):
    if (data_dir / "boolq" / "train.jsonl").exists():
        pytest.skip("this CAPT_DATA_DIR has the BoolQ train split")
    with pytest.raises(TaskDataError) as err:
        load_splits("boolq", DataConfig(source="local", data_dir=str(data_dir)))
    assert str(data_dir / "boolq" / "train.jsonl") in str(err.value)
    assert err.value.path == str(data_dir / "boolq" / "train.jsonl")


@pytest.mark.parametrize("task", ["cb", "copa", "rte"])
def test_load_splits_end_to_end(data_dir, official, task):
    config = DataConfig(source="local", data_dir=str(data_dir), seed=3)
    splits = load_splits(task, config)
    assert splits.test == official(task, "val")
    assert len(splits.train) + len(splits.validation) == OFFICIAL_SIZES[task][0]
    assert load_splits(task, config) == splits


def _uids(examples):
    return [e.uid for e in examples]


@pytest.mark.parametrize("task", names())
def test_splits_deterministic_disjoint_stratified(official, task):
    examples = official_train(official, task)
    train, val = split_train_validation(examples, 0.1, seed=0)
    again = split_train_validation(examples, 0.1, seed=0)
    other = split_train_validation(examples, 0.1, seed=1)
    assert (_uids(train), _uids(val)) == (_uids(again[0]), _uids(again[1]))
    assert _uids(val) != _uids(other[1])
    test_uids = set(_uids(official(task, "val")))
    assert not set(_uids(train)) & set(_uids(val))
    assert not (set(_uids(train)) | set(_uids(val))) & test_uids
    assert len(train) + len(val) == len(examples)
    if task == "multirc":
        assert not {e.group for e in train} & {e.group for e in val}
        assert abs(len({e.group for e in val}) - 0.1 * MULTIRC_QUESTIONS[0]) <= 2
        full = Counter(e.label for e in examples)
        held = Counter(e.label for e in val)
        for label, count in full.items():  # row-level proportions stay close (groups are the unit)
            assert abs(held[label] / len(val) - count / len(examples)) < 0.02
    else:
        full = Counter(e.label for e in examples)
        held = Counter(e.label for e in val)
        for label, count in full.items():
            assert abs(held[label] - 0.1 * count) <= 1, (label, held[label], count)


def test_max_examples_subsample(data_dir):
    config = DataConfig(source="local", data_dir=str(data_dir), max_train_examples=50, max_eval_examples=20)
    splits = load_splits("rte", config)
    assert splits.sizes() == {"train": 50, "validation": 20, "test": 20}
    assert load_splits("rte", config) == splits


def test_multirc_subsample_keeps_whole_questions(official):
    from capt.tasks import subsample

    examples = official("multirc", "val")
    picked = subsample(examples, 100, seed=0)
    assert 0 < len(picked) <= 100
    sizes = Counter(e.group for e in examples)
    assert all(Counter(e.group for e in picked)[g] == sizes[g] for g in {e.group for e in picked})


def test_local_jsonl_matches_direct_read(data_dir):
    import json

    rows = [json.loads(line) for line in (data_dir / "rte" / "val.jsonl").read_text().splitlines()]
    examples = load_split("rte", "val", DataConfig(source="local", data_dir=str(data_dir)))
    assert [e.fields["hypothesis"] for e in examples] == [r["hypothesis"].strip() for r in rows]
    assert [e.label for e in examples] == [0 if r["label"] == "entailment" else 1 for r in rows]
