"""Benchmark 5: learning on real data: MiniLM on CB, RTE, COPA, WiC and BoolQ, 3 seeds, every method.

Full mode runs the grid `pipelines/configs/bench/learning.yaml` through `pipelines/sweep.py` and tabulates it with
`python -m pipelines.report`; quick mode runs its trial jobs in this process (a sweep trial's Ray start-up would take
the whole quick budget). Needs `CAPT_DATA_DIR`; BoolQ's train split is cut from its validation file (README).
"""

from __future__ import annotations

import json
import logging
import os
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import OFFLINE_ENV, REPO, BenchResult, Table, run_logged
from pipelines.services.ray_connect import environ

logger = logging.getLogger(__name__)

NAME = "learning"
TITLE = "Learning on real data: MiniLM, 5 SuperGLUE tasks, every method"
CONFIG = "pipelines/configs/bench/learning.yaml"
QUICK_OVERRIDES = ["tasks=[cb]", "seeds=[0]", "job.train.max_steps=3", "job.train.eval_every_steps=3",
                   "job.train.batch_size=4", "job.model.max_length=64", "job.task.max_train_examples=64",
                   "job.task.max_eval_examples=16"]


def settings(quick: bool) -> dict[str, Any]:
    """Route (sweep or in-process), config overrides, BoolQ split and time limit."""
    common = {"config": CONFIG, "boolq_train_fraction": 2 / 3, "split_seed": 0}
    if quick:
        return {**common, "route": "in_process", "overrides": QUICK_OVERRIDES, "timeout_s": 900}
    return {**common, "route": "sweep", "overrides": [], "timeout_s": 3 * 3600}


def rows_override(labels: list[str]) -> str:
    """A `methods=[...]` override keeping the grid's rows named `labels` (a row's label, else its method name),
    exactly as the shipped config writes them; ValueError listing the rows when one is unknown."""
    import yaml

    rows = yaml.safe_load((REPO / CONFIG).read_text(encoding="utf-8"))["methods"]
    by_label = {row.get("label", row["name"]): row for row in rows}
    unknown = [label for label in labels if label not in by_label]
    if unknown:
        raise ValueError(f"--learning-rows: unknown row(s) {', '.join(unknown)} (the rows of {CONFIG}: "
                         f"{', '.join(by_label)})")
    return "methods=" + json.dumps([by_label[label] for label in dict.fromkeys(labels)])


def override_problems(overrides: list[str], quick: bool) -> list[str]:
    """What is wrong with the user's `--learning-override`s (an unknown key, a bad value, a trial they break),
    found before any benchmark runs: the learning grid is loaded with them as the benchmark would load it (on
    generated data, which needs no data folder)."""
    from pipelines.config.sources import PipelineConfigError
    from pipelines.sweeps.config import load_sweep_config

    try:
        load_sweep_config(REPO / CONFIG, [*settings(quick)["overrides"], *overrides, "data_source=generated"])
    except PipelineConfigError as err:
        return [f"--learning-override: {err}"]
    return []


def split_boolq(val_file: Path, target: Path, fraction: float, seed: int) -> str:
    """Write train.jsonl / val.jsonl from BoolQ's official validation file; returns a note saying so."""
    lines = [line for line in val_file.read_text(encoding="utf-8").splitlines() if line.strip()]
    random.Random(seed).shuffle(lines)
    cut = round(len(lines) * fraction)
    target.mkdir(parents=True, exist_ok=True)
    (target / "train.jsonl").write_text("\n".join(lines[:cut]) + "\n", encoding="utf-8")
    (target / "val.jsonl").write_text("\n".join(lines[cut:]) + "\n", encoding="utf-8")
    return (f"BoolQ: only the official validation file ({len(lines)} rows) is available; it was shuffled "
            f"(seed {seed}) and split into {cut} train rows and {len(lines) - cut} test rows (the test set "
            "here, so BoolQ numbers are not comparable to the official validation scores).")


def prepare_data(source: Path, target: Path, tasks: list[str], config: dict[str, Any]) -> tuple[list[str], list[str]]:
    """Link every task folder with train and val files into `target`; split BoolQ when it lacks train."""
    ready, notes = [], []
    for task in tasks:
        folder = source / task
        if (folder / "train.jsonl").is_file() and (folder / "val.jsonl").is_file():
            (target / task).parent.mkdir(parents=True, exist_ok=True)
            (target / task).symlink_to(folder.resolve(), target_is_directory=True)
            ready.append(task)
        elif task == "boolq" and (folder / "val.jsonl").is_file():
            notes.append(split_boolq(folder / "val.jsonl", target / task, config["boolq_train_fraction"],
                                     config["split_seed"]))
            ready.append(task)
        else:
            notes.append(f"{task}: skipped, {folder} has no train.jsonl and val.jsonl.")
    return ready, notes


REFERENCE_LEVELS = ("majority", "chance")
"""Trial-row columns holding the job's majority-class and chance test scores (`pipelines.reporting`), so pieces of the
grid merged by `benchmarks.learning_merge` keep the report's reference rows."""


def trial_results(sweep) -> list[dict[str, Any]]:
    """One row per finished trial of `sweep` (read from its result.json), labelled by the method row; with its mean
    training loss of each evaluation window, e.g. "1.08 > 0.95 > 0.91" (shows whether it flattened), and what it
    trained with (its resolved config): optimiser and schedule, batch and epochs, method options."""
    from pipelines.reporting import LEVEL_METRICS
    from pipelines.sweeps.config import trials
    from pipelines.sweeps.select import select_label

    rows = []
    for trial in trials(sweep):  # candidates that did not run (the quick route runs one per row) have no result
        path = Path(trial.job["output_dir"]) / "result.json"
        if not path.is_file():
            continue
        result = json.loads(path.read_text())
        metrics, optimizer, config = result["metrics"], result.get("optimizer") or {}, result.get("config") or {}
        train = config.get("train") or {}
        rows.append({"task": trial.task, "model": trial.model, "method": trial.method, "seed": trial.seed,
                     "select": select_label(trial.select), "test_score": metrics.get("test_score"),
                     "test_accuracy": metrics.get("test_accuracy"),
                     "best_validation_score": metrics.get("best_validation_score"),
                     **{column: metrics.get(LEVEL_METRICS[column]) for column in REFERENCE_LEVELS},
                     "steps": result["steps"], "trainable": result["trainable_parameters"],
                     "lr": optimizer.get("lr"), "head_lr": optimizer.get("head_lr"),
                     "train_loss_curve": " > ".join(f"{record['train_loss']:.3f}" for record in result["history"]
                                                    if record.get("train_loss") is not None),
                     "fit_s": result["wall_time_s"], "config_hash": result.get("config_hash"),
                     "settings": {"optim": config.get("optim") or {}, "batch_size": train.get("batch_size"),
                                  "max_epochs": train.get("max_epochs"), "max_steps": train.get("max_steps"),
                                  "method": config.get("method")}})
    return rows


def via_sweep(config: dict[str, Any], overrides: list[str], data: Path, tmp: Path, out: Path) -> str:
    """Run the sweep in a subprocess, then `python -m pipelines.report` on its MLflow database."""
    from pipelines.services.probe import log_tail
    from pipelines.sweeps.config import load_sweep_config

    env = {**OFFLINE_ENV, "CAPT_DATA_DIR": str(data)}
    cmd = [sys.executable, "pipelines/sweep.py", "--config", config["config"], "--num-cpus", "2", *overrides]
    code, wall = run_logged(cmd, tmp / "sweep.log", env=env, timeout=config["timeout_s"])
    logger.info("learning sweep: exit %d after %.0f s", code, wall)
    with environ(CAPT_DATA_DIR=str(data)):
        sweep = load_sweep_config(REPO / config["config"], overrides)
    report = [sys.executable, "-m", "pipelines.report", "--experiment", sweep.experiment_name(), "--tracking-uri",
              f"sqlite:///{tmp / 'mlflow' / 'mlflow.db'}", "--out", str(out), "--sweep", sweep.name]
    code, _ = run_logged(report, tmp / "report.log", env=OFFLINE_ENV, timeout=600)
    if code != 0:
        raise RuntimeError(f"pipelines.report failed ({code}):\n{log_tail(tmp / 'report.log', lines=25)}\n"
                           f"sweep log:\n{log_tail(tmp / 'sweep.log', lines=25)}")
    return (out / "report.md").read_text()


def first_combinations(trials: list) -> list:
    """The trials of each (task, model, method, seed) with the first combination of its `select:` values only: the
    quick route checks that every row trains and tabulates; every candidate (855 trials) does not fit its budget."""
    kept: dict[tuple, Any] = {}
    for trial in trials:
        kept.setdefault((trial.task, trial.model, trial.method, trial.seed), trial)
    return list(kept.values())


def in_process(config: dict[str, Any], overrides: list[str], data: Path, out: Path) -> str:
    """Run the sweep's trial jobs back to back here (one `select:` combination per row, see `first_combinations`);
    tabulate them with pipelines.report's functions."""
    import pandas as pd

    from pipelines.config.load import validate_job_config
    from pipelines.reporting import build_tables, markdown, plot
    from pipelines.sweeps.config import load_sweep_config, trials
    from pipelines.training.loop import run as train_run

    with environ(CAPT_DATA_DIR=str(data)):
        sweep = load_sweep_config(REPO / config["config"], overrides)
        for trial in first_combinations(trials(sweep)):
            train_run(validate_job_config(trial.job))
        rows = trial_results(sweep)  # the trials' folders are keyed by their configs, which hold the data dir
    frame = pd.DataFrame([{"model": "minilm", "task": r["task"], "method": r["method"], "seed": str(r["seed"]),
                           "value": r["test_score"]} for r in rows])
    tables = build_tables(frame)
    text = markdown(tables, "test_score", f"{sweep.name} (in-process): test_score")
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text(text + "\n")
    plot(tables, "test_score", out / "report.png")
    return text


def run(config: dict[str, Any], out_dir: Path) -> BenchResult:
    """Prepare the data, run the grid by the configured route, and collect the tables."""
    from pipelines.sweeps.config import load_sweep_config

    result = BenchResult(NAME, TITLE, config)
    source = os.environ.get("CAPT_DATA_DIR")
    if not source:
        result.skipped = ("CAPT_DATA_DIR is not set: this benchmark needs the real task files "
                          "(<dir>/<task>/{train,val}.jsonl), e.g. CAPT_DATA_DIR=/work/shared/data.")
        return result
    with tempfile.TemporaryDirectory(prefix="bench-learning-") as tmp_name:
        tmp = Path(tmp_name)
        with environ(CAPT_DATA_DIR=str(Path(source))):
            tasks = load_sweep_config(REPO / config["config"], config["overrides"]).tasks
        ready, notes = prepare_data(Path(source), tmp / "data", tasks, config)
        overrides = [*config["overrides"], f"tasks=[{','.join(ready)}]", f"storage_path={tmp / 'sweeps'}",
                     f"tracking.local_dir={tmp / 'mlflow'}"]
        out = out_dir / "learning"
        if config["route"] == "sweep":
            text = via_sweep(config, overrides, tmp / "data", tmp, out)
        else:
            text = in_process(config, overrides, tmp / "data", out)
        with environ(CAPT_DATA_DIR=str(tmp / "data")):
            rows = trial_results(load_sweep_config(REPO / config["config"], overrides))
    body = text.split("\n", 1)[1]  # without the report's own title
    title = "Table from pipelines.report (test_score, mean ± std over seeds)"
    result.sections[title] = body.replace("\n## ", "\n#### ")
    result.tables.append(Table("Every trial", ["task", "model", "method", "seed", "select", "test_score",
                                               "test_accuracy", "best_validation_score", *REFERENCE_LEVELS, "steps",
                                               "trainable", "lr", "head_lr", "train_loss_curve", "fit_s",
                                               "config_hash", "settings"], rows))
    result.plots.append("learning/report.png")
    result.notes += notes + [
        f"Route: {config['route']}; config {config['config']}; overrides {config['overrides'] or 'none'}.",
        "head-only+anchor = capt with task_vector=false: the training-free instance-mean capsule, so the "
        "linear classifier head is the only trained weight; every other row also trains the head (head_lr).",
        "Training sets above 1000 examples (RTE, WiC, BoolQ) are subsampled (max_train_examples, seeded); "
        "validation and test sets above max_eval_examples likewise.",
    ]
    return result
