"""The results report: the paper's results table from MLflow runs, tasks as columns, methods as rows, mean ± std
over seeds (what `python -m pipelines.report` and a sweep's own run show), its reference rows and its bar chart.

One table per base model (run tag ``model``), as Markdown (``DIR/report.md``, also printed) and a grouped bar chart
(``DIR/report.png``); its SuperGLUE average column and the choice of a `select:` value on validation are as README's
paragraph on sweeps says. Runs count when FINISHED and tagged ``task``, ``model``, ``method`` and ``seed``. When
several runs share (model, task, method, seed) after selection (e.g. single jobs differing in lr, or a Tune search),
the one with the best validation score is kept, never the best test score, and a note under the table names it, the
runs left out and their scores.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from capt.errors import CaptError
from capt.tasks.registry import SUPERGLUE_TASKS, TASK_NAMES
from pipelines.services.folder_lock import folder_problem
from pipelines.sweeps.select import SELECT_TAG, chosen_labels

# The report's reference rows: what every method's test score is measured against (`LEVELS_NOTE`), which each job
# measures on its own test split and logs with its run (`pipelines.training.result.reference_scores`).

MAJORITY, CHANCE = "majority class", "chance"
UNTRAINED = " (untrained)"
"""Suffix of a method's untrained row."""
LEVEL_METRICS = {"majority": "test_majority_score", "chance": "test_chance_score", "untrained": "test_untrained_score"}
"""Frame column -> the run metric it is read from (all on the test split)."""
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
    rows = [m for m in (MAJORITY, CHANCE) if m in methods]
    for method in _ordered(results, preferred):
        rows += [m for m in (method + UNTRAINED, method) if m in methods]
    return rows + sorted(methods - set(rows))  # an untrained row whose method has no result of its own


def column_label(column: str, table: pd.DataFrame) -> str:
    """A table or chart column as shown: its label in the table's ``attrs["labels"]`` (the SuperGLUE average of a
    partial task set says how many tasks it covers), a task marked when its data was generated."""
    if column in table.attrs.get("labels", {}):
        return table.attrs["labels"][column]
    return f"{column} ({GENERATED})" if column in set(table.attrs.get("generated", ())) else column


# The report's picture: a grouped bar chart per base model, reference levels drawn as lines across each task.

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
        for level, style in _LEVEL_STYLE.items():  # drawn where the table has it, across each task's bars
            spans = [(j, y) for j, c in enumerate(columns)
                     if level in table.index and not math.isnan(y := table.loc[level, (c, "mean")])]
            for k, (j, y) in enumerate(spans):
                ax.hlines(y, j - _HALF_GROUP, j + _HALF_GROUP, linewidth=1.2, label=level if k == 0 else None, **style)
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


# The tables

AVERAGE = "SuperGLUE avg"
"""Column of the paper's average over the six SuperGLUE tasks (CSQA is reported beside them, never in it)."""
REPORT_MD, REPORT_PNG = "report.md", "report.png"
SELECTION_METRIC = "best_validation_score"
SELECTION_NOTE = (f"Selection on the validation split: each run's checkpoint and, with `select:`, the value with the "
                  f"best mean `{SELECTION_METRIC}` over seeds (shown in brackets); test scores are those of the chosen "
                  "value only.")
_KEYS = ("model", "task", "method", "seed")
METHOD_ORDER = ("full_finetune", "adapter", "lora", "prompt_tuning", "ptuning_v2", "xprompt", "residual_prompt",
                "smop", "superpos_prompt", "vfpt", "dept", "ept", "capt")
"""Row order of the CaPT paper's main table: full fine-tuning, the twelve baselines, CaPT last; other rows (labelled
ablations) follow, sorted."""
KEPT_NOTE = (f"Several runs share one cell's seed (e.g. jobs differing in lr, or a Tune search): each keeps the run "
             f"with the best `{SELECTION_METRIC}` (validation, never test); the others are left out of the table:")


class ReportError(CaptError, RuntimeError):
    """No report can be built; the message says why."""


def run_frame(runs: Iterable[Mapping[str, Any]], metric: str, sweep: str | None = None) -> pd.DataFrame:
    """One row per (model, task, method, seed) with the metric value, from `experiment_runs` records.

    Only the runs of the `select:` value chosen on validation are kept (column `select`, empty without one).
    Columns `majority`, `chance` and `untrained` hold the run's reference levels when `metric` is the test score
    (the reference rows), `data` its run tag ``data`` ("generated" or "real"), `kept` which run was kept
    over which when several share the row's (model, task, method, seed) (`_kept_notes`; empty otherwise).
    """
    rows = []
    for run in runs:
        tags, metrics = run.get("tags", {}), run.get("metrics", {})
        if run.get("status") != "FINISHED" or any(k not in tags for k in _KEYS) or metric not in metrics:
            continue
        if sweep is not None and tags.get("sweep") != sweep:
            continue
        # the levels are test-split task scores: comparable with the test score only
        levels = {column: float(metrics.get(name, math.nan)) if metric == "test_score" else math.nan
                  for column, name in LEVEL_METRICS.items()}
        rows.append({**{k: tags[k] for k in _KEYS}, "value": float(metrics[metric]), "run_id": run.get("run_id"),
                     "run_name": run.get("run_name") or run.get("run_id") or "", "select": tags.get(SELECT_TAG, ""),
                     "selection": float(metrics.get(SELECTION_METRIC, -math.inf)), "data": tags.get("data", ""),
                     **levels})
    frame = pd.DataFrame(rows, columns=[*_KEYS, "value", "run_id", "run_name", "select", "selection", "data",
                                        *LEVEL_METRICS])
    chosen = chosen_labels(frame.rename(columns={"selection": "validation"}).to_dict("records"))
    keep = pd.Series([chosen.get((r.model, r.task, r.method), r.select) == r.select for r in frame.itertuples()],
                     index=frame.index, dtype=bool)  # a group with no validation score at all chooses nothing
    frame = frame[keep].sort_values(["selection", "run_name"], kind="stable")  # a tie keeps the name sorting last
    frame = frame.assign(kept=_kept_notes(frame)).drop_duplicates(list(_KEYS), keep="last")
    return frame.reset_index(drop=True)


def _kept_notes(frame: pd.DataFrame) -> pd.Series:
    """On the run kept (the last of its (model, task, method, seed) in `frame`, sorted by validation score) where
    others share its cell and seed: which run it is and which it was kept over, with their validation scores."""
    notes = pd.Series("", index=frame.index, dtype=object)
    for (_, task, method, seed), group in frame.groupby(list(_KEYS), sort=True):
        if len(group) > 1:
            kept, others = group.iloc[-1], group.iloc[:-1]
            left_out = ", ".join(f"`{r.run_name}` ({r.selection:.2f})" for r in others.itertuples())
            tie = " (a tie: the name sorting last)" if kept.selection == others["selection"].max() else ""
            notes[group.index[-1]] = (f"{task} / {method} / seed {seed}: kept `{kept.run_name}` ({SELECTION_METRIC} "
                                      f"{kept.selection:.2f}) over {left_out}{tie}")
    return notes


def _ordered(values: Iterable[str], preferred: Iterable[str]) -> list[str]:
    values, preferred = set(values), list(preferred)
    return [v for v in preferred if v in values] + sorted(values - set(preferred))


def build_tables(frame: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Per base model: a frame indexed by method with columns (task or SuperGLUE average) x (mean, std, n,
    select); the average follows the SuperGLUE tasks, and CSQA (not a SuperGLUE task) comes after it. Reference
    rows (majority class, chance, untrained) come with the methods (the reference rows); the frame's
    ``attrs["generated"]`` lists its tasks on generated data, ``attrs["kept"]`` which run each cell and seed kept when
    several shared them."""
    tables = {}
    for model, part in frame.groupby("model", sort=True):
        kept = sorted(note for note in part.get("kept", pd.Series(dtype=object)) if isinstance(note, str) and note)
        part = with_reference_rows(part if "select" in part else part.assign(select=""))
        stats = part.groupby(["method", "task"])["value"].agg(["mean", "std", "count"]).rename(columns={"count": "n"})
        table = stats.unstack("task").swaplevel(axis=1)
        tasks = _ordered(part["task"], TASK_NAMES)
        methods = row_order(part["method"], METHOD_ORDER)
        table = table.reindex(index=methods, columns=pd.MultiIndex.from_product([tasks, ["mean", "std", "n"]]))
        chosen = part.groupby(["method", "task"])["select"].first()
        for task in tasks:
            table[(task, "select")] = [chosen.get((method, task), "") for method in methods]
        superglue = [t for t in tasks if t in SUPERGLUE_TASKS]
        means = table.xs("mean", axis=1, level=1)[superglue]
        table[(AVERAGE, "mean")] = means.mean(axis=1, skipna=True)
        table[(AVERAGE, "std")] = float("nan")
        table[(AVERAGE, "n")] = means.notna().sum(axis=1)  # SuperGLUE tasks covered
        table[(AVERAGE, "select")] = ""
        tables[str(model)] = table[[*superglue, AVERAGE, *(t for t in tasks if t not in SUPERGLUE_TASKS)]]
        labels = ({AVERAGE: f"{AVERAGE} ({len(superglue)} of {len(SUPERGLUE_TASKS)} tasks)"}
                  if len(superglue) < len(SUPERGLUE_TASKS) else {})  # the header says how many it averages
        generated = sorted(set(part.loc[part["data"] == GENERATED, "task"])) if "data" in part else []
        tables[str(model)].attrs.update(generated=generated, labels=labels, kept=kept)
    return tables


def format_cell(mean: float, std: float) -> str:
    """`mean ± std` with two decimals; the mean alone for one seed; `-` when missing."""
    if mean is None or math.isnan(mean):
        return "-"
    return f"{mean:.2f}" if std is None or math.isnan(std) else f"{mean:.2f} ± {std:.2f}"


def markdown(tables: Mapping[str, pd.DataFrame], metric: str, title: str) -> str:
    """The Markdown report: one table per base model."""
    lines = [f"# {title}", "", f"`{metric}`: mean ± std over seeds (sample std; one seed: the value alone). "
             f"{AVERAGE}: the mean of a method's SuperGLUE task means ({', '.join(SUPERGLUE_TASKS)}; the header says "
             "how many when the table has fewer, * marks a method missing one of the table's); not comparable with "
             "the paper's six-task average unless all six are there. CSQA is not a SuperGLUE task and has its own "
             "column.", "", SELECTION_NOTE, ""]
    if any(is_reference(m) or m.endswith(UNTRAINED) for table in tables.values() for m in table.index):
        lines += [LEVELS_NOTE, ""]
    if any(table.attrs.get("generated") for table in tables.values()):
        lines += [GENERATED_NOTE, ""]
    for model, table in tables.items():
        columns = list(table.columns.get_level_values(0).unique())
        superglue = sum(c in SUPERGLUE_TASKS for c in columns)
        shown = [column_label(c, table) for c in columns]
        lines += [f"## {model}", "", "| method | " + " | ".join(shown) + " |", "|---|" + "---:|" * len(columns)]
        for method, row in table.iterrows():
            lines.append(f"| {method} | " + " | ".join(_cell(row, c, superglue) for c in columns) + " |")
        seeds = table.xs("n", axis=1, level=1).drop(columns=AVERAGE).stack()
        low, high = int(seeds.min()), int(seeds.max())
        lines += ["", f"Seeds per cell: {low if low == high else f'{low}-{high}'}.", ""]
        if table.attrs.get("kept"):
            lines += [KEPT_NOTE, "", *(f"- {note}" for note in table.attrs["kept"]), ""]
    return "\n".join(lines)


def _cell(row: pd.Series, column: str, superglue_tasks: int) -> str:
    if column == AVERAGE:
        average = format_cell(row[(AVERAGE, "mean")], float("nan"))
        return average + ("*" if average != "-" and row[(AVERAGE, "n")] < superglue_tasks else "")
    chosen = row[(column, "select")]
    return format_cell(row[(column, "mean")], row[(column, "std")]) + (f" [{chosen}]" if chosen else "")


def build_report(experiment: str, tracking_uri: str | None, out_dir: str | os.PathLike[str],
                 metric: str = "test_score", sweep: str | None = None) -> tuple[str, Path, Path]:
    """Fetch the runs, write report.md and report.png to `out_dir`; returns (markdown, md path, png path)."""
    from pipelines.services import ServiceError
    from pipelines.services.mlflow_server import check_mlflow_server
    from pipelines.tracking import TrackingError, experiment_runs

    out = Path(out_dir)
    check_writable_folder(out)
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:  # MLflow's own default would read (and create) a database in the working directory
        raise ReportError("No tracking server: pass --tracking-uri or set MLFLOW_TRACKING_URI.")
    try:
        check_mlflow_server(uri, "MLflow tracking server (--tracking-uri or MLFLOW_TRACKING_URI)")
        runs = experiment_runs(experiment, uri)
    except (ServiceError, TrackingError) as err:
        raise ReportError(str(err)) from err
    return write_report(runs, experiment, out, metric, sweep)


def write_report(runs: list[Mapping[str, Any]], experiment: str, out_dir: str | os.PathLike[str],
                 metric: str = "test_score", sweep: str | None = None) -> tuple[str, Path, Path]:
    """report.md and report.png of `runs` (`experiment_runs` records) in `out_dir`; (markdown, md path, png path)."""
    out = Path(out_dir)
    frame = run_frame(runs, metric, sweep)
    if frame.empty:
        raise ReportError(f"Experiment {experiment!r} has {len(runs)} run(s) but none FINISHED with tags "
                          f"{', '.join(_KEYS)} and metric {metric!r}" + (f" in sweep {sweep!r}" if sweep else "") + ".")
    tables = build_tables(frame)
    generated = any(table.attrs.get("generated") for table in tables.values())
    title = f"{experiment}: {metric}" + (" (generated data, not benchmark results)" if generated else "")
    text = markdown(tables, metric, title)
    md_path = out / REPORT_MD
    try:
        out.mkdir(parents=True, exist_ok=True)
        md_path.write_text(text + "\n", encoding="utf-8")
        return text, md_path, plot(tables, metric, out / REPORT_PNG, title)
    except OSError as err:  # checked writable before, but a disk can fill or a folder change meanwhile
        raise ReportError(f"--out {out}: cannot write the report ({err.strerror or err}: {err.filename or out}); "
                          "pass another folder or free space.") from err


def check_writable_folder(out: Path) -> None:
    """Refuse, before any work, an output folder that is a file, sits under a file, lies on a kernel file system
    (/proc, /sys) or cannot be written, or that holds a folder where a report file goes."""
    if problem := folder_problem("--out", out):
        raise ReportError(f"{problem}; pass a folder you can write to (it is created when missing).")
    if folders := [name for name in (REPORT_MD, REPORT_PNG) if (out / name).is_dir()]:
        raise ReportError(f"--out {out} holds a folder named {folders[0]}, where the report file goes; remove it "
                          "or pass another folder.")
