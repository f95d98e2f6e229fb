"""Checks on raw rows and normalised splits; each failure is a `TaskDataError` naming file, row, field."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from capt.tasks.errors import TaskDataError
from capt.tasks.records import Example
from capt.tasks.registry import TaskSpec
from capt.tasks.splits import units


@dataclass(frozen=True)
class Where:
    """Location of one raw row: its file (or source description) and 1-based row number."""

    path: str
    """File path or a source description such as ``hub:aps/super_glue/rte[train]``."""
    row: int
    """1-based line number (jsonl) or row number (parquet, hub, generated)."""

    def error(self, problem: str, field: str | None = None) -> TaskDataError:
        """A `TaskDataError` at this location."""
        return TaskDataError(problem, path=self.path, row=self.row, field=field)


def _get(row: Mapping[str, Any], key: str, where: Where, name: str) -> Any:
    if not isinstance(row, Mapping):
        raise where.error(f"expected an object, got {type(row).__name__}", name.rpartition(".")[0] or None)
    if key not in row or row[key] is None:
        raise where.error("missing field", name)
    return row[key]


MAX_TEXT_CHARS = 100_000
"""Longest text field a row may have, in characters: five times the longest real one (a MultiRC paragraph, about
19,000 with its row). Tokenising grows memory with the text (a 100 MB row took gigabytes), so a longer text is
refused before it is tokenised, wherever it comes from: a data file, the hub, a pyfunc or HTTP request."""


def require_text(row: Mapping[str, Any], key: str, where: Where, name: str | None = None,
                 allow_empty: bool = False) -> str:
    """`row[key]` as a string (surrounding whitespace stripped), non-empty unless `allow_empty`, at most
    `MAX_TEXT_CHARS` long."""
    name = name or key
    value = _get(row, key, where, name)
    if not isinstance(value, str):
        raise where.error(f"expected a string, got {type(value).__name__} {_shown(value)}", name)
    if len(value) > MAX_TEXT_CHARS:
        raise where.error(f"a text of {len(value):,} characters; at most {MAX_TEXT_CHARS:,} (shorten or drop the "
                          "row)", name)
    if not value.strip() and not allow_empty:
        raise where.error("empty string", name)
    return value.strip()


def _shown(value: Any, limit: int = 80) -> str:
    """`repr(value)` cut to `limit` characters (a refused value may be megabytes long)."""
    text = repr(value) if not isinstance(value, list | dict) or len(value) < 1000 else f"<{len(value)} items>"
    return text if len(text) <= limit else text[:limit] + "..."


def require_id(row: Mapping[str, Any], key: str, where: Where, name: str | None = None) -> str:
    """`row[key]` as an id string: a non-negative int or a non-empty string."""
    name = name or key
    value = _get(row, key, where, name)
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise where.error(f"expected an int or string id, got {type(value).__name__}", name)
    if isinstance(value, int) and value < 0 or isinstance(value, str) and not value.strip():
        raise where.error(f"invalid id {_shown(value)}", name)
    return str(value).strip()


def require_list(row: Mapping[str, Any], key: str, where: Where, name: str | None = None) -> list[Any]:
    """`row[key]` as a non-empty list."""
    name = name or key
    value = _get(row, key, where, name)
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise where.error(f"expected a list, got {type(value).__name__}", name)
    if len(value) == 0:
        raise where.error("empty list", name)
    return list(value)


def require_mapping(row: Mapping[str, Any], key: str, where: Where,
                    name: str | None = None) -> Mapping[str, Any]:
    """`row[key]` as an object (dict)."""
    name = name or key
    value = _get(row, key, where, name)
    if not isinstance(value, Mapping):
        raise where.error(f"expected an object, got {type(value).__name__}", name)
    return value


def parse_label(spec: TaskSpec, value: Any, where: Where, name: str = "label") -> int:
    """A raw label as a label id.

    Accepted: a label name (``"entailment"``, ``"B"``), an int id in range (the hub's encoding; -1, the
    hub's unlabelled test marker, is rejected), or a bool for tasks labelled False/True.
    """
    if value is None:
        raise where.error("missing field", name)
    if isinstance(value, bool):
        if spec.label_names == ("False", "True"):
            return int(value)
    elif isinstance(value, int):
        if 0 <= value < spec.num_labels:
            return value
    elif isinstance(value, str) and value in spec.label_names:
        return spec.label_names.index(value)
    allowed = ", ".join(repr(n) for n in spec.label_names)
    raise where.error(f"unknown label {_shown(value)} for task {spec.name!r}; allowed: {allowed} "
                      f"or ids 0..{spec.num_labels - 1}", name)


def require_span(row: Mapping[str, Any], start_key: str, end_key: str, text: str, where: Where) -> None:
    """If the row has the span fields, check they are ints with 0 <= start < end <= len(text)."""
    if start_key not in row and end_key not in row:
        return
    for key in (start_key, end_key):
        value = _get(row, key, where, key)
        if isinstance(value, bool) or not isinstance(value, int):
            raise where.error(f"expected an int, got {type(value).__name__}", key)
    if not 0 <= row[start_key] < row[end_key] <= len(text):
        raise where.error(f"span [{row[start_key]}, {row[end_key]}) outside the sentence "
                          f"of length {len(text)}", start_key)


def check_split(task: str, examples: Sequence[Example], source: str) -> None:
    """Reject an empty split (the message names the source)."""
    if not examples:
        raise TaskDataError(f"no examples for task {task!r}: the split is empty", path=source)


def check_room_for_validation(examples: Sequence[Example], fraction: float, source: str) -> None:
    """Refuse an official train split too small to give both a train and a validation example.

    The stratified cut holds out at least one unit (an example; a question group in MultiRC) and keeps
    at least one for training, so it needs two units.
    """
    count = len(units(examples))
    if count >= 2:
        return
    grouped = bool(examples) and examples[0].group is not None
    what = f"{len(examples)} row(s) in {count} question group(s)" if grouped else f"{len(examples)} row(s)"
    unit = "question groups" if grouped else "rows"
    raise TaskDataError(f"the official train split has {what}, too few for the train/validation cut "
                        f"(validation_fraction={fraction} holds out {fraction:.0%} but always at least one): it "
                        f"needs at least 2 {unit}, one to train on and one to validate on. Add rows to the file.",
                        path=source)
