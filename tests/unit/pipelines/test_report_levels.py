"""`pipelines.report` sets every method beside the majority class, chance and its untrained self, and marks
generated data in the table, the title and the picture."""

from __future__ import annotations

from pathlib import Path

from pipelines.reporting import write_report

LEVELS = {"cb": (40.0, 30.0), "rte": (56.0, 50.0)}
"""Task -> (majority class, chance) as the jobs measured them on the test split."""


def _run(task: str, method: str, seed: int, test: float, untrained: float | None = None,
         data: str = "generated") -> dict:
    majority, chance = LEVELS[task]
    metrics = {"test_score": test, "best_validation_score": test, "test_majority_score": majority,
               "test_chance_score": chance, **({} if untrained is None else {"test_untrained_score": untrained})}
    return {"run_id": f"{task}-{method}-{seed}", "status": "FINISHED", "metrics": metrics,
            "tags": {"task": task, "method": method, "seed": str(seed), "model": "minilm", "data": data}}


RUNS = [_run("cb", "capt", 0, 80.0, untrained=20.0), _run("cb", "capt", 1, 90.0, untrained=22.0),
        _run("rte", "capt", 0, 95.0, untrained=48.0, data="real"), _run("cb", "lora", 0, 70.0)]


def _row(text: str, label: str) -> list[str]:
    line = next(line for line in text.splitlines() if line.startswith(f"| {label} |"))
    return [cell.strip() for cell in line.strip("|").split("|")][1:]


def test_the_report_has_majority_chance_and_untrained_rows_and_marks_generated_data(tmp_path: Path) -> None:
    text, md_path, png_path = write_report(RUNS, "capt-demo", tmp_path)
    assert md_path.read_text().strip() == text.strip()
    assert text.startswith("# capt-demo: test_score (generated data, not benchmark results)")
    assert "| method | cb (generated) | rte | SuperGLUE avg (2 of 6 tasks) |" in text
    assert "not benchmark data" in text and "majority class" in text and "uniform random guessing" in text
    assert _row(text, "majority class") == ["40.00 ± 0.00", "56.00", "48.00"]
    assert _row(text, "chance") == ["30.00 ± 0.00", "50.00", "40.00"]
    assert _row(text, "capt (untrained)") == ["21.00 ± 1.41", "48.00", "34.50"]
    assert _row(text, "capt") == ["85.00 ± 7.07", "95.00", "90.00"]
    order = [line.split("|")[1].strip() for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    assert order[order.index("method") + 1:] == ["majority class", "chance", "lora", "capt (untrained)", "capt"]
    assert png_path == tmp_path / "report.png" and png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_levels_are_test_split_scores_so_other_metrics_get_no_reference_rows(tmp_path: Path) -> None:
    real = [{**run, "tags": {**run["tags"], "data": "real"}} for run in RUNS]
    text, _, _ = write_report(real, "capt-real", tmp_path, metric="best_validation_score")
    assert "majority class" not in text and "(untrained)" not in text and "(generated)" not in text
    assert text.startswith("# capt-real: best_validation_score\n")


def test_every_registered_method_is_a_row_in_the_paper_order(tmp_path: Path) -> None:
    from pipelines.config.schema import METHOD_NAMES
    from pipelines.reporting import METHOD_ORDER

    assert sorted(METHOD_ORDER) == sorted(METHOD_NAMES), "every registered method has its place in the table"
    runs = [_run("cb", method, 0, 50.0 + i) for i, method in enumerate(reversed(METHOD_NAMES))]
    text, _, _ = write_report(runs, "all-methods", tmp_path)
    rows = [line.split("|")[1].strip() for line in text.splitlines() if line.startswith("| ")][1:]
    methods = [row for row in rows if row in METHOD_NAMES]
    assert methods == list(METHOD_ORDER)
