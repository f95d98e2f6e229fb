"""The report's reference rows: what every method's test score is measured against, and generated data.

Each job measures them on its own test split (`capt.tasks.levels`, `pipelines.train`) and logs them with its
run: the majority class (``test_majority_score``), chance (``test_chance_score``) and, with
`train.score_untrained`, the same model before its first training step (``test_untrained_score``). The report
shows the majority class and chance as rows above the methods (and as lines in the picture), and each
method's untrained score as a row ``<method> (untrained)`` right above the method.
"""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd

MAJORITY, CHANCE = "majority class", "chance"
UNTRAINED = " (untrained)"
"""Suffix of a method's untrained row."""
LEVEL_METRICS = {"majority": "test_majority_score", "chance": "test_chance_score", "untrained": "test_untrained_score"}
"""Frame column -> the run metric it is read from (all on the test split)."""
LEVELS_METRIC = "test_score"
"""The reported metric the levels are comparable with (task scores on the test split)."""
GENERATED = "generated"
"""Run tag ``data`` of a run on data the project generated (`capt.tasks.generated`)."""
LEVELS_NOTE = (f"Reference rows, measured by every job on its own test split: *{MAJORITY}*: always predicting the "
               f"most frequent training label; *{CHANCE}*: uniform random guessing (mean of 200 draws); "
               f"*<method>{UNTRAINED}*: the same model before its first training step (`train.score_untrained`).")
GENERATED_NOTE = ("Columns marked (generated): data made by `capt/tasks/generated.py`, whose labels follow a simple "
                  "rule stated there. It checks that the pipeline learns; it is not benchmark data and these scores "
                  "are no result.")


def is_reference(method: str) -> bool:
    """Whether a table row is a reference level rather than a method's result."""
    return method in (MAJORITY, CHANCE)


def with_reference_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` (one row per run) plus the reference rows: majority class and chance once per (model, task, seed),
    untrained once per run that measured it, each with its level as ``value``."""
    extra = []
    for column, label in (("majority", MAJORITY), ("chance", CHANCE)):
        if column in frame:
            part = frame.dropna(subset=[column]).drop_duplicates(["model", "task", "seed"])
            extra.append(part.assign(method=label, value=part[column], select=""))
    if "untrained" in frame:
        part = frame.dropna(subset=["untrained"])
        extra.append(part.assign(method=part["method"] + UNTRAINED, value=part["untrained"], select=""))
    extra = [e for e in extra if not e.empty]
    return pd.concat([frame, *extra], ignore_index=True) if extra else frame


def row_order(methods: Iterable[str], preferred: Iterable[str]) -> list[str]:
    """Reference levels first, then the methods in `preferred` order (others sorted), each method's untrained row
    right above it."""
    methods = set(methods)
    results = {m for m in methods if not is_reference(m) and not m.endswith(UNTRAINED)}
    ordered = [m for m in preferred if m in results] + sorted(results - set(preferred))
    rows = [m for m in (MAJORITY, CHANCE) if m in methods]
    for method in ordered:
        rows += [m for m in (method + UNTRAINED, method) if m in methods]
    return rows + sorted(methods - set(rows))  # an untrained row whose method has no result of its own


def generated_tasks(part: pd.DataFrame) -> list[str]:
    """Tasks of `part` with at least one run on generated data (run tag ``data``)."""
    if "data" not in part:
        return []
    return sorted(set(part.loc[part["data"] == GENERATED, "task"]))


def column_label(column: str, table: pd.DataFrame) -> str:
    """A table or chart column as shown: its label in the table's ``attrs["labels"]`` (the SuperGLUE average of a
    partial task set says how many tasks it covers), a task marked when its data was generated."""
    if column in table.attrs.get("labels", {}):
        return table.attrs["labels"][column]
    return f"{column} ({GENERATED})" if column in set(table.attrs.get("generated", ())) else column
