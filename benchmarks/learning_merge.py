"""One learning table from a grid run in pieces: the `learning.json` of several `--only learning` runs.

    python -m benchmarks.learning_merge benchmarks/results/learning_3seeds/cb_rte \\
        benchmarks/results/learning_3seeds/copa_wic_boolq --out benchmarks/results/learning_3seeds

The pieces differ only in their `tasks=[...]` and `methods=[...]` overrides. Per (model, task, method) the `select:`
combination with the best mean validation score is kept (`pipelines.sweeps.select.chosen_labels`) and tabulated
with `pipelines.report`'s functions: the table `python -m pipelines.report` would print for one sweep over the union.
Every problem (other shared settings, a trial in two pieces) is reported at once and nothing is written. Cells
trained under other settings than their method's newest piece are a row of their own, marked "†".
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from pathlib import Path
from typing import Any

from benchmarks.learning import REFERENCE_LEVELS  # pieces written before trial rows carried them have none

logger = logging.getLogger(__name__)

TRIALS_TABLE = "Every trial"
REPORT = "report.md"
PLOT = "report.png"


class MergeError(ValueError):
    """The pieces cannot be merged; the message lists every problem."""


def read_piece(folder: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(the learning result of `folder`, None) or (None, why it cannot be used)."""
    path = folder / "learning.json"
    try:
        result = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None, f"{path}: no such file (run `python -m benchmarks.run --only learning --out {folder}`)"
    except (OSError, json.JSONDecodeError) as err:
        return None, f"{path}: not readable JSON ({err})"
    name = result.get("name") if isinstance(result, dict) else type(result).__name__
    if name != "learning":
        return None, f"{path}: not a learning benchmark result (name {name!r})"
    if result.get("skipped") or result.get("error"):
        return None, f"{path}: the run did not finish ({result.get('skipped') or result.get('error')})"
    if trials_table(result) is None:
        return None, f"{path}: has no {TRIALS_TABLE!r} table"
    return result, None


def trials_table(result: dict[str, Any]) -> dict[str, Any] | None:
    """The result's "Every trial" table (title, columns, rows), or None."""
    return next((t for t in result.get("tables", []) if t.get("title") == TRIALS_TABLE), None)


PARTITION_OVERRIDES = ("tasks=", "methods=")
"""Overrides that split the grid into pieces; every other override must be the same in every piece."""


def shared_settings(result: dict[str, Any]) -> tuple[str, tuple[str, ...]]:
    """(sweep config, overrides other than tasks and methods): what every piece must have in common."""
    settings = result.get("settings", {})
    overrides = tuple(o for o in settings.get("overrides", []) if not o.startswith(PARTITION_OVERRIDES))
    return settings.get("config", ""), overrides


def trial_rows(folder: Path, result: dict[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """The piece's trials as report rows (model, task, method, seed, value) and any problems."""
    from benchmarks.common import REPO
    from pipelines.config.sources import merge_sources

    rows, problems = [], []
    models = None  # the base models the piece's sweep ran, read only for rows written before rows named their model
    for row in trials_table(result)["rows"]:
        if not row.get("model") and models is None:
            config, overrides = shared_settings(result)
            models = list(merge_sources(REPO / config, list(overrides), None).get("models") or [])
        model = row.get("model") or (models[0] if len(models) == 1 else None)
        if model is None:
            problems.append(f"{folder}: a row names no model and the config has models {models}")
            break
        if row.get("test_score") is not None:
            rows.append({"model": model, "task": row["task"], "method": row["method"], "seed": str(row["seed"]),
                         "select": combination(row), "value": float(row["test_score"]),
                         "accuracy": row.get("test_accuracy"),
                         "validation": row.get("best_validation_score"), "piece": str(folder),
                         "started": result.get("started") or "", "settings": _settings_key(row.get("settings")),
                         **{level: math.nan if row.get(level) is None else float(row[level])
                            for level in REFERENCE_LEVELS}})
    return rows, problems


def _settings_key(settings: dict[str, Any] | None) -> str | None:
    """A trial's recorded training settings without the learning rates (which `select:` varies), as one comparable
    text; None for rows written before trials recorded them."""
    if not settings:
        return None
    optim = {k: v for k, v in (settings.get("optim") or {}).items() if k not in ("lr", "head_lr")}
    return json.dumps({**settings, "optim": optim}, sort_keys=True)


OTHER_SETTINGS = " †"  # appended to a method's label for cells trained under other settings than its newest piece's


def mark_other_settings(rows: list[dict[str, Any]]) -> list[str]:
    """Label each row whose settings differ from those of its method's newest piece that records them (or that
    records none while that piece does) as its own method row (`OTHER_SETTINGS`); the methods so marked."""
    newest: dict[str, dict[str, Any]] = {}
    for row in rows:
        if row["settings"] is not None and row["started"] >= newest.get(row["method"], {}).get("started", ""):
            newest[row["method"]] = row
    marked = set()
    for row in rows:
        reference = newest.get(row["method"])
        if reference is not None and row["settings"] != reference["settings"]:
            marked.add(row["method"])
            row["method"] += OTHER_SETTINGS
    return sorted(marked)


def combination(row: dict[str, Any]) -> str:
    """The row's `select:` label; rows written before trials carried it are told apart by their resolved lrs."""
    if "select" in row:
        return row["select"] or ""
    return ",".join(f"{key}={row[key]}" for key in ("lr", "head_lr") if row.get(key) is not None)


def collect(folders: list[Path],
            out: Path | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str]]:
    """(every piece's result, the rows of each (model, task, method)'s combination with the best mean validation
    score, the methods marked `OTHER_SETTINGS`); raises MergeError listing every problem. Rows are marked before the
    choice, so trials under other settings are chosen among themselves."""
    from pipelines.sweeps.select import chosen_labels

    results, rows, problems = [], [], []
    for folder in folders:
        if out is not None and folder.resolve() == out.resolve():
            problems.append(f"--out {out} is one of the pieces: its own report.md would be overwritten")
        result, problem = read_piece(folder)
        if problem:
            problems.append(problem)
            continue
        results.append((folder, result))
        piece_rows, piece_problems = trial_rows(folder, result)
        rows += piece_rows
        problems += piece_problems
    settings = {shared_settings(r) for _, r in results}
    if len(settings) > 1:
        problems.append("the pieces differ in more than their tasks and methods: " + "; ".join(
            f"{folder}: config {shared_settings(r)[0]}, other overrides {list(shared_settings(r)[1])}"
            for folder, r in results))
    problems += duplicate_trials(rows)
    if problems:
        raise MergeError("Cannot merge the learning results: " + "; ".join(problems) + ".")
    marked = mark_other_settings(rows)
    chosen = chosen_labels(rows, label="select")  # {(model, task, method): its best combination}
    kept = [r for r in rows if chosen.get((r["model"], r["task"], r["method"]), r["select"]) == r["select"]]
    return [r for _, r in results], kept, marked


def duplicate_trials(rows: list[dict[str, Any]]) -> list[str]:
    """One problem per (model, task, method, seed, combination) that two pieces both ran under the same recorded
    settings (a re-run under other settings is a trial of its own: its cells are marked, `mark_other_settings`)."""
    seen: dict[tuple[str, ...], str] = {}
    problems = []
    for row in rows:
        key = (row["model"], row["task"], row["method"], row["seed"], *filter(None, [row["select"], row["settings"]]))
        if key in seen and seen[key] != row["piece"]:
            problems.append(f"{'/'.join(key)} is in both {seen[key]} and {row['piece']}")
        seen.setdefault(key, row["piece"])
    return problems


def sources_text(folders: list[Path], results: list[dict[str, Any]]) -> str:
    """A Markdown list of the pieces: folder, date, duration, overrides and trial count."""
    lines = ["## Pieces", ""]
    for folder, result in zip(folders, results, strict=True):
        table = trials_table(result)
        overrides = result.get("settings", {}).get("overrides", [])
        lines.append(f"- `{folder}`: run {result.get('started', '?')}, {result.get('duration_s', 0):.0f} s, "
                     f"{len(table['rows'])} trials, overrides {overrides or 'none'}")
    return "\n".join(lines)


def merge(folders: list[Path], out: Path) -> str:
    """Write `out/report.md` and `out/report.png` for the pieces in `folders`; returns the Markdown."""
    import pandas as pd

    from pipelines.reporting import build_tables, markdown, plot

    results, rows, marked = collect(folders, out)
    tables = build_tables(pd.DataFrame(rows))
    config = shared_settings(results[0])[0]
    text = markdown(tables, "test_score", f"{config}, merged from {len(folders)} benchmark run(s): test_score")
    accuracy = [{**row, "value": float(row["accuracy"]), **dict.fromkeys(REFERENCE_LEVELS, math.nan)}
                for row in rows if row.get("accuracy") is not None]  # the levels are task scores, not accuracy
    if accuracy:  # the same chosen trials' accuracy (pieces written before trials carried it have none)
        text += "\n" + markdown(build_tables(pd.DataFrame(accuracy)), "test_accuracy", "The same trials: test_accuracy")
    if marked:
        text += (f"\n{OTHER_SETTINGS.strip()} Cells of {', '.join(marked)} trained under other settings than the "
                 "method's newest piece (optimiser, schedule, batch, epochs or options differ, or were not recorded): "
                 "a row of their own, not averaged with the newer cells (README, \"Baseline settings and their "
                 "sources\").\n")
    text += "\n" + sources_text(folders, results) + f"\n\n![{PLOT}]({PLOT})\n"
    out.mkdir(parents=True, exist_ok=True)
    (out / REPORT).write_text(text, encoding="utf-8")
    plot(tables, "test_score", out / PLOT)
    return text


def main(argv: list[str] | None = None) -> int:
    """CLI: merge the pieces, print the table; exit 2 with one paragraph when they cannot be merged."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.learning_merge", description=__doc__.split("\n")[0])
    parser.add_argument("pieces", nargs="+", type=Path, help="folders holding a learning.json each")
    parser.add_argument("--out", type=Path, required=True, help=f"folder for {REPORT} and {PLOT}")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        text = merge(args.pieces, args.out)
    except MergeError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(text)
    logger.info("wrote %s and %s", args.out / REPORT, args.out / PLOT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
