"""Run the benchmarks and write JSON results, PNG plots and the Markdown report.

    python -m benchmarks.run [--quick] [--only NAME ...] [--out DIR]    # more in --help and benchmarks/README.md

Results go to --out (<name>.json, *.png, report.md, run.json); the report covers every benchmark whose JSON is there,
so `--only` refreshes one section and keeps the others.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path
from types import ModuleType

from benchmarks import inference, learning, packing, pipeline_overhead, serving, step_cost, time_to_result
from benchmarks.common import (
    OFFLINE_ENV,
    RESULTS,
    BenchResult,
    commit_info,
    load_results,
    machine,
    markdown_table,
    now_iso,
    save_result,
    versions,
)
from benchmarks.report import write_report
from pipelines.services.folder_lock import folder_problem

logger = logging.getLogger("benchmarks.run")

BENCHMARKS: dict[str, ModuleType] = {module.NAME: module for module in (
    step_cost, time_to_result, pipeline_overhead, inference, serving, learning, packing)}
NAMED_MODELS = ("tiny-t5", "minilm", "smollm2-135m")  # `--...-model` choices: the embedded models and the real LLM


def run_benchmark(module: ModuleType, quick: bool, out_dir: Path, learning_overrides: list[str] | None = None,
                  step_cost_archs: list[str] | None = None, time_to_result_model: str | None = None,
                  serving_model: str | None = None) -> BenchResult:
    """Run one benchmark module; a failure is recorded in the result, not raised."""
    config = module.settings(quick)
    if module is learning and learning_overrides:
        config["overrides"] = [*config["overrides"], *learning_overrides]
    if module is step_cost and step_cost_archs:
        config["archs"] = [a for a in config["archs"] if a["arch"] in step_cost_archs]
    if module is time_to_result and time_to_result_model:
        config = time_to_result.for_model(config, time_to_result_model)
    if module is serving and serving_model:
        config = serving.for_model(config, serving_model)
    started, start = now_iso(), time.perf_counter()
    logger.info("=== %s (%s mode) ===", module.NAME, "quick" if quick else "full")
    try:
        result = module.run(config, out_dir)
    except Exception as err:  # noqa: BLE001 - one failing benchmark must not lose the others' results
        logger.exception("%s failed", module.NAME)
        result = BenchResult(module.NAME, module.TITLE, config, error=f"{type(err).__name__}: {err}")
    result.settings["mode"] = "quick" if quick else "full"
    result.started, result.duration_s = started, time.perf_counter() - start
    save_result(result, out_dir)
    return result


def render(result: BenchResult) -> str:
    """The benchmark's tables and target verdicts as text (printed when it ends)."""
    lines = [f"\n## {result.title} ({result.duration_s:.0f} s)"]
    if result.skipped or result.error:
        return "\n".join([*lines, f"SKIPPED: {result.skipped}" if result.skipped else f"FAILED: {result.error}"])
    for title, text in result.sections.items():
        lines += ["", title, text.strip()]
    lines += ["", *[markdown_table(t) + "\n" for t in result.tables]]
    lines += [f"target {t.name} {t.goal}: {t.measured:.4g} -> {'met' if t.met else t.detail}" for t in result.targets]
    return "\n".join(lines)


def run_info(argv: list[str], total_s: float) -> dict:
    """Date, commit, command, machine and versions for the report header."""
    return {"date": now_iso(), **commit_info(), "command": "python -m benchmarks.run " + " ".join(argv),
            "machine": machine(), "versions": versions(), "total_s": total_s}


def parse(argv: list[str]) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: every benchmark in a few minutes")
    parser.add_argument("--only", nargs="+", choices=sorted(BENCHMARKS), metavar="NAME",
                        help=f"run only these ({', '.join(BENCHMARKS)})")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results folder (default benchmarks/results)")
    parser.add_argument("--learning-override", action="append", default=[], metavar="KEY=VALUE",
                        help="override of the learning sweep config, e.g. seeds=[0] (repeatable; kept in its settings)")
    parser.add_argument("--learning-rows", nargs="+", default=[], metavar="ROW",
                        help="run only these rows of the learning grid, by label (e.g. capt head-only+anchor lora): "
                             "one piece of a grid run in pieces")
    parser.add_argument("--step-cost-archs", nargs="+", default=[], metavar="ARCH",
                        help="run step_cost on these of its architectures only (e.g. smollm2-135m)")
    parser.add_argument("--time-to-result-model", choices=NAMED_MODELS, metavar="MODEL",
                        help=f"run time_to_result on this model ({', '.join(NAMED_MODELS)})")
    parser.add_argument("--serving-model", choices=NAMED_MODELS, metavar="MODEL",
                        help=f"run serving on this model only ({', '.join(NAMED_MODELS)})")
    args = parser.parse_args(argv)
    problems = [problem] if (problem := folder_problem("--out", args.out)) else []
    known = [a["arch"] for a in step_cost.settings(args.quick)["archs"]]
    if unknown := [a for a in args.step_cost_archs if a not in known]:
        problems.append(f"--step-cost-archs: unknown {', '.join(unknown)} (step_cost's: {', '.join(known)})")
    if args.learning_rows:
        try:
            args.learning_override.append(learning.rows_override(args.learning_rows))
        except ValueError as err:
            problems.append(str(err))
    if args.learning_override and "learning" in (args.only or BENCHMARKS):
        problems += learning.override_problems(args.learning_override, args.quick)
    if problems:  # every one at once, before any benchmark runs
        parser.error("; ".join(problems))
    return args


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; exit 1 when a benchmark failed."""
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    for key, value in OFFLINE_ENV.items():
        os.environ.setdefault(key, value)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import transformers

    transformers.logging.set_verbosity_error()
    start_info, start = run_info(argv, 0.0), time.perf_counter()
    texts, failed = [], False
    for name in args.only or list(BENCHMARKS):
        result = run_benchmark(BENCHMARKS[name], args.quick, args.out, args.learning_override, args.step_cost_archs,
                               args.time_to_result_model, args.serving_model)
        failed |= result.error is not None
        texts.append(render(result))
        print(texts[-1], flush=True)
    info = {**start_info, "total_s": time.perf_counter() - start}
    (args.out / "run.json").write_text(json.dumps(info, indent=2) + "\n")
    path = write_report(load_results(args.out, list(BENCHMARKS)), info, args.out)
    print(f"\nTotal {info['total_s']:.0f} s. Report: {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
