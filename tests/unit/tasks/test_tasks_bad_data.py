"""Every bad-data case raises `TaskDataError` naming the file, the row (line) and the field."""

from __future__ import annotations

import io
import json
import os
import tracemalloc
from pathlib import Path

import pytest

from capt.tasks import DataConfig, TaskDataError, load_split, load_splits

GOOD_RTE = {"premise": "A cat sat.", "hypothesis": "A cat.", "label": "entailment", "idx": 0}


def _write(root: Path, task: str, split: str, rows: list) -> Path:
    folder = root / task
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{split}.jsonl"
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _load(root: Path, task: str, split: str = "val"):
    return load_split(task, split, DataConfig(source="local", data_dir=str(root)))


def _error(root: Path, task: str, split: str = "val") -> TaskDataError:
    with pytest.raises(TaskDataError) as err:
        _load(root, task, split)
    return err.value


def test_good_file_loads(tmp_path):
    _write(tmp_path, "rte", "val", [GOOD_RTE])
    assert _load(tmp_path, "rte")[0].label == 0


def test_no_data_dir():
    with pytest.raises(TaskDataError, match="CAPT_DATA_DIR") as err:
        load_split("rte", "val", DataConfig(source="local", data_dir=None))
    assert err.value.field == "data_dir"


def test_data_dir_does_not_exist(tmp_path):
    err = _error(tmp_path / "nope", "rte")
    assert err.path == str(tmp_path / "nope") and "does not exist" in str(err)


def test_missing_task_folder(tmp_path):
    (tmp_path / "RTE").mkdir()
    err = _error(tmp_path, "rte")
    assert err.path == str(tmp_path / "rte") and "missing task folder 'rte'" in str(err) and "RTE" in str(err)


def test_missing_split_file(tmp_path):
    _write(tmp_path, "rte", "val", [GOOD_RTE])
    with pytest.raises(TaskDataError) as err:
        load_splits("rte", DataConfig(source="local", data_dir=str(tmp_path)))
    assert err.value.path == str(tmp_path / "rte" / "train.jsonl")
    assert str(tmp_path / "rte" / "train.jsonl") in str(err.value) and "val.jsonl" in str(err.value)


def test_invalid_json_names_the_line(tmp_path):
    path = _write(tmp_path, "rte", "val", [GOOD_RTE, "", '{"premise": "x", '])
    err = _error(tmp_path, "rte")
    assert (err.path, err.row) == (str(path), 3) and "invalid JSON" in str(err) and "line 3" in str(err)


def test_missing_field(tmp_path):
    bad = dict(GOOD_RTE, idx=1)
    del bad["hypothesis"]
    path = _write(tmp_path, "rte", "val", [GOOD_RTE, bad])
    err = _error(tmp_path, "rte")
    assert (err.path, err.row, err.field) == (str(path), 2, "hypothesis")
    assert str(err) == f"{path}: line 2: field 'hypothesis': missing field"


@pytest.mark.parametrize(("label", "task"), [("maybe", "rte"), (2, "rte"), (-1, "rte"), (True, "rte"),
                                             ("yes", "boolq"), (5, "copa")])
def test_unknown_label(tmp_path, label, task):
    rows = {"rte": dict(GOOD_RTE, label=label),
            "boolq": {"question": "q", "passage": "p", "idx": 0, "label": label},
            "copa": {"premise": "p", "choice1": "a", "choice2": "b", "question": "cause", "idx": 0,
                     "label": label}}
    _write(tmp_path, task, "val", [rows[task]])
    err = _error(tmp_path, task)
    assert (err.row, err.field) == (1, "label") and "unknown label" in str(err)


@pytest.mark.parametrize(("value", "problem"), [("   ", "empty string"), (3, "expected a string")])
def test_bad_text_field(tmp_path, value, problem):
    _write(tmp_path, "rte", "val", [dict(GOOD_RTE, premise=value)])
    err = _error(tmp_path, "rte")
    assert err.field == "premise" and problem in str(err)


def test_empty_split(tmp_path):
    path = _write(tmp_path, "rte", "val", [])
    err = _error(tmp_path, "rte")
    assert err.path == str(path) and "empty" in str(err)


def test_duplicate_idx(tmp_path):
    _write(tmp_path, "rte", "val", [GOOD_RTE, GOOD_RTE])
    err = _error(tmp_path, "rte")
    assert (err.row, err.field) == (2, "idx") and "duplicate" in str(err)


def test_row_not_an_object(tmp_path):
    _write(tmp_path, "rte", "val", [[1, 2]])
    assert "expected a JSON object" in str(_error(tmp_path, "rte"))


def test_multirc_nested_field_path(tmp_path):
    row = {"idx": 0, "passage": {"text": "P.", "questions": [
        {"question": "Q?", "idx": 0, "answers": [{"text": "a", "idx": 0, "label": 1}, {"text": "b", "idx": 1}]}]}}
    _write(tmp_path, "multirc", "val", [row])
    err = _error(tmp_path, "multirc")
    assert err.field == "passage.questions[0].answers[1].label"
    row["passage"]["questions"] = []
    _write(tmp_path, "multirc", "val", [row])
    assert _error(tmp_path, "multirc").field == "passage.questions"


def test_csqa_bad_choices_and_key(tmp_path):
    choices = [{"label": lab, "text": t} for lab, t in zip("ABCD", "wxyz", strict=True)]
    row = {"id": "q", "answerKey": "A", "question": {"stem": "S?", "question_concept": "c", "choices": choices}}
    _write(tmp_path, "csqa", "val", [row])
    assert _error(tmp_path, "csqa").field == "question.choices"
    row["question"]["choices"] = choices + [{"label": "E", "text": "v"}]
    row["answerKey"] = "F"
    _write(tmp_path, "csqa", "val", [row])
    assert _error(tmp_path, "csqa").field == "answerKey"


def test_copa_question_and_wic_span(tmp_path):
    _write(tmp_path, "copa", "val", [{"premise": "p", "choice1": "a", "choice2": "b", "question": "why",
                                      "idx": 0, "label": 0}])
    assert _error(tmp_path, "copa").field == "question"
    wic = {"word": "w", "sentence1": "a w", "sentence2": "w b", "idx": 0, "label": False,
           "start1": 2, "end1": 9, "start2": 0, "end2": 1}
    _write(tmp_path, "wic", "val", [wic])
    err = _error(tmp_path, "wic")
    assert err.field == "start1" and "outside" in str(err)


def test_unknown_split_name(tmp_path):
    with pytest.raises(ValueError, match="train, val"):
        load_split("rte", "test", DataConfig(source="local", data_dir=str(tmp_path)))


def test_error_pickles():
    import pickle

    err = TaskDataError("bad", path="f.jsonl", row=3, field="label")
    again = pickle.loads(pickle.dumps(err))
    assert (again.path, again.row, again.field, str(again)) == ("f.jsonl", 3, "label", str(err))


def test_bytes_that_are_not_utf8_are_named_by_line_and_column(tmp_path):
    path = tmp_path / "rte" / "val.jsonl"
    path.parent.mkdir()
    path.write_bytes(json.dumps(GOOD_RTE).encode() + b'\n{"premise": "caf\xe9"}\n')
    err = _error(tmp_path, "rte")
    assert (err.path, err.row) == (str(path), 2)
    assert str(err) == f"{path}: line 2: not UTF-8 text: byte 0xe9 at column 17; save the file as UTF-8"


def test_a_leading_byte_order_mark_is_accepted(tmp_path):
    path = tmp_path / "rte" / "val.jsonl"
    path.parent.mkdir()
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(GOOD_RTE).encode() + b"\n")
    assert _load(tmp_path, "rte")[0].label == 0


def test_a_train_split_too_small_for_validation_is_refused_with_the_numbers(tmp_path):
    path = _write(tmp_path, "rte", "train", [GOOD_RTE])
    _write(tmp_path, "rte", "val", [GOOD_RTE])
    config = DataConfig(source="local", data_dir=str(tmp_path), validation_fraction=0.25)
    with pytest.raises(TaskDataError) as err:
        load_splits("rte", config)
    assert err.value.path == str(path)
    assert "has 1 row(s)" in str(err.value) and "validation_fraction=0.25" in str(err.value)
    assert "needs at least 2 rows" in str(err.value)
    _write(tmp_path, "rte", "train", [GOOD_RTE, dict(GOOD_RTE, idx=1, label="not_entailment")])
    splits = load_splits("rte", config)
    assert (len(splits.train), len(splits.validation)) == (1, 1)


def test_one_multirc_question_is_too_small_for_validation_however_many_answers(tmp_path):
    answers = [{"text": f"a{i}", "idx": i, "label": i % 2} for i in range(4)]
    row = {"idx": 0, "passage": {"text": "P.", "questions": [{"question": "Q?", "idx": 0, "answers": answers}]}}
    _write(tmp_path, "multirc", "train", [row])
    _write(tmp_path, "multirc", "val", [row])
    with pytest.raises(TaskDataError, match=r"has 4 row\(s\) in 1 question group\(s\).*at least 2 question groups"):
        load_splits("multirc", DataConfig(source="local", data_dir=str(tmp_path)))


def test_a_key_twice_in_a_row_is_refused_not_taken_last(tmp_path):
    _write(tmp_path, "rte", "val", [GOOD_RTE, json.dumps(GOOD_RTE)[:-1] + ', "label": "not_entailment"}'])
    err = _error(tmp_path, "rte")
    assert err.row == 2 and "the key 'label' appears twice in one object" in str(err)


def test_json_nested_past_the_recursion_limit_names_the_line(tmp_path):
    _write(tmp_path, "rte", "val", ['{"premise": ' + "[" * 100_000 + "]" * 100_000 + "}"])
    err = _error(tmp_path, "rte")
    assert err.row == 1 and "nests deeper than Python can read" in str(err)


@pytest.mark.parametrize(("make", "problem"), [
    (lambda path: path.symlink_to(path.name), "is a symlink loop"),
    (lambda path: path.symlink_to("elsewhere.jsonl"), "is a symlink to 'elsewhere.jsonl', which does not exist"),
    (lambda path: os.mkfifo(path), "is a FIFO (named pipe), not a regular file"),
    (lambda path: path.mkdir(), "is a folder, not a file"),
])
def test_a_split_name_that_is_not_a_readable_file_says_what_it_is(tmp_path, make, problem):
    (tmp_path / "rte").mkdir()
    make(tmp_path / "rte" / "val.jsonl")
    err = _error(tmp_path, "rte")
    assert problem in str(err) and "missing file" not in str(err)


def test_a_task_folder_that_is_a_symlink_loop_is_named_as_one(tmp_path):
    (tmp_path / "rte").symlink_to("rte")
    assert "the task folder is a symlink loop" in str(_error(tmp_path, "rte"))


def test_a_train_split_of_one_label_trains_with_a_warning(tmp_path, caplog):
    _write(tmp_path, "rte", "train", [dict(GOOD_RTE, idx=i) for i in range(20)])
    _write(tmp_path, "rte", "val", [GOOD_RTE])
    with caplog.at_level("WARNING", logger="capt.tasks.loading"):
        splits = load_splits("rte", DataConfig(source="local", data_dir=str(tmp_path)))
    assert {example.label for example in splits.train} == {0}
    assert "training examples from" in caplog.text and "has label 0: the model can only learn" in caplog.text
    caplog.clear()
    _write(tmp_path, "rte", "train", [dict(GOOD_RTE, idx=i, label=("entailment", "not_entailment")[i % 2])
                                      for i in range(20)])
    load_splits("rte", DataConfig(source="local", data_dir=str(tmp_path)))
    assert "can only learn" not in caplog.text


def test_a_line_past_the_row_limit_is_refused_without_being_read_whole(tmp_path):
    from capt.tasks.loading import MAX_LINE_BYTES

    path = _write(tmp_path, "rte", "val", [GOOD_RTE])
    with path.open("a") as handle:  # a 50 MB row: read whole and tokenised it took gigabytes
        handle.write('{"premise": "' + "x" * 50_000_000 + '", "hypothesis": "h", "label": 0, "idx": 1}\n')
    tracemalloc.start()
    try:
        err = _error(tmp_path, "rte")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert err.row == 2 and f"longer than {MAX_LINE_BYTES:,} bytes" in str(err) and str(path) in str(err)
    assert peak < 4 * MAX_LINE_BYTES, f"{peak:,} bytes allocated to refuse the line"


def test_a_line_at_the_row_limit_is_read():
    from capt.tasks.loading import MAX_LINE_BYTES, _jsonl_rows

    row = json.dumps({"premise": "x"})
    line = row + " " * (MAX_LINE_BYTES - len(row)) + "\n"  # JSON allows trailing spaces
    assert [number for number, _ in _jsonl_rows(io.BytesIO(line.encode()), "mem.jsonl")] == [1]


def test_a_text_past_the_field_limit_is_refused_naming_the_field(tmp_path):
    from capt.tasks.validation import MAX_TEXT_CHARS

    _write(tmp_path, "rte", "val", [GOOD_RTE, {**GOOD_RTE, "idx": 1, "hypothesis": "y" * (MAX_TEXT_CHARS + 1)}])
    err = _error(tmp_path, "rte")
    assert err.row == 2 and err.field == "hypothesis"
    assert f"a text of {MAX_TEXT_CHARS + 1:,} characters; at most {MAX_TEXT_CHARS:,}" in str(err)


def test_a_model_input_past_the_field_limit_is_refused_before_tokenising():
    """The registry pyfunc's and the Serve app's one input check (a 10 MB premise added 1.6 GB when tokenised)."""
    from pipelines.capsule_predictor import validated_examples

    row = {"premise": "p" * 10_000_000, "hypothesis": "h"}
    tracemalloc.start()
    try:
        with pytest.raises(TaskDataError, match="at most 100,000") as err:
            validated_examples("rte", [row])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert err.value.field == "premise" and err.value.row == 1
    assert peak < 1_000_000, f"{peak:,} bytes allocated to refuse the row"
