"""The README's library example runs as written."""

from __future__ import annotations

import re
from pathlib import Path

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
    from pipelines.config.optim_defaults import optim_default

    default = optim_default("capt", "t5")
    assert type(optimizer).__name__.lower() == default.optimizer
    group = optimizer.param_groups[0]
    assert group["lr"] == default.lr
    if default.optimizer == "adafactor":
        assert not group["relative_step"] and not group["scale_parameter"]
