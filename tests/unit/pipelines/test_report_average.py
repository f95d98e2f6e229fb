"""The report's SuperGLUE average says how many of the six tasks it covers when it misses some, and the footer
states the seeds per cell as one number when every cell has the same."""

from __future__ import annotations

from pathlib import Path

from capt.tasks.registry import SUPERGLUE_TASKS
from pipelines.reporting import AVERAGE, build_tables, column_label, markdown, run_frame, write_report


def _run(task: str, method: str, seed: int, value: float) -> dict:
    return {"run_id": f"{task}-{method}-{seed}", "status": "FINISHED",
            "metrics": {"test_score": value, "best_validation_score": value},
            "tags": {"task": task, "method": method, "seed": str(seed), "model": "minilm", "data": "real"}}


def _header(text: str) -> list[str]:
    line = next(line for line in text.splitlines() if line.startswith("| method |"))
    return [cell.strip() for cell in line.strip("|").split("|")][1:]


def test_an_average_over_part_of_superglue_is_headed_with_how_many_tasks(tmp_path: Path) -> None:
    runs = [_run("cb", "capt", 0, 90.0), _run("rte", "capt", 0, 70.0), _run("rte", "lora", 0, 60.0)]
    text, _, _ = write_report(runs, "partial", tmp_path)
    assert _header(text) == ["cb", "rte", f"SuperGLUE avg (2 of {len(SUPERGLUE_TASKS)} tasks)"]
    assert "| capt | 90.00 | 70.00 | 80.00 |" in text
    assert "| lora | - | 60.00 | 60.00* |" in text, "a method missing one of the table's tasks keeps its own mark"
    table = build_tables(run_frame(runs, "test_score"))["minilm"]
    assert column_label(AVERAGE, table) == "SuperGLUE avg (2 of 6 tasks)", "the picture's axis says it too"


def test_an_average_over_all_six_tasks_is_plain() -> None:
    runs = [_run(task, "capt", 0, 50.0 + i) for i, task in enumerate(SUPERGLUE_TASKS)]
    text = markdown(build_tables(run_frame(runs, "test_score")), "test_score", "title")
    assert _header(text)[-1] == AVERAGE == "SuperGLUE avg"
    assert len(SUPERGLUE_TASKS) == 6


def test_seeds_per_cell_is_one_number_when_every_cell_has_the_same() -> None:
    one_each = [_run("cb", "capt", 0, 90.0), _run("rte", "capt", 0, 70.0)]
    text = markdown(build_tables(run_frame(one_each, "test_score")), "test_score", "title")
    assert "Seeds per cell: 1." in text and "1-1" not in text
    uneven = [*one_each, _run("rte", "capt", 1, 72.0)]
    text = markdown(build_tables(run_frame(uneven, "test_score")), "test_score", "title")
    assert "Seeds per cell: 1-2." in text
