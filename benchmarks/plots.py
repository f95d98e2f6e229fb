"""Grouped bar charts (matplotlib, Agg backend) for the benchmark report."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

logger = logging.getLogger(__name__)


def grouped_bars(groups: Mapping[str, Mapping[str, float]], path: Path, title: str, ylabel: str,
                 hline: float | None = None, hline_label: str = "") -> Path:
    """One cluster of bars per group (x axis), one bar per series, values printed on the bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = list(dict.fromkeys(name for bars in groups.values() for name in bars))
    width = 0.8 / max(1, len(series))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(series) * len(groups)), 4.2))
    for i, name in enumerate(series):
        xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(groups))]
        values = [groups[g].get(name, float("nan")) for g in groups]
        bars = ax.bar(xs, values, width, label=name)
        ax.bar_label(bars, labels=[f"{v:.3g}" if v == v else "" for v in values], fontsize=7, rotation=90,
                     padding=2)
    if hline is not None:
        ax.axhline(hline, color="black", linestyle="--", linewidth=1, label=hline_label or None)
    ax.set_xticks(range(len(groups)), list(groups))
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.margins(y=0.2)
    ax.legend(fontsize="small", ncols=min(4, len(series) + 1))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    logger.info("wrote %s", path)
    return path
