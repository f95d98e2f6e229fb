"""`write_atomically`: a writer that fails midway leaves the old file whole and no temporary file behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from capt.atomic import write_atomically


def test_text_bytes_and_writer_functions_replace_the_file(tmp_path):
    target = tmp_path / "result.json"
    write_atomically(target, "first")
    write_atomically(target, b"second")
    assert target.read_text() == "second"
    write_atomically(target, lambda path: Path(path).write_text("third"))
    assert target.read_text() == "third"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["result.json"]


def test_a_failing_writer_keeps_the_old_file(tmp_path):
    target = tmp_path / "capsule.json"
    target.write_text("old")

    def crash(path: str) -> None:
        Path(path).write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomically(target, crash)
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["capsule.json"]
