"""The end of a sweep: its results table (printed), summary.md and summary.csv, and a README of the sweep folder.

Every row sets the trial's test score beside what it has to beat, all measured by the job on the same test
split: the majority class, chance (uniform guessing) and, with `train.score_untrained`, the same model before its
first training step (`capt.tasks.levels`, `pipelines.train`). Rows on generated data say so.
"""

from __future__ import annotations

import csv
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from pipelines.config.schema import model_slug
from pipelines.sweeps.config import SweepConfig, member_points, trials
from pipelines.sweeps.select import chosen_labels, select_label
from pipelines.sweeps.trial_process import REFUSED_KEY

logger = logging.getLogger(__name__)

SUMMARY_MD, SUMMARY_CSV, README = "summary.md", "summary.csv", "README.md"
GENERATED, REAL = "generated", "real"
SCORE_COLUMNS = {"majority": "test_majority_score", "chance": "test_chance_score",
                 "untrained": "test_untrained_score", "validation": "best_validation_score", "test": "test_score"}
"""Table column -> the trial's reported metric."""
LEVELS_NOTE = ("majority: always the most frequent training label; chance: uniform random guessing (mean of 200 "
               "draws); untrained: the same model before its first training step; these three and test are scored "
               "on the test split, valid on the validation split (best checkpoint). Task scores in percent.")
GENERATED_NOTE = ("data=generated: rows made by capt/tasks/generated.py, whose labels follow a simple rule stated "
                  "there (a check that the pipeline learns, not benchmark data: never report these scores).")
_KEYS = ("model", "task", "method")


def data_kinds(sweep: SweepConfig) -> dict[tuple[str, str, str], str]:
    """(model slug, task, method label) -> "generated" or "real", from every trial's job config."""
    return {(model_slug(t.model), t.task, t.method): GENERATED if t.job["task"]["source"] == "generated" else REAL
            for t in trials(sweep)}


def result_rows(grid: Iterable, kinds: Mapping[tuple[str, str, str], str] | None = None) -> list[dict[str, Any]]:
    """One row per trial of a Tune ResultGrid (each member of a pack trial: its ``pack`` column names the pack),
    sorted, each marked `chosen` (the `select:` value kept on validation)."""
    rows = []
    for result in grid:
        for point, metrics, pack in member_points(result.config["point"], result.metrics or {}):
            row = {"task": point["task"], "model": model_slug(point["model"]), "method": point["method"],
                   "seed": point["seed"], "select": select_label(point.get("select", {}))}
            row["data"] = (kinds or {}).get(tuple(row[k] for k in _KEYS), "")
            row.update({column: metrics.get(metric) for column, metric in SCORE_COLUMNS.items()})
            refused = metrics.get(REFUSED_KEY)
            row["status"] = f"refused: {refused}" if refused else "error" if result.error else "done"
            row["reused"] = bool(metrics.get("reused")) and not result.error  # its job's finished result, not trained
            if pack:
                row["pack"] = pack
            rows.append(row)
    chosen = chosen_labels(rows)
    for r in rows:
        r["chosen"] = chosen.get(tuple(r[k] for k in _KEYS), r["select"]) == r["select"]  # no score: no choice
    rows.sort(key=lambda r: (r["model"], r["task"], r["method"], r["select"], r["seed"]))
    return rows


def results_table(grid: Iterable, kinds: Mapping[tuple[str, str, str], str] | None = None) -> tuple[str, list[dict]]:
    """The plain-text table of the trials (`result_rows`) and the rows.

    With `select:`, each (task, model, method) shows only the trials of the value chosen on validation
    (`pipelines.sweeps.select`) and failed trials; every row is returned, marked `chosen`.
    """
    rows = result_rows(grid, kinds)
    width = max([6, *(len(r["select"]) for r in rows)]) if any(r["select"] for r in rows) else 0

    def line(r: Mapping[str, Any]) -> str:
        select = f"{r['select']:<{width}} " if width else ""
        return (f"{r['task']:<8} {r['model']:<16} {r['method']:<22} {select}{r['seed']:>4} {r['data'] or '-':<9} "
                f"{r['majority']:>8} {r['chance']:>7} {r['untrained']:>9} {r['validation']:>7} {r['test']:>7}  "
                f"{r['status']}")

    header = line({**{c: c for c in ("task", "model", "method", "select", "seed", "data", *SCORE_COLUMNS, "status")},
                   "validation": "valid"})
    lines = [header, "-" * len(header)]
    lines += [line({**r, **{c: _fmt(r[c]) for c in SCORE_COLUMNS}}) for r in _shown(rows)]
    lines += _notes(rows, width > 0)
    return "\n".join(lines), rows


def _shown(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r["chosen"] or r["status"] != "done"]


def _notes(rows: list[dict], selecting: bool) -> list[str]:
    notes = [LEVELS_NOTE]
    if any(r["data"] == GENERATED for r in rows):
        notes.append(GENERATED_NOTE)
    if selecting:
        hidden = sum(not r["chosen"] and r["status"] == "done" for r in rows)
        notes.append(f"select: per (task, model, method), the value with the best mean validation score over seeds; "
                     f"{hidden} trials of other values not shown.")
    return notes


def _fmt(value: float | None) -> str:
    """Scores in percent, to one decimal: test sets of tens to thousands of examples do not support more."""
    return "-" if value is None else f"{value:.1f}"


def summary_markdown(sweep: SweepConfig, rows: list[dict]) -> str:
    """summary.md: the results table as Markdown, with what its columns mean."""
    generated = any(r["data"] == GENERATED for r in rows)
    title = f"# Sweep `{sweep.name}`: results" + (" on generated data (not benchmark data)" if generated else "")
    columns = ["task", "model", "method", *(["select"] if any(r["select"] for r in rows) else []), "seed", "data",
               *SCORE_COLUMNS, "status", *(["pack"] if any(r.get("pack") for r in rows) else [])]
    tracked = f"MLflow experiment `{sweep.experiment_name()}`; " if sweep.tracking.enabled else ""
    lines = [title, "", f"{tracked}{len(rows)} trials. Every trial, with the values of `select:` not chosen, is in "
             f"`{SUMMARY_CSV}`; `{README}` explains this folder.", "",
             "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in _shown(rows):
        lines.append("| " + " | ".join(_fmt(r[c]) if c in SCORE_COLUMNS else str(r[c]) or "-" for c in columns) + " |")
    return "\n".join([*lines, "", *_notes(rows, False), ""])


def reuse_line(sweep: SweepConfig, rows: list[dict]) -> str | None:
    """What a re-run reused: the trials whose jobs returned the finished result already in their folder."""
    reused = sum(r.get("reused", False) for r in rows)
    if not reused:
        return None
    remote = "://" in sweep.storage_path
    jobs = f"{sweep.storage_path}/{sweep.name}/jobs" if remote else sweep.folder() / "jobs"
    if reused == len(rows):
        return f"All {reused} trials reused from {jobs}; nothing trained."
    return f"{reused} of {len(rows)} trials reused from {jobs}; {len(rows) - reused} trained or failed now."


def write_summary(sweep: SweepConfig, rows: list[dict]) -> str:
    """Write summary.md, summary.csv and README.md into the sweep folder; returns the lines saying where (or why
    not), after `reuse_line`'s when trials were reused."""
    return "\n".join(filter(None, [reuse_line(sweep, rows), _write_files(sweep, rows)]))


def _write_files(sweep: SweepConfig, rows: list[dict]) -> str:
    if "://" in sweep.storage_path:  # remote storage: Tune writes there itself, the driver has no file system path
        return f"No summary files: storage_path {sweep.storage_path} is not a local or shared folder."
    folder = sweep.folder()
    fields = ["task", "model", "method", "select", "seed", "data", *SCORE_COLUMNS, "status", "chosen",
              *(["pack"] if any(r.get("pack") for r in rows) else [])]
    try:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / SUMMARY_MD).write_text(summary_markdown(sweep, rows), encoding="utf-8")
        with (folder / SUMMARY_CSV).open("w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, fieldnames=fields, extrasaction="ignore")
            writer.writeheader()
            writer.writerows({**r, **{c: "" if r[c] is None else round(r[c], 2) for c in SCORE_COLUMNS}} for r in rows)
        (folder / README).write_text(folder_readme(sweep), encoding="utf-8")
    except OSError as err:  # the results are printed and in MLflow: a failed summary must not fail the sweep
        logger.warning("Could not write the sweep summary into %s: %s", folder, err)
        return f"No summary files: {err}"
    return f"Summary: {folder / SUMMARY_MD} and {SUMMARY_CSV}; the folder's layout: {folder / README}"


def folder_readme(sweep: SweepConfig) -> str:
    """README.md of the sweep folder: which of its per-trial trees holds what."""
    return f"""# Sweep folder `{sweep.name}`

Results: `{SUMMARY_MD}` (the table the sweep printed) and `{SUMMARY_CSV}` (every trial), written when the sweep
ends.{f" Runs, curves and registered capsules: MLflow experiment `{sweep.experiment_name()}`." if sweep.tracking.enabled
      else ""}

## The folder that matters: `jobs/`

`jobs/<task>-<model>-<method>-s<seed>-<config hash>/` holds one trial's training job. The hash is of the job's
resolved config, so a changed config trains in a new folder and an identical one is reused (`--resume`).

- `result.json`: metrics (test, validation, majority class, chance, untrained), the validation history,
  the training-loss curve (`curve`), the resolved config and optimiser.
- `artifact/`: the capsule (`capsule.safetensors` + `capsule.json`), what the Model Registry holds.
- `job_config.json`: the config and its hash; `checkpoints/`: resumable state; `job.lock`: held while it runs.
- `mlflow_run.json`, `mlflow_pending.jsonl`: the trial's MLflow run id and anything not uploaded yet
  (`python -m pipelines.tracking sync` uploads it).

## Ray's own state: leave it, `--resume` reads it

- `<task>-<model>-<method>-s<seed>/` (the trial name, no hash): Tune's log of the trial: `params.json`,
  `progress.csv` and `result.json` (every report, one line each).
- `pack<NNN>-<model>-x<members>/` (a sweep with `pack:`): Tune's log of one pack trial; its members' folders are
  in `jobs/` like any trial's, and `summary.csv` names each member's pack.
- `train/` (only for trials with several workers): Ray Train's state of each trial's worker group.
- `experiment_state-*.json`, `basic-variant-state-*.json`, `tuner.pkl`, `.validate_storage_marker`: Tune's
  experiment state.
"""
