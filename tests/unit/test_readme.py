"""The README's library example runs as written, and its Layout names every room of the code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_python_example_runs(tmp_path, monkeypatch, capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README must contain the library example"
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "readme_example"}
    exec(compile(blocks[0], str(README), "exec"), namespace)
    assert (tmp_path / "capsules" / "rte" / "capsule.safetensors").is_file()
    assert "tensor(" in capsys.readouterr().out
    assert len([line for line in blocks[0].splitlines() if line.strip()]) <= 12
    _uses_the_table_optimizer(namespace["optimizer"])


def _uses_the_table_optimizer(optimizer) -> None:
    """The example's optimiser is the defaults table's for CaPT on T5, with the paper's fixed-lr settings."""
    from capt.methods import optim_default

    default = optim_default("capt", "t5")
    assert type(optimizer).__name__.lower() == default.optimizer
    group = optimizer.param_groups[0]
    assert group["lr"] == default.lr
    if default.optimizer == "adafactor":
        assert not group["relative_step"] and not group["scale_parameter"]


def _layout_block() -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Layout"):]
    return section[section.index("```"):section.index("```", section.index("```") + 3)]


@pytest.mark.parametrize("package", ["capt", "pipelines"])
def test_the_readme_layout_names_every_room(package):
    block = _layout_block()
    rooms = [p.name for p in (ROOT / package).iterdir()
             if p.name not in ("__init__.py", "__pycache__") and (p.is_dir() or p.suffix == ".py")]
    missing = [room for room in rooms if (room + "/" if (ROOT / package / room).is_dir() else room) not in block]
    assert not missing, f"README's Layout does not name {package}/{missing}"


def test_the_readme_sends_no_reader_outside_the_repository():
    text = (ROOT / "README.md").read_text()
    assert "../" not in text, "a reader without the workspace cannot follow a link outside the repository"
