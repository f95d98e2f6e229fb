"""`benchmarks.learning_merge`: pieces of the learning grid become one pipelines.report table, or one error."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `benchmarks` is a top-level folder, not an installed package
    sys.path.insert(0, str(ROOT))

from benchmarks import learning, learning_merge  # noqa: E402
from benchmarks.common import BenchResult, Table, save_result  # noqa: E402

SCORES = {  # task -> method -> three seeds' test scores
    "cb": {"capt": [50.0, 60.0, 70.0], "lora": [40.0, 44.0, 48.0]},
    "rte": {"capt": [51.0, 53.0, 55.0], "lora": [47.0, 49.0, 51.0]},
    "copa": {"capt": [52.0, 52.0, 58.0], "lora": [50.0, 50.0, 50.0]},
}


def write_piece(folder: Path, tasks: list[str], extra_overrides: tuple[str, ...] = (), with_model: bool = True,
                trained: dict[str, dict] | None = None, started: str = "2026-11-30T00:00:00+00:00"):
    """A learning.json as `benchmarks.run --only learning --learning-override tasks=[...]` writes it; `trained`:
    the training settings its trials record, per method (none: rows written before trials recorded them)."""
    rows = [{"task": task, **({"model": "minilm"} if with_model else {}), "method": method, "seed": seed,
             "test_score": score, "steps": 30, **({"settings": trained[method]} if method in (trained or {}) else {})}
            for task in tasks for method, scores in SCORES[task].items() for seed, score in enumerate(scores)]
    settings = {**learning.settings(quick=False), "overrides": [f"tasks=[{','.join(tasks)}]", *extra_overrides]}
    result = BenchResult("learning", learning.TITLE, settings, started=started, duration_s=60.0)
    result.tables.append(Table(learning_merge.TRIALS_TABLE, list(rows[0]), rows))
    save_result(result, folder)
    return folder


def table_row(text: str, method: str) -> list[str]:
    line = next(line for line in text.splitlines() if line.startswith(f"| {method} |"))
    return [cell.strip() for cell in line.strip("|").split("|")][1:]


def test_two_pieces_give_one_table_over_all_their_tasks(tmp_path):
    first = write_piece(tmp_path / "cb_rte", ["cb", "rte"])
    second = write_piece(tmp_path / "copa", ["copa"], with_model=False)  # older rows: model from the config
    out = tmp_path / "merged"

    assert learning_merge.main([str(first), str(second), "--out", str(out)]) == 0

    text = (out / "report.md").read_text()
    tasks = table_row(text, "method")[:-1]
    assert sorted(tasks) == sorted(SCORES) and table_row(text, "method")[-1] == "SuperGLUE avg (3 of 6 tasks)"
    capt = table_row(text, "capt")
    for cell, task in zip(capt, tasks, strict=False):
        scores = SCORES[task]["capt"]
        assert cell == f"{statistics.mean(scores):.2f} ± {statistics.stdev(scores):.2f}"
    average = statistics.mean(statistics.mean(SCORES[t]["capt"]) for t in SCORES)
    assert capt[-1] == f"{average:.2f}"
    assert table_row(text, "lora")[tasks.index("copa")] == "50.00 ± 0.00"
    assert "## minilm" in text and "Seeds per cell: 3." in text
    assert str(first) in text and str(second) in text
    assert (out / "report.png").stat().st_size > 0


def test_every_problem_is_reported_at_once_and_nothing_is_written(tmp_path, capsys):
    good = write_piece(tmp_path / "cb_rte", ["cb", "rte"])
    overlapping = write_piece(tmp_path / "rte", ["rte"])
    other_budget = write_piece(tmp_path / "copa", ["copa"], extra_overrides=("job.train.max_steps=300",))
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "learning.json").write_text("{not json")
    missing = tmp_path / "missing"
    wrong_kind = tmp_path / "step_cost"
    wrong_kind.mkdir()
    (wrong_kind / "learning.json").write_text(json.dumps({"name": "step_cost"}))
    out = tmp_path / "merged"

    code = learning_merge.main([str(p) for p in (good, overlapping, other_budget, corrupt, missing, wrong_kind)]
                               + ["--out", str(out)])

    error = capsys.readouterr().err
    assert code == 2
    assert error.count("\n") == 1  # one paragraph
    assert "minilm/rte/capt/0 is in both" in error
    assert "job.train.max_steps=300" in error
    assert f"{corrupt / 'learning.json'}: not readable JSON" in error
    assert f"{missing / 'learning.json'}: no such file" in error
    assert "not a learning benchmark result (name 'step_cost')" in error
    assert not out.exists()


def test_out_may_not_be_a_piece_and_a_skipped_run_is_refused(tmp_path):
    piece = write_piece(tmp_path / "cb_rte", ["cb", "rte"])
    before = (piece / "learning.json").read_text()
    skipped = tmp_path / "skipped"
    save_result(BenchResult("learning", learning.TITLE, learning.settings(quick=False), skipped="no data"),
                skipped)

    with pytest.raises(learning_merge.MergeError) as err:
        learning_merge.merge([piece, skipped], piece)

    assert "is one of the pieces" in str(err.value) and "did not finish (no data)" in str(err.value)
    assert not (piece / "report.md").exists()
    assert (piece / "learning.json").read_text() == before
    assert json.loads(before)["name"] == "learning"


def write_selected_piece(folder: Path, methods: dict[str, dict[str, tuple[float, float]]],
                         levels: tuple[float, float] | None = None, trained: dict | None = None,
                         started: str = "2026-11-30T00:00:00+00:00") -> Path:
    """A CB piece split by method rows: method -> select label -> (validation, test) of each of 3 seeds; with
    `levels`, the trials carry the job's (majority, chance) test scores, seed added, as newer pieces do; with
    `trained`, the training settings every trial records."""
    rows = [{"task": "cb", "model": "minilm", "method": method, "seed": seed, "select": label,
             "test_score": test + seed, "test_accuracy": test + 10 + seed, "best_validation_score": validation + seed,
             **({"majority": levels[0] + seed, "chance": levels[1] + seed} if levels else {}), "steps": 150,
             **({"settings": trained} if trained else {})}
            for method, by_label in methods.items() for label, (validation, test) in by_label.items()
            for seed in range(3)]
    row_override = "methods=[" + ", ".join(f"{{name: {m}}}" for m in methods) + "]"
    settings = {**learning.settings(quick=False), "overrides": ["tasks=[cb]", row_override]}
    result = BenchResult("learning", learning.TITLE, settings, started=started, duration_s=60.0)
    result.tables.append(Table(learning_merge.TRIALS_TABLE, list(rows[0]), rows))
    save_result(result, folder)
    return folder


def test_pieces_split_by_method_rows_keep_only_the_value_chosen_on_validation(tmp_path):
    # capt's best validation (lr 0.1) is not its best test (lr 0.3): the table must show lr 0.1's test scores.
    first = write_selected_piece(tmp_path / "capt", {"capt": {"optim.lr=0.1": (70.0, 50.0),
                                                              "optim.lr=0.3": (60.0, 90.0)}})
    second = write_selected_piece(tmp_path / "lora", {"lora": {"optim.lr=0.0001": (55.0, 40.0),
                                                               "optim.lr=0.002": (65.0, 45.0)}})
    out = tmp_path / "merged"

    assert learning_merge.main([str(first), str(second), "--out", str(out)]) == 0

    text = (out / "report.md").read_text()
    assert table_row(text, "capt")[0].startswith("51.00 ± 1.00") and "optim.lr=0.1" in table_row(text, "capt")[0]
    assert table_row(text, "lora")[0].startswith("46.00 ± 1.00") and "optim.lr=0.002" in table_row(text, "lora")[0]
    assert "91.00" not in text and "41.00" not in text  # unchosen values' test scores never appear
    accuracy = text[text.index("test_accuracy"):]
    assert table_row(accuracy, "capt")[0].startswith("61.00 ± 1.00") and "101.00" not in accuracy


def test_rows_without_a_select_label_are_told_apart_by_their_lrs():
    old = [{"lr": 0.03, "head_lr": 0.01}, {"lr": 0.1, "head_lr": 0.01}, {"select": "", "lr": 0.3}]
    assert [learning_merge.combination(row) for row in old] == ["lr=0.03,head_lr=0.01", "lr=0.1,head_lr=0.01", ""]


def test_the_trials_reference_levels_become_the_score_tables_majority_and_chance_rows(tmp_path):
    old = write_selected_piece(tmp_path / "capt", {"capt": {"optim.lr=0.1": (70.0, 50.0)}})  # rows without levels
    new = write_selected_piece(tmp_path / "lora", {"lora": {"optim.lr=0.002": (65.0, 45.0)}}, levels=(36.0, 31.0))
    out = tmp_path / "merged"

    assert learning_merge.main([str(old), str(new), "--out", str(out)]) == 0

    text = (out / "report.md").read_text()
    score, accuracy = text[:text.index("test_accuracy`:")], text[text.index("test_accuracy`:"):]
    assert table_row(score, "majority class")[0] == "37.00 ± 1.00"  # once per seed, not once per method row
    assert table_row(score, "chance")[0] == "32.00 ± 1.00"
    assert "| majority class |" not in accuracy and "| chance |" not in accuracy  # levels are task scores


def test_cells_trained_under_other_settings_are_a_row_of_their_own(tmp_path):
    """CB and RTE re-run under new defaults, COPA kept from an older piece: COPA's cells are marked, not averaged."""
    new = {"optim": {"name": "adamw", "lr": 0.01, "weight_decay": 1e-5, "schedule": "constant"}, "batch_size": 8}
    old = {"optim": {"name": "adamw", "lr": 0.03, "weight_decay": 0.0, "schedule": "linear"}, "batch_size": 32}
    first = write_piece(tmp_path / "new", ["cb", "rte"], trained={"capt": new}, started="2026-12-06T00:00:00+00:00")
    second = write_piece(tmp_path / "old", ["copa"], trained={"capt": old})
    text = learning_merge.merge([first, second], tmp_path / "merged")
    tasks = table_row(text, "method")[:-1]
    assert table_row(text, "capt")[tasks.index("copa")] == "-" and table_row(text, "capt")[tasks.index("cb")] != "-"
    marked = table_row(text, "capt †")
    assert marked[tasks.index("copa")] == "54.00 ± 3.46" and marked[tasks.index("cb")] == "-"
    assert "† Cells of capt trained under other settings" in text
    assert "lora †" not in text, "a method no piece records settings for is not marked"


def test_a_cell_re_run_under_new_settings_is_chosen_apart_from_its_older_trials(tmp_path):
    """CB re-run under new defaults beside the older CB piece: the older trials' better validation score must not
    take the method's selection from the re-run (each is chosen on validation within its own settings)."""
    new = {"optim": {"name": "adamw", "lr": 0.01, "weight_decay": 1e-5}, "batch_size": 16}
    old = write_selected_piece(tmp_path / "old", {"capt": {"optim.lr=0.1": (80.0, 50.0),  # rows without settings
                                                           "optim.lr=0.01": (50.0, 30.0)}})
    rerun = write_selected_piece(tmp_path / "new", {"capt": {"optim.lr=0.01": (60.0, 70.0),
                                                             "optim.lr=0.03": (55.0, 90.0)}}, trained=new,
                                 started="2026-12-07T00:00:00+00:00")
    with pytest.raises(learning_merge.MergeError, match="is in both"):  # the same settings twice: a duplicate
        learning_merge.merge([old, write_selected_piece(tmp_path / "again", {"capt": {"optim.lr=0.1": (1.0, 1.0)}})],
                             tmp_path / "refused")
    text = learning_merge.merge([old, rerun], tmp_path / "merged")
    score = text[:text.index("test_accuracy`:")]
    assert table_row(score, "capt")[0].startswith("71.00 ± 1.00") and "optim.lr=0.01" in table_row(score, "capt")[0]
    assert table_row(score, "capt †")[0].startswith("51.00 ± 1.00")
