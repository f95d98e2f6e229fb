"""The paper's decoder-only comparison on a real LLM (SmolLM2-135M), resumable over sessions (README, "A real LLM").

    CAPT_DATA_DIR=DIR python -m benchmarks.learning_llm --out benchmarks/results/learning_smollm2
    python -m benchmarks.learning_llm --out benchmarks/results/learning_smollm2 --report-only

The trials of `pipelines/configs/bench/learning_smollm2.yaml` run here, seed 0 of every cell first, in `--workers`
processes keeping their base model loaded (default one: on 2 CPUs two one-thread processes each stepped at half the
speed of one alone, 15.5 s against 7.5 s at batch 8 x 128; a sweep's Ray actors would add start-up to each of 144
trials). Each finished result.json is recorded in `<out>/trials/`, keyed by its config hash; a rerun skips a trial
whose record has the same hash and an intact `result_digest`. The report selects on validation only.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import logging
import math
import multiprocessing
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, commit_info, machine, now_iso, versions

logger = logging.getLogger(__name__)

CONFIG = "pipelines/configs/bench/learning_smollm2.yaml"
OUT = "benchmarks/results/learning_smollm2"
WORK = "outputs/bench-learning-smollm2"
REFERENCE = "capt"
UNTRAINED_FROM = "lora"  # the row whose test score before training is the bare model's (LoRA's update starts at zero)
STEP0_FROM = "capt-untrained"
"""The row whose trials score CaPT's own capsule before its first step (the instance mean, zero task vectors): the
report's `capt-step0` row; the one step these trials train is not a result and is not shown."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.learning_llm", description=__doc__.split("\n")[0])
    parser.add_argument("--config", default=CONFIG, help=f"the sweep config of the grid (default {CONFIG})")
    parser.add_argument("--out", default=OUT, help=f"where trial records and the report go (default {OUT})")
    parser.add_argument("--work", default=WORK, help=f"the job folders (checkpoints, artifacts; default {WORK})")
    parser.add_argument("--workers", type=int, default=1, help="trial processes at once, sharing the CPUs' threads")
    parser.add_argument("--limit", type=int, default=None, help="run at most this many pending trials, then report")
    parser.add_argument("--report-only", action="store_true", help="write the report from the records; train nothing")
    parser.add_argument("--update-readme", action="store_true",
                        help="also write the report into benchmarks/README.md, between its learning_smollm2 markers")
    parser.add_argument("overrides", nargs="*", help="sweep config overrides, key=value")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    out = Path(args.out)
    problems = []
    if not args.report_only and not os.environ.get("CAPT_DATA_DIR"):
        problems.append("CAPT_DATA_DIR is not set: the grid needs the real task files (<dir>/<task>/{train,val}.jsonl)")
    if args.workers < 1:
        problems.append(f"--workers={args.workers}: give 1 or more")
    if problems:
        print("error: " + "; ".join(problems) + ".", file=sys.stderr)
        return 2
    (out / "trials").mkdir(parents=True, exist_ok=True)
    if not args.report_only:
        grid = load_grid(args.config, [*args.overrides, f"storage_path={Path(args.work).resolve()}"])
        pending = [t for t in grid if record_of(out, t) is None]
        logger.info("%d trials in the grid, %d already recorded, %d to run", len(grid), len(grid) - len(pending),
                    len(pending))
        write_run_info(out, args)  # before training: a run stopped midway still says what it ran at
        run_trials(pending[: args.limit] if args.limit is not None else pending, out, args.workers)
    report = build_report(load_records(out))
    text = markdown(report)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "report.md").write_text(text)
    if args.update_readme:  # the report less its title line, between the README's markers
        from pipelines.baseline_settings import readme_with_table

        readme = REPO / "benchmarks" / "README.md"
        readme.write_text(readme_with_table(readme.read_text(encoding="utf-8"), text.split("\n", 2)[2], README_START,
                                            README_END), encoding="utf-8")
    print(text)
    return 0


README_START, README_END = "<!-- learning_smollm2 report -->\n", "<!-- end learning_smollm2 report -->"


def load_grid(config: str, overrides: list[str]) -> list:
    """The sweep's trials, seed-major (every cell's seed 0 first), then task, row and learning rate."""
    from pipelines.sweeps.config import load_sweep_config, trials

    sweep = load_sweep_config(REPO / config, overrides)
    order = {name: i for i, name in enumerate(sweep.tasks)}
    rows = {entry.key: i for i, entry in enumerate(sweep.methods)}
    return sorted(trials(sweep), key=lambda t: (t.seed, order[t.task], rows[t.method], json.dumps(t.select)))


def record_path(out: Path, trial) -> Path:
    return out / "trials" / f"{Path(trial.job['output_dir']).name}.json"


def record_of(out: Path, trial) -> dict[str, Any] | None:
    """The trial's record when it holds this exact config's intact result; None otherwise."""
    from pipelines.config.load import validate_job_config
    from pipelines.training.outputs import config_hash

    path = record_path(out, trial)
    if not path.is_file():
        return None
    record = json.loads(path.read_text(encoding="utf-8"))
    if not intact(record) or record["result"].get("config_hash") != config_hash(validate_job_config(trial.job)):
        logger.warning("%s does not hold this config's intact result: the trial runs again", path)
        return None
    return record


def intact(record: dict[str, Any]) -> bool:
    """The record's result.json still has the digest its job sealed it with."""
    from pipelines.training.outputs import RESULT_DIGEST_KEY, result_digest

    result = record.get("result") or {}
    return result.get(RESULT_DIGEST_KEY) == result_digest(result)


def run_trials(pending: list, out: Path, workers: int) -> None:
    """Train the pending trials in `workers` one-thread processes, recording each as it finishes."""
    if not pending:
        return
    context = multiprocessing.get_context("spawn")
    threads = max(1, len(os.sched_getaffinity(0)) // workers)
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context, initializer=_set_threads,
                                                initargs=(threads,)) as pool:
        futures = {pool.submit(_train, trial.job): trial for trial in pending}
        for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
            trial = futures[future]
            try:
                result, seconds = future.result()
            except Exception as err:  # one failed trial is logged; the grid goes on and a rerun retries it
                logger.error("[%d/%d] %s %s failed: %s", done, len(pending), trial.name, trial.select, err)
                continue
            record = {"trial": trial.name, "task": trial.task, "model": trial.model, "row": trial.method,
                      "seed": trial.seed, "select": trial.select, "wall_s": round(seconds, 1), "result": result}
            path = record_path(out, trial)
            path.with_suffix(".tmp").write_text(json.dumps(record, indent=1, default=str) + "\n")
            path.with_suffix(".tmp").replace(path)
            logger.info("[%d/%d] %s %s: validation %.1f, test %.1f (%.0f s)", done, len(pending), trial.name,
                        trial.select, result["metrics"].get("best_validation_score", math.nan),
                        result["metrics"].get("test_score", math.nan), seconds)


def _set_threads(threads: int) -> None:
    """A trial process's set-up: its torch threads, and its end when the runner ends (on Linux a killed runner
    would otherwise leave its workers training, orphaned, on CPUs the next run needs)."""
    import ctypes
    import signal

    import torch

    torch.set_num_threads(threads)
    if sys.platform.startswith("linux"):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    logging.basicConfig(level=logging.WARNING)


def _train(job: dict[str, Any]) -> tuple[dict[str, Any], float]:
    from pipelines.config.load import validate_job_config
    from pipelines.models.cache import BASE_MODELS
    from pipelines.training.loop import run

    started = time.perf_counter()
    result = run(validate_job_config(job), base_models=BASE_MODELS, progress_every_s=30.0)
    return result, time.perf_counter() - started


def write_run_info(out: Path, args: argparse.Namespace) -> None:
    """What ran: the commit (and whether the tree was clean), the command, machine and versions, appended per run."""
    path = out / "run.json"
    runs = json.loads(path.read_text()) if path.is_file() else []
    runs.append({"date": now_iso(), **commit_info(),
                 "command": ["python", "-m", "benchmarks.learning_llm", *sys.argv[1:]], "config": args.config,
                 "workers": args.workers, "machine": machine(), "versions": versions()})
    path.write_text(json.dumps(runs, indent=2) + "\n")


def load_records(out: Path) -> list[dict[str, Any]]:
    """Every intact trial record in `<out>/trials` (a damaged one is reported and left out)."""
    records = []
    for path in sorted((out / "trials").glob("*.json")):
        record = json.loads(path.read_text(encoding="utf-8"))
        if intact(record):
            records.append(record)
        else:
            logger.warning("%s: its result does not match its result_digest; left out of the report", path)
    return records


def build_report(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Selection on validation, test mean and std of the chosen values, the untrained row, paired differences."""
    from pipelines.sweeps.select import chosen_labels, select_label

    rows = [{"task": r["task"], "row": r["row"], "seed": r["seed"], "select": select_label(r["select"]),
             "validation": r["result"]["metrics"].get("best_validation_score"),
             "test": r["result"]["metrics"].get("test_score"),
             "untrained": r["result"]["metrics"].get("test_untrained_score"),
             "majority": r["result"]["metrics"].get("test_majority_score")} for r in records]
    chosen = chosen_labels(rows, keys=("task", "row"))
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    methods = sorted({r["row"] for r in rows} - {STEP0_FROM},
                     key=lambda m: (m != REFERENCE, not m.startswith(REFERENCE), m))
    cells: dict[str, dict[str, Any]] = {}
    for (task, row), label in chosen.items():
        picked = sorted((r for r in rows if (r["task"], r["row"], r["select"]) == (task, row, label)),
                        key=lambda r: r["seed"])
        if row != STEP0_FROM:
            cells[f"{task}|{row}"] = {"select": label, "seeds": [r["seed"] for r in picked],
                                      "test": [r["test"] for r in picked],
                                      "validation": [r["validation"] for r in picked]}
        if any(r["untrained"] is None for r in picked):  # scored only where the row asks (train.score_untrained)
            continue
        before = {UNTRAINED_FROM: "untrained", STEP0_FROM: "capt-step0"}.get(row)
        if before:  # scores before the first step, the same for every lr of a seed's split; kept per seed
            cells[f"{task}|{before}"] = {"select": "", "seeds": [r["seed"] for r in picked],
                                         "test": [r["untrained"] for r in picked], "validation": []}
    majority = {task: next(r["majority"] for r in rows if r["task"] == task) for task in tasks}
    order = ["untrained", "capt-step0", *methods]
    return {"tasks": tasks, "rows": [m for m in order if any(f"{t}|{m}" in cells for t in tasks)], "cells": cells,
            "majority": majority, "paired": paired_differences(cells, tasks, methods), "trials": len(records)}


def paired_differences(cells: dict[str, dict[str, Any]], tasks: list[str], methods: list[str]) -> dict[str, Any]:
    """CaPT minus each row, per seed both have (each at its own chosen learning rate)."""
    paired = {}
    for task in tasks:
        reference = cells.get(f"{task}|{REFERENCE}")
        if reference is None:
            continue
        mine = dict(zip(reference["seeds"], reference["test"], strict=True))
        for row in ["untrained", "capt-step0", *methods]:
            other = cells.get(f"{task}|{row}")
            if row == REFERENCE or other is None:
                continue
            diffs = [mine[s] - v for s, v in zip(other["seeds"], other["test"], strict=True) if s in mine]
            if diffs:
                paired[f"{task}|{row}"] = diffs
    return paired


def _mean_std(values: list[float]) -> str:
    if not values:
        return "-"
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.1f} ± {std:.1f} ({len(values)})"


ORDERINGS = (
    ("CaPT above P-Tuning v2 (paper, Llama-3.2-1B average: 67.51 against 61.06)", None, "ptuning_v2"),
    ("CaPT above its task-only ablation on CSQA (paper: 61.60 against 45.29)", "csqa", "capt-task-only"),
    ("a 1-token capsule above a longer one (paper, Llama-3.2-1B: 67.51 against 59.38)", None, "capt-length4"),
    ("CaPT above the untrained model", None, "untrained"),
    ("CaPT above its own capsule before training (the instance mean, zero task vectors)", None, "capt-step0"),
)
"""(claim, task or None for the average over tasks, the row CaPT is compared with)."""


def orderings(report: dict[str, Any]) -> list[tuple[str, str]]:
    """Each of the paper's orderings: holds where CaPT is above the other row on every seed (the per-seed difference
    averaged over the claim's tasks), does not hold where it is below on every seed, not told apart where the seeds
    disagree; with both means and the paired differences. "Not measured yet" while a cell lacks 3 seeds."""
    cells, verdicts = report["cells"], []
    for claim, task, row in ORDERINGS:
        tasks = [task] if task else report["tasks"]
        pairs = [(cells.get(f"{t}|{REFERENCE}"), cells.get(f"{t}|{row}")) for t in tasks]
        if not tasks or any(a is None or b is None or len(a["test"]) < 3 or len(b["test"]) < 3 for a, b in pairs):
            verdicts.append((claim, "not measured yet (3 seeds of every cell needed)"))
            continue
        mine = statistics.fmean(statistics.fmean(a["test"]) for a, _ in pairs)
        other = statistics.fmean(statistics.fmean(b["test"]) for _, b in pairs)
        by_seed = [(dict(zip(a["seeds"], a["test"], strict=True)), dict(zip(b["seeds"], b["test"], strict=True)))
                   for a, b in pairs]
        seeds = sorted(set.intersection(*(set(a) & set(b) for a, b in by_seed)))
        diffs = [statistics.fmean(a[s] - b[s] for a, b in by_seed) for s in seeds]
        if len(diffs) < 3:  # the cells' seeds do not pair up
            verdicts.append((claim, "not measured yet (3 seeds paired in every cell needed)"))
            continue
        verdict = ("holds (on every seed" if all(d > 0 for d in diffs) else
                   "does not hold (the other row is above on every seed" if all(d < 0 for d in diffs) else
                   "not told apart (the seeds disagree")
        where = task or "average over " + ", ".join(tasks)
        verdicts.append((claim, f"{verdict}; {where}: {mine:.1f} against {other:.1f}, paired by seed "
                                f"{statistics.fmean(diffs):+.1f} ± {statistics.stdev(diffs):.1f} ({len(diffs)}))"))
    return verdicts


def markdown(report: dict[str, Any]) -> str:
    """The report as Markdown: test scores (mean ± std over seeds, seed count), chosen lrs, paired differences."""
    tasks, cells = report["tasks"], report["cells"]
    lines = ["# SmolLM2-135M learning benchmark (selection on validation, test mean ± std (seeds))", "",
             f"{report['trials']} trials recorded. Weights: SmolLM2-135M-Instruct, the 4-bit GGUF release (Q4_1) "
             "dequantised to float32, not the bf16 release.", "",
             "| row | " + " | ".join(tasks) + " | average |", "|---" * (len(tasks) + 2) + "|"]
    lines.append("| majority class | " + " | ".join(f"{report['majority'][t]:.1f}" for t in tasks) + " | |")
    for row in report["rows"]:
        found = [cells.get(f"{t}|{row}") for t in tasks]
        means = [statistics.fmean(c["test"]) for c in found if c and c["test"]]
        average = f"{statistics.fmean(means):.1f}" if len(means) == len(tasks) else "-"
        lines.append(f"| {row} | " + " | ".join(_mean_std(c["test"]) if c else "-" for c in found)
                     + f" | {average} |")
    lines += ["", "Chosen learning rate (on validation):", "",
              "| row | " + " | ".join(tasks) + " |", "|---" * (len(tasks) + 1) + "|"]
    for row in report["rows"]:
        if row in ("untrained", "capt-step0"):
            continue
        lines.append(f"| {row} | " + " | ".join(cells.get(f"{t}|{row}", {}).get("select", "-") or "-"
                                                for t in tasks) + " |")
    lines += ["", "The paper's decoder-only orderings, here (complete cells only). An ordering holds where CaPT is "
              "above the other row on every seed (CaPT minus the row, paired by seed and averaged over the claim's "
              "tasks), does not hold where it is below on every seed, and is not told apart where the seeds "
              "disagree:", ""]
    lines += [f"- {claim}: {verdict}" for claim, verdict in orderings(report)]
    lines += ["", "CaPT minus each row, paired by seed (mean ± std (pairs)):", "",
              "| row | " + " | ".join(tasks) + " |", "|---" * (len(tasks) + 1) + "|"]
    for row in report["rows"]:
        if row == REFERENCE:
            continue
        lines.append(f"| {row} | " + " | ".join(_mean_std(report["paired"].get(f"{t}|{row}", [])) for t in tasks)
                     + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
