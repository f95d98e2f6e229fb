"""The page-fault benchmark runs end to end at a tiny size and reports each setting in a process of its own."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `benchmarks` is a top-level folder, not an installed package
    sys.path.insert(0, str(ROOT))

import pytest  # noqa: E402

from benchmarks import page_faults  # noqa: E402


@pytest.mark.slow  # four processes that import torch and transformers
def test_each_setting_is_measured_in_its_own_process_and_tabulated(capsys) -> None:
    assert page_faults.main(["--batches", "2", "--tokens", "8", "--steps", "1", "--layers", "1",
                             "--where", "thread", "main"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [line.split(" | ") for line in lines[2:]]
    assert [(r[1], r[2]) for r in rows] == [("thread", "default"), ("thread", "keep mapped"),
                                            ("main", "default"), ("main", "keep mapped")]
    assert all(r[0] == "| 2 x 8" and float(r[3]) >= 0 and float(r[4]) >= 0 for r in rows)
