"""The README's library example runs as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_python_example_runs(tmp_path, monkeypatch, capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README must contain the library example"
    monkeypatch.chdir(tmp_path)
    exec(compile(blocks[0], str(README), "exec"), {"__name__": "readme_example"})
    assert (tmp_path / "capsules" / "rte" / "capsule.safetensors").is_file()
    assert "tensor(" in capsys.readouterr().out
    assert len([line for line in blocks[0].splitlines() if line.strip()]) <= 12
