"""Ready for a GPU (#34, item 5): the step-cost table at real sizes, packed capsules per hour, a 1,000-capsule
serving run and a 4-trial sweep at 0.25 GPU each, in bf16 on one GPU within 10 minutes (random weights at real
shapes, no network); `--cpu-smoke` runs the same parts at tiny shapes on the CPU.

    bash benchmarks/device_check.sh --out DIR              # on a machine with a CUDA GPU
    bash benchmarks/device_check.sh --cpu-smoke --out DIR  # anywhere (CI)

Writes `<part>.json`, `run.json` (machine, GPU, versions) and `report.md` under --out, as `benchmarks.run` does;
a part that fails is recorded in its JSON and the others still run (exit 1). GPU mode without a GPU: exit 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.common import OFFLINE_ENV, RESULTS, BenchResult, at_least, machine, now_iso, save_result, versions
from benchmarks.device_settings import PACK_GOAL, STEP_GOAL, Mode, gpu_mode, smoke_mode
from benchmarks.report import write_report

logger = logging.getLogger("benchmarks.device_check")

T5_LABEL = "t5-base-shape"
"""How tables name the random-weight T5 checkpoint the jobs load by its temporary path."""
SWEEP_CONFIG = "pipelines/configs/bench/overhead.yaml"
"""The sweep whose 4 CB trials (seeds 0-3) the check runs, on the T5 checkpoint."""


def t5_checkpoint(mode: Mode, tmp: Path) -> Path:
    """The T5-Base-shaped random checkpoint of this run (written once, in `mode.dtype`)."""
    import torch

    from benchmarks import models

    folder = tmp / T5_LABEL
    if not (folder / "config.json").is_file():
        models.save_random_checkpoint("t5-base", folder, getattr(torch, mode.dtype), **mode.t5_changes)
    return folder


def relabel(result: BenchResult, path: Path) -> BenchResult:
    """Name the checkpoint `T5_LABEL` instead of its temporary path in the tables' model column and the targets."""
    for table in result.tables:
        for row in table.rows:
            if row.get("model") == str(path):
                row["model"] = T5_LABEL
    for target in result.targets:
        target.name = target.name.replace(str(path), T5_LABEL)
    return result


def step_cost_part(mode: Mode, tmp: Path, out: Path) -> BenchResult:
    """(a) The step-cost table at the mode's shapes, on its device in its dtype."""
    from benchmarks import device_steps

    return device_steps.run({"archs": mode.archs, "device": mode.device, "dtype": mode.dtype, "rounds": mode.rounds,
                             "warmup": mode.warmup, "target_ratio": STEP_GOAL})


def packing_part(mode: Mode, tmp: Path, out: Path) -> BenchResult:
    """(b) Packed capsules per hour against the same members one after another, on the T5 checkpoint."""
    from benchmarks import packing

    folder = t5_checkpoint(mode, tmp)
    config = {**packing.settings(quick=True), "source": "generated", "models": [str(folder)], "ks": mode.pack_ks,
              "steps": mode.pack_steps, "max_train_examples": mode.pack_examples[0],
              "max_eval_examples": mode.pack_examples[1], "job_overrides": mode.job_overrides()}
    result = relabel(packing.run(config, tmp), folder)
    k = max(mode.pack_ks)
    row = next(r for r in result.tables[0].rows if r["K"] == k)
    result.targets = [at_least(f"capsules per hour, packed / sequential ({T5_LABEL}, K={k})", row["ratio"],
                               PACK_GOAL, "x")]
    return result


def serving_part(mode: Mode, tmp: Path, out: Path, ray_address: str | None) -> BenchResult:
    """(c) The Serve app with the mode's capsule counts (1,000 on the GPU) on the T5 checkpoint, on a local Ray or
    on `ray_address`'s cluster."""
    from benchmarks import serving
    from pipelines.services.ray_connect import environ

    folder = t5_checkpoint(mode, tmp)
    config = {**serving.settings(quick=True), "models": [str(folder)], "tasks": mode.serve_tasks,
              "task_counts": mode.serve_counts, "requests": {str(folder): mode.serve_requests},
              "rounds": mode.serve_rounds, "engine_rounds": mode.serve_rounds, "num_gpus": mode.serve_gpus,
              "train_steps": 2, "dtype": mode.dtype}
    with environ(**({"RAY_ADDRESS": ray_address} if ray_address else {})):
        return relabel(serving.run(config, tmp), folder)


def sweep_part(mode: Mode, tmp: Path, out: Path, ray_address: str | None, tracking_uri: str | None) -> BenchResult:
    """(d) One real sweep of 4 trials sharing the device (`pipelines/sweep.py` in a subprocess)."""
    from benchmarks import device_sweep

    overrides = [f"models=[{t5_checkpoint(mode, tmp)}]", f"job.model.dtype={mode.dtype}",
                 "job.train.precision=bf16", f"job.train.max_steps={mode.sweep_steps}",
                 f"job.train.eval_every_steps={mode.sweep_steps}", f"resources.cpus_per_worker={mode.sweep_cpus}",
                 f"resources.gpus_per_worker={mode.sweep_gpus}", "resources.max_concurrent_trials=4",
                 f"tracking.register={str(mode.sweep_register).lower()}",
                 f"tracking.promote={str(mode.sweep_register).lower()}"]
    config = {"config": SWEEP_CONFIG, "overrides": overrides, "ray_address": ray_address,
              "tracking_uri": tracking_uri, "num_cpus": mode.ray_cpus, "timeout_s": mode.timeout_s,
              "log": str(out / "device_sweep.log")}
    return relabel(device_sweep.run(config, tmp), t5_checkpoint(mode, tmp))


PARTS: dict[str, tuple[str, Callable[..., BenchResult]]] = {
    "device_step_cost": ("Training step cost against the frozen floor, on the device", step_cost_part),
    "device_packing": ("Packed training: capsules per hour on the T5-Base shape", packing_part),
    "device_serving": ("Serving: one base model, many capsules", serving_part),
    "device_sweep": ("A sweep of 4 trials sharing the device", sweep_part),
}
"""Part name -> (title, function(mode, temporary folder, results folder, ...)); each writes `<name>.json`."""


def run_part(name: str, mode: Mode, tmp: Path, out: Path, *extra: str | None) -> BenchResult:
    """Run one part; a failure is recorded in its result, not raised (the other parts still run)."""
    from pipelines.sweeps.trial_process import forget_accelerate_state

    title, part = PARTS[name]
    started, start = now_iso(), time.perf_counter()
    logger.info("=== %s (%s) ===", name, mode.name)
    try:
        forget_accelerate_state()  # each part's jobs start from no Accelerate state, as a reused trial process's do
        result = part(mode, tmp, out, *extra)
    except Exception as err:  # noqa: BLE001 - one failing part must not lose the others' results
        logger.exception("%s failed", name)
        result = BenchResult(name, title, {}, error=f"{type(err).__name__}: {err}")
    result.name, result.title = name, title
    result.settings["mode"] = mode.name
    result.started, result.duration_s = started, time.perf_counter() - start
    save_result(result, out)
    return result


def gpu_info() -> dict[str, object]:
    """The CUDA device torch sees (name, memory, CUDA and cuDNN versions), or that there is none."""
    import torch

    if not torch.cuda.is_available():
        return {"gpu": "none (torch.cuda.is_available() is False)"}
    props = torch.cuda.get_device_properties(0)
    return {"gpu": f"{props.name}, {props.total_memory / 2**30:.0f} GiB", "gpu_count": torch.cuda.device_count(),
            "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version()}


def parse(argv: list[str]) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(prog="bash benchmarks/device_check.sh", description=__doc__.split("\n")[0])
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny shapes on the CPU (CI); default: GPU mode")
    parser.add_argument("--out", type=Path, default=RESULTS / "device_check", help="results folder")
    parser.add_argument("--only", nargs="+", choices=list(PARTS), metavar="PART", help=f"some of {', '.join(PARTS)}")
    parser.add_argument("--ray-address", default=None, help="serve and sweep on this Ray cluster (default: local Rays)")
    parser.add_argument("--tracking-uri", default=None, help="the sweep's MLflow server (default: a local one)")
    parser.add_argument("--check-imports", action="store_true",
                        help="only import what the parts need, report every failure, exit 2 on one (no GPU needed)")
    args = parser.parse_args(argv)
    if not args.check_imports:  # (imported here: --check-imports reports a missing package itself, as a paragraph)
        from pipelines.training.folder_checks import folder_problem

        if problem := folder_problem("--out", args.out):
            parser.error(problem)
    return args


def check_imports(parts: list[str]) -> int:
    """`--check-imports`: 0 when every module of `parts` imports, else 2 with one paragraph naming each failure."""
    from benchmarks.device_imports import import_problems

    problems = import_problems(parts)
    if problems:
        print(f"error: {len(problems)} import(s) of the device check fail here: " + "; ".join(problems) +
              ". Install or carry the missing packages (versions as in pyproject.toml) and check again.",
              file=sys.stderr)
        return 2
    print(f"Every module of {', '.join(parts)} imports.")
    return 0


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: exit 0 when every part ran, 1 when one failed, 2 for GPU mode without a GPU (or, with
    `--check-imports`, for a module that does not import)."""
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    for key, value in OFFLINE_ENV.items():
        os.environ.setdefault(key, value)
    if args.check_imports:
        return check_imports(args.only or list(PARTS))
    import torch

    if not args.cpu_smoke and not torch.cuda.is_available():
        print("error: GPU mode needs a CUDA GPU and torch sees none; run with --cpu-smoke for the CPU smoke run",
              file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    mode = smoke_mode() if args.cpu_smoke else gpu_mode()
    if mode.threads:
        torch.set_num_threads(mode.threads)
        os.environ.setdefault("OMP_NUM_THREADS", str(mode.threads))
    info = {"date": now_iso(), "command": "bash benchmarks/device_check.sh " + " ".join(argv),
            "machine": {**machine(), **gpu_info()}, "versions": versions(), "settings": mode.to_dict()}
    start, results = time.perf_counter(), []
    with tempfile.TemporaryDirectory(prefix="capt-device-check-") as tmp:
        for name in args.only or list(PARTS):
            extra = {"device_serving": (args.ray_address,),
                     "device_sweep": (args.ray_address, args.tracking_uri)}.get(name, ())
            results.append(run_part(name, mode, Path(tmp), args.out, *extra))
    info["total_s"] = time.perf_counter() - start
    (args.out / "run.json").write_text(json.dumps(info, indent=2) + "\n")
    path = write_report(results, info, args.out)
    failed = [r.name for r in results if r.error]
    parts = ", ".join(f"{r.name} {r.duration_s:.0f} s" for r in results)
    print(f"Total {info['total_s']:.0f} s ({mode.name}: {parts}); failed: {', '.join(failed) or 'none'}. "
          f"Report: {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
