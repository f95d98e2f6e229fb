"""The Markdown report: machine, versions, date and settings, then every benchmark's targets, tables,
plots, notes and (where a target is missed) the profile of the CaPT step."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import BenchResult, fmt, markdown_table

logger = logging.getLogger(__name__)


def machine_section(info: dict[str, Any]) -> list[str]:
    """The machine, versions, date and the command, as Markdown lines."""
    machine, versions = info["machine"], info["versions"]
    return [
        "## Machine and versions", "",
        f"- Date: {info['date']} (UTC); command: `{info['command']}`",
        f"- CPU: {machine.get('cpu_model')}, {machine.get('logical_cpus')} logical CPUs "
        f"({machine.get('usable_cpus')} usable), torch threads {machine.get('torch_threads', '-')}",
        f"- RAM: {machine.get('ram_gib', '-')} GiB; load average at start (1, 5, 15 min): "
        f"{machine.get('load_average_1_5_15')} (other processes share these CPUs: ratios are measured "
        "side by side, absolute times are context only)",
        f"- Platform: {machine.get('platform')}, Python {machine.get('python')}; "
        + (f"GPU: {machine['gpu']}, CUDA {machine.get('cuda', '-')}" if "gpu" in machine else "no GPU used"),
        "- Versions: " + ", ".join(f"{name} {v}" for name, v in versions.items()),
        "",
    ]


def targets_section(results: Sequence[BenchResult]) -> list[str]:
    """One table of every target across the benchmarks."""
    rows = [(r, t) for r in results for t in r.targets]
    if not rows:
        return []
    lines = ["## Targets", "", "| benchmark | target | goal | measured | result |", "|---|---|---|---|---|"]
    lines += [f"| {r.name} | {t.name} | {t.goal} | {fmt(t.measured)} | {'met' if t.met else t.detail} |"
              for r, t in rows]
    return [*lines, ""]


def benchmark_section(index: int, result: BenchResult) -> list[str]:
    """Everything one benchmark reported."""
    mode = result.settings.get("mode", "?")
    lines = [f"## {index}. {result.title} (`{result.name}`)", "",
             f"Run {result.started or '-'} UTC, {mode} mode, {result.duration_s:.0f} s.", "",
             "Settings: `" + json.dumps({k: v for k, v in result.settings.items() if k != "mode"}) + "`", ""]
    if result.skipped:
        return [*lines, f"**Skipped:** {result.skipped}", ""]
    if result.error:
        return [*lines, f"**Failed:** {result.error}", ""]
    for target in result.targets:
        verdict = "met" if target.met else f"**missed**: {target.detail}"
        lines.append(f"- Target {target.name} {target.goal}: measured {fmt(target.measured)}, {verdict}")
    lines.append("")
    for table in result.tables:
        lines += [markdown_table(table), ""]
    for title, text in result.sections.items():
        lines += [f"**{title}**", "", text.strip(), ""]
    lines += [f"![{name}]({name})" for name in result.plots] + [""]
    lines += [f"- {note}" for note in result.notes] + [""]
    return lines + profiles_section(result)


def profiles_section(result: BenchResult) -> list[str]:
    """The kept torch.profiler tables: shown when a target is missed, otherwise only named (they are in the JSON)."""
    if not result.profiles:
        return []
    if all(t.met for t in result.targets):
        return [f"Profiles kept in `{result.name}.json`: " + "; ".join(result.profiles) + ".", ""]
    lines = ["**Profiles (a target is missed): top ops by self CPU time, one profiled step each**", ""]
    for title, table in result.profiles.items():
        lines += [f"<details><summary>{title}</summary>", "", "```", table.rstrip(), "```", "", "</details>", ""]
    return lines


def write_report(results: Sequence[BenchResult], info: dict[str, Any], out_dir: Path) -> Path:
    """Write `<out_dir>/report.md` from the results (in benchmark order) and the run info."""
    lines = ["# CaPT benchmarks", "",
             "Ratios measured side by side in one run on this machine (methods interleaved, medians); "
             "absolute times are context only. Produced by `python -m benchmarks.run`; see "
             "`benchmarks/README.md` for what each benchmark measures.", ""]
    lines += machine_section(info)
    durations = ", ".join(f"{r.name} {r.duration_s:.0f} s" for r in results)
    lines += [f"Durations: {durations}; this invocation: {info.get('total_s', 0):.0f} s.", ""]
    lines += targets_section(results)
    for index, result in enumerate(results, start=1):
        lines += benchmark_section(index, result)
    path = out_dir / "report.md"
    path.write_text("\n".join(lines).rstrip() + "\n", encoding="utf-8")
    logger.info("wrote %s", path)
    return path
