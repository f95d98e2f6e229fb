"""The README's demo table is what `make demo` prints: the `smoke_sweep` fixture runs the demo's sweep as on a fresh
machine (generated data), and its printed rows must be the README's, and the prose beside the table must quote
the MiniLM rows. When the demo's numbers change, the failure shows the rows to paste."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]
README = Path(__file__).resolve().parents[2] / "README.md"
ROW = re.compile(r"^(task|cb|rte) +(model|minilm|tiny-t5) +(method|capt) ")
COLUMNS = ("task", "model", "method", "seed", "data", "majority", "chance", "untrained", "valid", "test", "status")
PROSE = re.compile(r"goes from its untrained (?P<cb_untrained>[\d.]+) to (?P<cb_test>[\d.]+) on\s+CB .*?majority class "
                   r"(?P<cb_majority>[\d.]+)\) and from (?P<rte_untrained>[\d.]+) to (?P<rte_test>[\d.]+) on RTE "
                   r".*?majority class (?P<rte_majority>[\d.]+)\)", re.S)


def _demo_block(readme: str) -> str:
    """The fenced block after "What `make demo` shows" that holds the printed table."""
    section = readme.split("**What `make demo` shows.**", 1)[1]
    return section.split("```", 2)[1]


def _rows(text: str) -> list[str]:
    return [line.rstrip() for line in text.splitlines() if ROW.match(line)]


def test_the_readme_demo_table_is_what_the_demo_prints(smoke_sweep: dict[str, Any]) -> None:
    printed = _rows(smoke_sweep["stdout"])
    assert len(printed) == 5, smoke_sweep["stdout"][-3000:]  # the header and four trials
    quoted = _rows(_demo_block(README.read_text()))
    assert quoted == printed, "README.md's demo table differs from what the demo printed; paste:\n" + "\n".join(printed)


def test_the_readme_prose_quotes_the_demo_table() -> None:
    readme = README.read_text()
    table = {(row["task"], row["model"]): row
             for row in (dict(zip(COLUMNS, line.split(), strict=True)) for line in _rows(_demo_block(readme))[1:])}
    found = PROSE.search(" ".join(readme.split()))
    assert found, "the prose after the demo table no longer quotes the MiniLM scores in the expected words"
    for key, value in found.groupdict().items():
        task, column = key.split("_")
        row = table[(task, "minilm")]
        assert row[column] == value, f"the prose says {key} {value}; the table's row: {row}"


def _serving_example(readme: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The README's serving example: the request body its curl line sends and the answer it shows."""
    block = readme.split("## Serving", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    body = re.search(r"-d '(\{.*\})'", block)
    shown = re.search(r"^# (\{\"task\".*\})$", block, re.M)
    assert body and shown, "the README's serving example no longer has a curl body and an answer line"
    return json.loads(body.group(1)), json.loads(shown.group(1))


def test_the_readme_serving_example_is_what_the_demos_champion_answers(smoke_sweep: dict[str, Any],
                                                                       tmp_path: Path) -> None:
    """The answer the README shows for its curl line is the serving engine's for the demo's tiny-t5 RTE champion
    (the replica's engine, fed from the registry as `python -m pipelines.serve` feeds it), scores as rounded there."""
    from pipelines.serving.app import answer_body
    from pipelines.serving.engine import CapsuleEngine
    from pipelines.serving.source import RegistrySource

    request, shown = _serving_example(README.read_text())
    source = RegistrySource(smoke_sweep["uri"], "tiny-t5", "champion", tmp_path)
    [version] = source.check([request["task"]]).values()
    engine = CapsuleEngine([source.fetch(request["task"], version)])
    [answer] = engine.answer([(request["task"], engine.examples(request["task"], request["inputs"]))])
    answered = answer_body(request["task"], answer)
    answered["scores"] = [[round(s, 2) for s in row] for row in answered["scores"]]
    assert shown == answered, f"README.md's serving answer differs; paste:\n# {json.dumps(answered)}"
