"""Benchmark 2: time to a result (the paper's Table 2): one CaPT run against a prompt-length grid search.

Every run is one `pipelines.training.loop.run` job (build + fit) with the same task, steps, batch and evaluation; the
CaPT repetitions are spread through the grid (start, middle, end) so load drift hits both sides, their median the
denominator.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import BenchResult, Table, median
from benchmarks.plots import grouped_bars

logger = logging.getLogger(__name__)

NAME = "time_to_result"
TITLE = "Time to a result: one CaPT run against the prompt-length grid search (paper Table 2)"
GRID_METHODS = ("prompt_tuning", "ptuning_v2")
PAPER = {"prompt_tuning": 8.77, "ptuning_v2": 8.37}  # the paper's Table 2 ratios (grid search time / CaPT time)


def settings(quick: bool) -> dict[str, Any]:
    """Model, task, steps and repetitions (quick: the tiny T5 and a few steps)."""
    data_dir = os.environ.get("CAPT_DATA_DIR")
    common = {"task": "rte", "source": "local" if data_dir else "generated", "data_dir": data_dir,
              "lengths": [1, 5, 10, 20, 50, 100], "max_length": 256, "batch_size": 8}
    if quick:
        return {**common, "model": "tiny-t5", "steps": 4, "max_eval_examples": 16, "max_train_examples": 200,
                "capt_runs": 2}
    return {**common, "model": "minilm", "steps": 20, "max_eval_examples": 32, "max_train_examples": 1000,
            "capt_runs": 3}


def for_model(config: dict[str, Any], model: str) -> dict[str, Any]:
    """The settings on another model; SmolLM2 (a step of 8 x 256 tokens takes seconds on 2 CPUs) trains 10 steps."""
    return {**config, "model": model, **({"steps": 10} if model == "smollm2-135m" else {})}


def schedule(lengths: list[int], capt_runs: int) -> list[tuple[str, dict[str, Any]]]:
    """(method, options) in run order: the grid, with the CaPT repetitions spread from start to end."""
    grid: list[tuple[str, dict[str, Any]]] = [(m, {"num_tokens": n}) for n in lengths for m in GRID_METHODS]
    where = [round(i * len(grid) / max(1, capt_runs - 1)) for i in range(capt_runs)]
    order: list[tuple[str, dict[str, Any]]] = []
    for index in range(len(grid) + 1):
        order += [("capt", {})] * where.count(index)
        if index < len(grid):
            order.append(grid[index])
    return order


def run_one(config: dict[str, Any], method: str, options: dict[str, Any], output_dir: Path) -> dict[str, Any]:
    """One `pipelines.training.loop.run` job; its wall time (build + fit) and what it reports."""
    from pipelines.config.load import load_job_config
    from pipelines.training.loop import run as train_run

    task = {"name": config["task"], "source": config["source"], "max_eval_examples": config["max_eval_examples"],
            "max_train_examples": config["max_train_examples"]}
    if config["source"] == "local":
        task["data_dir"] = config["data_dir"]
    job = {"model": {"name": config["model"], "max_length": config["max_length"]}, "task": task,
           "method": {"name": method, "options": options},
           "train": {"batch_size": config["batch_size"], "eval_batch_size": 32, "max_steps": config["steps"],
                     "patience": None, "eval_mode": "rank"},
           "seed": 0, "output_dir": str(output_dir)}
    start = time.perf_counter()
    result = train_run(load_job_config(None, [], base=job))
    wall = time.perf_counter() - start
    logger.info("%s %s: %.1f s", method, options, wall)
    return {"method": method, "length": options.get("num_tokens"), "wall_s": wall, "fit_s": result["wall_time_s"],
            "steps": result["steps"], "test_score": result["metrics"].get("test_score"),
            "trainable": result["trainable_parameters"]}


def summarise(runs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Summary rows (CaPT, then each grid) and the ratios grid total / median CaPT run."""
    capt_walls = [r["wall_s"] for r in runs if r["method"] == "capt"]
    capt_fits = [r["fit_s"] for r in runs if r["method"] == "capt"]
    reference, reference_fit = median(capt_walls), median(capt_fits)
    rows = [{"what": "CaPT, one run (median of repetitions)", "runs": 1, "total_s": reference,
             "ratio": 1.0, "ratio_fit_only": 1.0, "paper": 1.0}]
    ratios = {}
    for method in GRID_METHODS:
        grid = [r for r in runs if r["method"] == method]
        total, fit_total = sum(r["wall_s"] for r in grid), sum(r["fit_s"] for r in grid)
        ratios[method] = total / reference
        rows.append({"what": f"{method} grid over lengths {[r['length'] for r in grid]}", "runs": len(grid),
                     "total_s": total, "ratio": ratios[method], "ratio_fit_only": fit_total / reference_fit,
                     "paper": PAPER[method]})
    return rows, ratios


def run(config: dict[str, Any], out_dir: Path) -> BenchResult:
    """Run the schedule in one process; tables of every run and of the totals, and a plot."""
    result = BenchResult(NAME, TITLE, config)
    with tempfile.TemporaryDirectory(prefix="bench-ttr-") as tmp:
        warm = {**config, "steps": 1}  # first-use costs (imports, tokenizer, data cache) stay out of the timing
        for method in ("capt", *GRID_METHODS):
            run_one(warm, method, {} if method == "capt" else {"num_tokens": 1}, Path(tmp) / f"warm-{method}")
        runs = [run_one(config, method, options, Path(tmp) / f"{i:02d}-{method}")
                for i, (method, options) in enumerate(schedule(config["lengths"], config["capt_runs"]))]
    reference = median([r["wall_s"] for r in runs if r["method"] == "capt"])
    for r in runs:
        r["ratio_to_capt"] = r["wall_s"] / reference
    summary, ratios = summarise(runs)
    result.tables.append(Table("Every run, in run order", ["method", "length", "trainable", "steps", "wall_s",
                                                           "fit_s", "ratio_to_capt", "test_score"], runs))
    result.tables.append(Table("Time to a result: grid search total / one CaPT run",
                               ["what", "runs", "total_s", "ratio", "ratio_fit_only", "paper"], summary))
    measured = {"CaPT": 1.0, **{f"{m} grid": v for m, v in ratios.items()}}
    paper = {"CaPT": 1.0, **{f"{m} grid": PAPER[m] for m in GRID_METHODS}}
    grouped_bars({"measured": measured, "paper (Table 2)": paper}, out_dir / "time_to_result.png",
                 "Time to a result, relative to one CaPT run", "x CaPT run")
    result.plots.append("time_to_result.png")
    result.notes += [
        f"Model {config['model']}, task {config['task']} ({config['source']} data), {config['steps']} steps of "
        f"batch {config['batch_size']} per run, max_length {config['max_length']} (virtual tokens included, so "
        "inputs are not truncated for any prompt length), validation and test on "
        f"{config['max_eval_examples']} examples each, rank evaluation, seed 0.",
        "Equal steps per run: the paper trains every grid point to convergence, so longer prompts also "
        "cost more epochs there; here only their per-step cost differs.",
        "ratio: wall time (build + train + evaluate + save) of the grid / median wall time of the CaPT "
        "repetitions; ratio_fit_only: the same with `fit` time only (no model loading). One untimed "
        "1-step run per method first takes the first-use costs (imports, tokenizer, data) out of the timing.",
    ]
    return result
