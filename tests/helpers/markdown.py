"""Markdown tables as the README tests read them."""

from __future__ import annotations


def table_rows(lines: list[str]) -> list[list[str]]:
    """The cells of every table row in `lines` (header included, `|---` separators left out), stripped."""
    return [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in lines
            if line.startswith("|") and not line.startswith("|---")]
