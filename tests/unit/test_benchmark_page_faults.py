"""The page-fault benchmark runs end to end at a tiny size and reports each setting in a process of its own."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `benchmarks` is a top-level folder, not an installed package
    sys.path.insert(0, str(ROOT))

import pytest  # noqa: E402

from benchmarks import page_faults  # noqa: E402


@pytest.mark.slow  # three processes that import torch and transformers
def test_each_setting_is_measured_in_its_own_process_and_tabulated(capsys) -> None:
    assert page_faults.main(["--batches", "2", "--tokens", "8", "--steps", "1", "--layers", "1",
                             "--where", "thread"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [line.split(" | ") for line in lines[2:]]
    assert [(r[1], r[2]) for r in rows] == [("thread", setting) for setting in page_faults.SETTINGS]
    assert all(r[0] == "| 2 x 8" and float(r[3]) >= 0 and float(r[4]) >= 0 for r in rows)


def test_the_readme_table_is_the_shipped_output() -> None:
    """benchmarks/README.md quotes `python -m benchmarks.page_faults --where thread main` as it printed it."""
    shipped = (ROOT / "benchmarks/results/page_faults.md").read_text(encoding="utf-8").strip()
    assert shipped.startswith("| batch | where | glibc |") and len(shipped.splitlines()) == 14
    assert shipped in (ROOT / "benchmarks/README.md").read_text(encoding="utf-8")
