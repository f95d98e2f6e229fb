"""The report's picture: a grouped bar chart per base model, reference levels drawn as lines across each task."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from pipelines.reporting.levels import CHANCE, MAJORITY, UNTRAINED, column_label, is_reference

_LEVEL_STYLE = {MAJORITY: {"colors": "black", "linestyles": "--"}, CHANCE: {"colors": "dimgray", "linestyles": ":"}}
_HALF_GROUP = 0.42
"""Half the width of one task's group of bars (a level line spans it)."""


def plot(tables: Mapping[str, pd.DataFrame], metric: str, path: str | os.PathLike[str],
         title: str | None = None) -> Path:
    """Bars per method (tasks and the SuperGLUE average on x, std as error bars, values to one decimal), the
    majority class and chance as lines across each task; generated tasks are marked on the axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(tables), 1, figsize=(12, 3.8 * len(tables)), squeeze=False)
    for ax, (model, table) in zip(axes[:, 0], tables.items(), strict=True):
        columns = list(table.columns.get_level_values(0).unique())
        _bars(ax, table, columns)
        _levels(ax, table, columns)
        ax.set_xticks(range(len(columns)), [column_label(c, table) for c in columns])
        ax.set_ylabel(metric)
        ax.set_title(model)
        ax.margins(y=0.12)
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the bars, never over them
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _bars(ax, table: pd.DataFrame, columns: list[str]) -> None:
    methods = [m for m in table.index if not is_reference(m)]
    width = 2 * _HALF_GROUP / max(1, len(methods))
    for i, method in enumerate(methods):
        row = table.loc[method]
        xs = [j + (i - (len(methods) - 1) / 2) * width for j in range(len(columns))]
        means = [row[(c, "mean")] for c in columns]
        stds = [0.0 if math.isnan(row[(c, "std")]) else row[(c, "std")] for c in columns]
        style = {"hatch": "//", "alpha": 0.55} if method.endswith(UNTRAINED) else {}
        bars = ax.bar(xs, means, width, yerr=stds, capsize=2, label=str(method), **style)
        ax.bar_label(bars, labels=["" if math.isnan(v) else f"{v:.1f}" for v in means], fontsize=6, padding=1)


def _levels(ax, table: pd.DataFrame, columns: list[str]) -> None:
    for level, style in _LEVEL_STYLE.items():
        if level not in table.index:
            continue
        spans = [(j, table.loc[level, (c, "mean")]) for j, c in enumerate(columns)]
        spans = [(j, y) for j, y in spans if not math.isnan(y)]
        for k, (j, y) in enumerate(spans):
            ax.hlines(y, j - _HALF_GROUP, j + _HALF_GROUP, linewidth=1.2, label=level if k == 0 else None, **style)
