"""The device check (README, "Ready for a GPU"): the step-cost table at real sizes, packed capsules per hour, a
1,000-capsule serving run and a 4-trial sweep at 0.25 GPU each, in bf16 on one GPU; `--cpu-smoke`: tiny shapes.

A part that fails is recorded in its JSON and the others still run (exit 1); GPU mode without a GPU exits 2.
`--check-imports` names every module of the parts that fails to import, in seconds: a lent machine's own packages
can refuse carried ones (grpcio-reflection at `from ray import serve`). `--merge`: one folder of several calls'.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.common import (
    OFFLINE_ENV,
    REPO,
    RESULTS,
    BenchResult,
    Table,
    at_least,
    at_most,
    interleaved,
    load_results,
    machine,
    median,
    now_iso,
    paired_ratios,
    run_logged,
    save_result,
    versions,
)
from benchmarks.report import write_report

if TYPE_CHECKING:  # torch is imported where a part runs: `--check-imports` must run where it fails to import
    import torch

logger = logging.getLogger("benchmarks.device_check")

# --- Sizes: real shapes in bf16 on one GPU, or tiny shapes on the CPU -------------------------------------------

ARCHS = ("t5-base", "llama-3.2-1b", "qwen2.5-1.5b")  # keys of `benchmarks.models.ARCHS`
TINY = {"t5-base": {"d_model": 64, "d_ff": 128, "d_kv": 16, "num_heads": 4, "num_layers": 2,
                    "num_decoder_layers": 2, "vocab_size": 1024},
        "llama-3.2-1b": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 1024},
        "qwen2.5-1.5b": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1024}}
"""Smoke shapes: 2 layers, width 64 and the test tokenizer's 1,024-token vocabulary, each architecture's own kind."""
SMOKE_METHODS = ["capt", "lora-r8", "ptuning_v2-20"]  # besides the floor (the GPU run: every step_cost.METHODS row)
PACK_GOAL = 4.0  # capsules per hour packed over sequential at the largest K (16 on the GPU)
STEP_GOAL = 1.05  # CaPT's step over the floor's
T5_LABEL = "t5-base-shape"  # the tables' name of the random-weight T5 checkpoint that jobs load by a temporary path
SWEEP_CONFIG = "pipelines/configs/bench/overhead.yaml"  # its 4 CB trials (seeds 0-3) run on the T5 checkpoint
SWEEP_TRIALS = 4  # the trials SWEEP_CONFIG holds
STEP_COLUMNS = ["method", "trainable", "model_tokens", "median_step_s", "ratio_to_floor", "ratio_range", "gflops",
                "flop_ratio_to_floor", "peak_step_mb", "persistent_mb"]
SWEEP_COLUMNS = ["trial", "model", "seed", "steps", "wall_time_s", "tokens_per_second", "peak_memory_mb", "dtype",
                 "precision", "test_score"]


@dataclass(frozen=True)
class Mode:
    """Every size of one device-check run."""

    name: str  # "gpu" (real shapes, CUDA) or "cpu-smoke" (tiny shapes, CPU)
    device: str  # torch device of the step-cost table and of the jobs
    dtype: str = "bfloat16"  # of the frozen weights and of autocast
    archs: list[dict[str, Any]] = field(default_factory=list)  # step-cost specs (`step_cost.settings`; + methods)
    rounds: int = 5  # interleaved step-cost timing rounds
    warmup: int = 2  # untimed steps of each method first
    t5_changes: dict[str, Any] = field(default_factory=dict)  # to T5-Base's shape, of the checkpoint jobs load
    pack_ks: list[int] = field(default_factory=lambda: [1, 4, 16])
    pack_steps: int = 8  # training steps of each pack member
    pack_examples: tuple[int, int] = (200, 16)  # (train, validation and test) examples per pack member
    serve_tasks: list[str] = field(default_factory=lambda: ["boolq", "cb", "copa", "multirc", "rte", "wic", "csqa"])
    # capsules per application by workload, the first of each its baseline
    serve_counts: dict[str, list[int]] = field(default_factory=lambda: {"rte": [1, 1000], "mix": [7, 1000]})
    serve_requests: int = 300  # per application and round
    serve_rounds: int = 2
    serve_gpus: float = 0.2  # GPU share of each serving replica (0: CPU replicas)
    sweep_steps: int = 30  # training steps of each sweep trial
    sweep_cpus: float = 2.0  # per sweep trial
    sweep_gpus: float = 0.25  # per sweep trial (4 trials share one GPU)
    sweep_register: bool = True  # the sweep registers its capsules and promotes champions in MLflow
    ray_cpus: int = 16  # of the local Ray the sweep starts (no --ray-address)
    timeout_s: float = 300.0  # most seconds the sweep subprocess may run
    threads: int | None = None  # torch threads here and OMP_NUM_THREADS of children (None: torch's default)

    def job_overrides(self) -> list[str]:
        """Job overrides of every packed member: the dtype, bf16 autocast and, on the GPU, CUDA."""
        device = ["train.cpu=false"] if self.device.startswith("cuda") else ["train.cpu=true"]
        return [*device, f"model.dtype={self.dtype}", "train.precision=bf16"]


def gpu_mode() -> Mode:
    """Full T5-Base, Llama-3.2-1B (all 16 layers) and Qwen2.5-1.5B (all 28) on one GPU, batch 8, n = 128."""
    archs = [{"arch": arch, "changes": {}, "batch": 8, "seq": 128, "target": 4} for arch in ARCHS]
    return Mode("gpu", "cuda", archs=archs)


def smoke_mode() -> Mode:
    """The same parts and code paths at tiny shapes on the CPU (README), on one torch thread: tiny steps on two
    threads of a loaded 2-CPU machine took 100 times longer (2.5 s, 27 ms)."""
    archs = [{"arch": arch, "changes": TINY[arch], "batch": 2, "seq": 16, "target": 4, "methods": SMOKE_METHODS}
             for arch in ARCHS]
    return Mode("cpu-smoke", "cpu", archs=archs, rounds=1, warmup=1, t5_changes=TINY["t5-base"], pack_ks=[1, 2],
                pack_steps=2, pack_examples=(32, 4), serve_tasks=["rte"],
                serve_counts={"rte": [1, 3]}, serve_requests=4, serve_rounds=1, serve_gpus=0.0,
                sweep_steps=2, sweep_cpus=0.25, sweep_gpus=0.0, sweep_register=False, ray_cpus=2, timeout_s=240.0,
                threads=1)


# --- (a) Step cost on the device --------------------------------------------------------------------------------
# `step_cost`'s steps, each waited for on the device, under autocast in the base model's dtype (`train.precision`).


def synced(step: Callable[[], None], device: torch.device, dtype: torch.dtype) -> Callable[[], None]:
    """`step` under autocast to `dtype`, returning once the device has finished it (so wall time is its time)."""
    import torch

    def run() -> None:
        with torch.autocast(device.type, dtype=dtype):
            step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    return run


def peak_step_bytes(step: Callable[[], None], device: torch.device) -> float:
    """Peak CUDA memory of one step above the level at its start (`torch.cuda.max_memory_allocated`; NaN elsewhere:
    `step_cost` measures the CPU's from the profiler's allocation events)."""
    import torch

    if device.type != "cuda":
        return float("nan")
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    start = torch.cuda.memory_allocated(device)
    step()
    return torch.cuda.max_memory_allocated(device) - start


def measure_arch(spec: dict[str, Any], device: torch.device, dtype: torch.dtype, rounds: int,
                 warmup: int) -> list[dict[str, Any]]:
    """The table rows of every `step_cost` method and the floor on one architecture, on `device` in `dtype`."""
    import torch

    from benchmarks import step_cost
    from benchmarks.profiling import count_flops

    methods = {k: step_cost.METHODS[k] for k in spec.get("methods", step_cost.METHODS)}
    runners, steps = step_cost.method_steps(spec, methods, device, dtype)
    steps = {label: synced(step, device, dtype) for label, step in steps.items()}
    wall, _ = interleaved(steps, rounds=rounds, warmup=warmup)
    ratios = paired_ratios(wall, step_cost.FLOOR)
    peaks = {label: peak_step_bytes(step, device) for label, step in steps.items()}
    flops = {label: count_flops(step) for label, step in steps.items()}
    rows = [step_cost._row(label, runners.get(label), wall[label], ratios[label], peaks[label], spec["seq"])
            | {"gflops": flops[label] / 1e9, "flop_ratio_to_floor": flops[label] / flops[step_cost.FLOOR]}
            for label in steps]
    del runners, steps
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rows


def step_cost_part(mode: Mode, tmp: Path, out: Path) -> BenchResult:
    """(a) The step-cost table at the mode's shapes, on its device in its dtype: one table per architecture, and
    CaPT's step against the floor (peak step memory: `peak_step_bytes`)."""
    import torch

    from benchmarks import models

    result = BenchResult("device_step_cost", "Training step cost against the frozen floor, on the device",
                         {"archs": mode.archs, "device": mode.device, "dtype": mode.dtype, "rounds": mode.rounds,
                          "warmup": mode.warmup, "target_ratio": STEP_GOAL})
    device, dtype = torch.device(mode.device), getattr(torch, mode.dtype)
    for spec in mode.archs:
        rows = measure_arch(spec, device, dtype, mode.rounds, mode.warmup)
        shape = models.describe(models.config_for(spec["arch"], **spec["changes"]))
        result.tables.append(Table(f"{spec['arch']} ({shape}), {mode.dtype} on {device.type}: batch "
                                   f"{spec['batch']}, n = {spec['seq']}, {spec['target']} target tokens",
                                   STEP_COLUMNS, rows))
        capt = next(r for r in rows if r["method"] == "capt")
        result.targets.append(at_most(f"CaPT step / floor ({spec['arch']}, {device.type})", capt["ratio_to_floor"],
                                      STEP_GOAL))
        logger.info("%s: CaPT / floor %.3f", spec["arch"], capt["ratio_to_floor"])
    result.notes.append(f"ratio_to_floor: median over {mode.rounds} round(s) of the method's step time over the "
                        "floor's in the same round (methods interleaved), each step waited for on the device; "
                        "gflops counted from op shapes (torch.utils.flop_counter); peak_step_mb above the step's "
                        "starting level, gradients included.")
    result.notes.append(f"CaPT step over floor median: {median([t.measured for t in result.targets]):.3f}.")
    return result


# --- (b, c) Packing and serving on the T5 checkpoint ------------------------------------------------------------


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


# --- (d) The sweep: `python pipelines/sweep.py` in a subprocess, as a user starts it ----------------------------
# Its Ray is a local one of its own (`--num-cpus`) unless `ray_address` is given (then RAY_ADDRESS), and its MLflow
# server a local one unless `tracking_uri` is given: a test passes the session's Ray head and server.


def trial_row(result: dict[str, Any]) -> dict[str, Any]:
    """One trial's table row from its result.json."""
    job = result["config"]
    return {"trial": Path(result["artifact_dir"]).parent.name, "model": result["model"], "seed": result["seed"],
            "steps": result["steps"], "wall_time_s": result["wall_time_s"],
            "tokens_per_second": result.get("tokens_per_second"), "peak_memory_mb": result.get("peak_memory_mb"),
            "dtype": job["model"]["dtype"], "precision": job["train"]["precision"],
            "test_score": result["metrics"].get("test_score")}


def sweep_overrides(mode: Mode, folder: Path) -> list[str]:
    """The sweep config's overrides that size it: the checkpoint, the mode's dtype, steps, shares, registration."""
    register = str(mode.sweep_register).lower()
    return [f"models=[{folder}]", f"job.model.dtype={mode.dtype}", "job.train.precision=bf16",
            f"job.train.max_steps={mode.sweep_steps}", f"job.train.eval_every_steps={mode.sweep_steps}",
            f"resources.cpus_per_worker={mode.sweep_cpus}", f"resources.gpus_per_worker={mode.sweep_gpus}",
            "resources.max_concurrent_trials=4", f"tracking.register={register}", f"tracking.promote={register}"]


def sweep_part(mode: Mode, tmp: Path, out: Path, ray_address: str | None, tracking_uri: str | None) -> BenchResult:
    """(d) One real sweep of 4 trials sharing the device; one row per finished trial, and the sweep's wall time
    against the trials' own."""
    from pipelines.services.probe import log_tail
    from pipelines.sweeps.config import load_sweep_config

    folder = t5_checkpoint(mode, tmp)
    sizes = sweep_overrides(mode, folder)
    overrides = [*sizes, "name=device-check", f"storage_path={tmp / 'sweeps'}", f"tracking.local_dir={tmp / 'mlflow'}",
                 *([f"tracking.uri={tracking_uri}"] if tracking_uri else [])]
    sweep = load_sweep_config(REPO / SWEEP_CONFIG, overrides)
    cmd = [sys.executable, "pipelines/sweep.py", "--config", SWEEP_CONFIG,
           *([] if ray_address else ["--num-cpus", str(mode.ray_cpus)]), *overrides]
    env = {**OFFLINE_ENV, **({"RAY_ADDRESS": ray_address} if ray_address else {})}
    log = out / "device_sweep.log"
    logger.info("sweep: %s", " ".join(cmd))
    code, wall = run_logged(cmd, log, env=env, timeout=mode.timeout_s)
    if code != 0:
        raise RuntimeError(f"the sweep exited with {code}; last lines of its log:\n{log_tail(log, lines=25)}")
    results = [json.loads(p.read_text()) for p in sorted((sweep.storage_root() / sweep.name / "jobs").glob(
        "*/result.json"))]
    rows = [trial_row(r) for r in results]
    fit = sum(r["wall_time_s"] for r in rows)
    result = BenchResult("device_sweep", "A sweep of 4 trials sharing the device",
                         {"config": SWEEP_CONFIG, "overrides": sizes, "ray_address": ray_address,
                          "tracking_uri": tracking_uri, "num_cpus": mode.ray_cpus, "timeout_s": mode.timeout_s,
                          "log": str(log)})
    result.tables += [Table("Trials (result.json)", SWEEP_COLUMNS, rows),
                      Table("The sweep", ["trials", "sweep_wall_s", "trials_fit_s", "fit_over_wall"],
                            [{"trials": len(rows), "sweep_wall_s": wall, "trials_fit_s": fit,
                              "fit_over_wall": fit / wall}])]
    result.targets.append(at_least("sweep trials finished", len(rows), SWEEP_TRIALS))
    result.notes.append("sweep_wall_s: the whole `pipelines/sweep.py` process (services' start-up and shutdown "
                        "included when it starts its own); fit_over_wall above 1 means trials overlapped.")
    return relabel(result, folder)


# --- The parts, and what each imports ---------------------------------------------------------------------------

PARTS: dict[str, tuple[str, Callable[..., BenchResult]]] = {
    "device_step_cost": ("Training step cost against the frozen floor, on the device", step_cost_part),
    "device_packing": ("Packed training: capsules per hour on the T5-Base shape", packing_part),
    "device_serving": ("Serving: one base model, many capsules", serving_part),
    "device_sweep": ("A sweep of 4 trials sharing the device", sweep_part),
}
"""Part name -> (title, function(mode, temporary folder, results folder, ...)); each writes `<name>.json`, and a
part's log, where it writes one, is `<name>.log` beside it."""
PART_MODULES: dict[str, tuple[str, ...]] = {
    "device_step_cost": ("torch", "transformers", "peft", "capt", "benchmarks.step_cost", "benchmarks.models",
                         "benchmarks.profiling"),
    "device_packing": ("accelerate", "datasets", "pipelines.train", "pipelines.training.packed", "benchmarks.packing"),
    "device_serving": ("ray", "ray.serve", "mlflow", "pipelines.serving.app", "pipelines.services.ray_connect",
                       "benchmarks.serving", "benchmarks.serving_app", "benchmarks.serving_engine"),
    "device_sweep": ("ray.tune", "ray.train", "mlflow", "mlflow.server", "pipelines.sweeps.run",
                     "pipelines.tracking", "pipelines.services.probe"),
}
"""Part name -> the modules its code imports (directly or inside functions) beyond this module."""


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


# --- Several calls' folders as one ------------------------------------------------------------------------------


def merged_info(sources: list[Path]) -> dict[str, Any]:
    """The last call's `run.json` with every call listed, versions filled from the calls that had the package."""
    runs = [json.loads((s / "run.json").read_text(encoding="utf-8")) for s in sources if (s / "run.json").is_file()]
    if not runs:
        raise ValueError(f"no run.json in any of {[str(s) for s in sources]}")
    info = dict(runs[-1])
    found: dict[str, str] = {}
    for run in runs:
        found.update({k: v for k, v in run["versions"].items() if v != "not installed" or k not in found})
    info.update(date=runs[0]["date"], versions=found, total_s=sum(run["total_s"] for run in runs),
                command=" ; ".join(run["command"] for run in runs),
                calls=[{key: run[key] for key in ("date", "command", "total_s", "versions")} for run in runs])
    return info


def merge(sources: list[Path], out: Path) -> Path:
    """Write the merged folder `out`: for every part the JSON of the last folder where it succeeded (else the last
    where it failed) and its log, a `run.json` listing every call, and a regenerated report.md (its path)."""
    picked: dict[str, tuple[Path, BenchResult]] = {}  # part name -> (folder, result)
    for source in sources:
        for result in load_results(source, list(PARTS)):
            if result.name not in picked or not result.error or picked[result.name][1].error:
                picked[result.name] = (source, result)
    if not picked:
        raise ValueError(f"no device-check part JSON in any of {[str(s) for s in sources]}")
    info = merged_info(sources)
    out.mkdir(parents=True, exist_ok=True)
    for name, (source, _) in picked.items():
        for file in (f"{name}.json", f"{name}.log"):
            if (source / file).is_file() and (source / file).resolve() != (out / file).resolve():
                shutil.copyfile(source / file, out / file)
    (out / "run.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return write_report([picked[name][1] for name in PARTS if name in picked], info, out)


# --- Command line -----------------------------------------------------------------------------------------------


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
    parser.add_argument("--merge", nargs="+", type=Path, metavar="DIR",
                        help="only merge these result folders (earliest first) into --out, runs nothing")
    args = parser.parse_args(argv)
    if not args.check_imports:  # (imported here: --check-imports reports a missing package itself, as a paragraph)
        from pipelines.services.folder_lock import folder_problem

        if problem := folder_problem("--out", args.out):
            parser.error(problem)
    return args


def check_imports(parts: list[str]) -> int:
    """`--check-imports`: 0 when every module of `parts` imports, else 2 with one paragraph naming each failure (its
    part, its name and the error)."""
    owners: dict[str, str] = {}  # module -> the first of `parts` that imports it: each module is tried once
    for part in parts:
        owners.update({module: part for module in PART_MODULES[part] if module not in owners})
    problems = []
    for module, part in owners.items():
        try:
            importlib.import_module(module)
        except Exception as err:  # noqa: BLE001 - any failure to import is what this reports
            problems.append(f"{part}: import {module} failed: {type(err).__name__}: {err}")
    if problems:
        print(f"error: {len(problems)} import(s) of the device check fail here: " + "; ".join(problems) +
              ". Install or carry the missing packages (versions as in pyproject.toml) and check again.",
              file=sys.stderr)
        return 2
    print(f"Every module of {', '.join(parts)} imports.")
    return 0


def run_parts(args: argparse.Namespace, argv: list[str]) -> int:
    """Run the chosen parts in the mode's sizes; 0 when every part ran, 1 when one failed, 2 for GPU mode without
    a GPU."""
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
            "machine": {**machine(), **gpu_info()}, "versions": versions(), "settings": asdict(mode)}
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


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: the parts (`run_parts`), or only `--check-imports`, or only `--merge` (0 with the merged
    report's path, 2 when the folders hold nothing to merge)."""
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    for key, value in OFFLINE_ENV.items():
        os.environ.setdefault(key, value)
    if args.check_imports:
        return check_imports(args.only or list(PARTS))
    if args.merge:
        try:
            path = merge(args.merge, args.out)
        except (ValueError, OSError, KeyError, json.JSONDecodeError) as err:
            print(f"error: cannot merge {[str(s) for s in args.merge]}: {err}", file=sys.stderr)
            return 2
        print(f"Merged report: {path}")
        return 0
    return run_parts(args, argv)


if __name__ == "__main__":
    sys.exit(main())
