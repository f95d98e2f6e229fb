"""The README's `make demo-llm` table is the shipped run's output (benchmarks/results/demo_llm/), and that run's own
result.json (intact: its result_digest holds) gives every number in it. The demo takes 10-15 minutes on 2 CPUs, too
long for CI, so CI checks the shipped run instead of running it again."""

from __future__ import annotations

import json
import re
from pathlib import Path

from pipelines.training.outputs import RESULT_DIGEST_KEY, result_digest

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "benchmarks" / "results" / "demo_llm"


def _table(text: str) -> list[str]:
    """The closing table's header and rows, as printed."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("task ") and "untrained" in line)
    rows = []
    for line in lines[start:]:
        if not line.strip() or line.startswith(("majority:", "Summary:", "...")):
            break
        rows.append(line.rstrip())
    return rows


def test_the_readme_quotes_the_shipped_demo_llm_run_and_its_result_gives_every_number():
    printed = _table((SHIPPED / "output.txt").read_text())
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```\n(task .*?)```", readme[readme.index("make demo-llm"):], re.S)
    assert block and _table(block.group(1)) == printed
    result = json.loads((SHIPPED / "result.json").read_text())
    assert result[RESULT_DIGEST_KEY] == result_digest(result), "the shipped result.json was edited"
    metrics = result["metrics"]
    row = printed[2].split()
    assert row[:5] == [result["task"], result["model"], result["method"], str(result["seed"]), "real"]
    shown = dict(zip(["majority", "chance", "untrained", "valid", "test"], map(float, row[5:10]), strict=True))
    assert shown == {"majority": round(metrics["test_majority_score"], 1),
                     "chance": round(metrics["test_chance_score"], 1),
                     "untrained": round(metrics["test_untrained_score"], 1),
                     "valid": round(metrics["best_validation_score"], 1), "test": round(metrics["test_score"], 1)}
    assert result["model"] == "smollm2-135m" and result["trainable_parameters"] == 30 * 576
