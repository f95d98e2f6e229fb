"""Errors of `capt.tasks`: every data error names the file (or source), the row and the field."""

from __future__ import annotations

from capt.errors import CaptError


class UnknownTaskError(CaptError, KeyError):
    """A task name that is not in the registry (the message lists the valid names)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class TaskDataError(CaptError, ValueError):
    """Task data that cannot be used: a missing file or folder, a bad row, a missing field, a bad label.

    `path` is the file (or source description such as ``hub:aps/super_glue/rte[train]``), `row` the
    1-based line number (jsonl, shown as "line N") or row number (parquet, hub), `field` the offending
    field; each is None when it does not apply. All three appear in the message.
    """

    def __init__(self, problem: str, path: str | None = None, row: int | None = None,
                 field: str | None = None) -> None:
        self.problem = problem
        self.path = path
        self.row = row
        self.field = field
        super().__init__(self._message())

    def _message(self) -> str:
        where = []
        if self.path is not None:
            where.append(str(self.path))
        if self.row is not None:
            where.append(f"{'line' if str(self.path).endswith('.jsonl') else 'row'} {self.row}")
        if self.field is not None:
            where.append(f"field {self.field!r}")
        return (": ".join(where) + ": " if where else "") + self.problem

    def __reduce__(self):
        return (type(self), (self.problem, self.path, self.row, self.field))


class TaskUsageError(CaptError, ValueError):
    """A `capt.tasks` function given arguments it cannot use: an unknown family, split, padding side or
    metric, predictions and labels of different lengths, a tokenizer or length budget that cannot fit."""


class MissingMetricsError(CaptError, KeyError):
    """Scores lack a metric their task reports (the message names the missing and the given ones)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""
