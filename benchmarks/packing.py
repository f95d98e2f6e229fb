"""Benchmark: packed training (#34), capsules per hour with K members in one loop against the same members one
after another.

For each model and K, the same K CaPT jobs are trained as one pack (`pipelines.training.packed.train_pack`) and one
after another, both through `pipelines.training.loop.run` with a shared base-model cache and as packs of one; the
ratio is against the faster sequential route (README).
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import BenchResult, Table, at_least

logger = logging.getLogger(__name__)

NAME = "packing"
TITLE = "Packed training: capsules per hour, K members in one pass of one frozen base vs one after another"
TASKS = ("rte", "cb")
MIX_TASKS = ("boolq", "cb", "copa", "multirc", "rte", "wic", "csqa")
"""The 7-task pack's members, one per task (seeds 0..6), against the same 7 trained one after another."""
LEARNING_RATES = {"minilm": (0.03, 0.1, 0.01), "tiny-t5": (0.3, 0.1, 0.03)}
"""Members' learning rates in turn: each model family's default first (`capt.config.CapsuleConfig`)."""
TARGET = ("minilm", 9, 1.2)
"""(model, K, goal): packing K members must give at least goal x the capsules per hour of the sequential route."""


def settings(quick: bool) -> dict[str, Any]:
    """Models, pack sizes and job sizes (quick: the tiny T5, K = 1 and 2, two steps); `mix`: add the 7-task pack."""
    data_dir = os.environ.get("CAPT_DATA_DIR")
    common = {"source": "local" if data_dir else "generated", "batch_size": 8, "max_length": 128}
    if quick:
        return {**common, "models": ["tiny-t5"], "ks": [1, 2], "steps": 2, "max_train_examples": 32,
                "max_eval_examples": 4, "mix": False}
    return {**common, "models": ["minilm", "tiny-t5"], "ks": [1, 3, 9], "steps": 6, "max_train_examples": 200,
            "max_eval_examples": 16, "mix": True}


def member_overrides(config: dict[str, Any], model: str, index: int, folder: Path,
                     tasks: tuple[str, ...] = TASKS) -> list[str]:
    """The key=value overrides of member `index`: its task (`tasks` in turn), seed and learning rate, then the
    config's `job_overrides` (the device check's `train.cpu=false model.dtype=bfloat16`)."""
    rates = LEARNING_RATES.get(model, (None,))
    lr = rates[index % len(rates)]
    return [f"model.name={model}", f"model.max_length={config['max_length']}",
            f"task.name={tasks[index % len(tasks)]}", f"task.source={config['source']}",
            f"task.max_train_examples={config['max_train_examples']}",
            f"task.max_eval_examples={config['max_eval_examples']}", "task.generated_size=64",
            f"train.batch_size={config['batch_size']}", f"train.max_steps={config['steps']}", "train.patience=null",
            "train.eval_mode=rank", "train.cpu=true", f"seed={index}", f"output_dir={folder / f'm{index}'}",
            *([f"optim.lr={lr}"] if lr else []), *config.get("job_overrides", [])]


def members(config: dict[str, Any], model: str, count: int, folder: Path, tasks: tuple[str, ...] = TASKS) -> list:
    """The resolved configs of the first `count` members."""
    from pipelines.config.load import load_job_config

    return [load_job_config(None, member_overrides(config, model, i, folder, tasks)) for i in range(count)]


def timed(fn) -> tuple[float, float]:
    """(wall seconds, this process's CPU seconds) of `fn()`: CPU time is what other processes on a shared machine
    change least."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def sequential_times(config: dict[str, Any], model: str, indices: range, folder: Path, cache,
                     tasks: tuple[str, ...] = TASKS) -> dict[str, list[float]]:
    """Members `indices` each alone: wall time through `pipelines.training.loop.run` (the shared base-model cache
    `cache`) and as a pack of one, each route writing to folders of its own."""
    from pipelines.training.loop import run
    from pipelines.training.packed import train_pack

    jobs = members(config, model, indices.stop, folder / "run", tasks)[indices.start:]
    packs = members(config, model, indices.stop, folder / "pack_of_one", tasks)[indices.start:]
    return {"run": [timed(lambda c=c: run(c, base_models=cache, progress_every_s=60)) for c in jobs],
            "pack_of_one": [timed(lambda c=c: train_pack([c])) for c in packs]}


def measure(config: dict[str, Any], model: str, folder: Path) -> list[dict[str, Any]]:
    """One row per K: the packed wall time, then, right after it (so both see the same machine load), the members
    new at this K alone; the sequential time of K members is the sum of their own times."""
    from pipelines.models.cache import BaseModelCache
    from pipelines.training.packed import train_pack

    # untimed: first-use costs (imports, tokenizer, data files) stay out of the timing
    train_pack(members(config, model, 1, folder / model / "warm"))
    cache, alone, rows = BaseModelCache(), {"run": [], "pack_of_one": []}, []
    for k in sorted(config["ks"]):
        configs = members(config, model, k, folder / model / f"packed-{k}")
        packed = timed(lambda configs=configs: train_pack(configs))
        for route, times in sequential_times(config, model, range(len(alone["run"]), k), folder / model,
                                             cache).items():
            alone[route] += times
        rows.append(row(model, k, packed, alone))
        logger.info("%s K=%d: %s", model, k, rows[-1])
    if config.get("mix"):
        rows.append(mixed_row(config, model, folder / model / "mix", cache))
    return rows


def mixed_row(config: dict[str, Any], model: str, folder: Path, cache) -> dict[str, Any]:
    """The 7-task pack (one member per task of `MIX_TASKS`) against the same 7 members alone, timed right after."""
    from pipelines.training.packed import train_pack

    k, config = len(MIX_TASKS), {**config, "source": "generated"}  # the local files hold no BoolQ train split
    configs = members(config, model, k, folder / "packed", MIX_TASKS)
    packed = timed(lambda: train_pack(configs))
    alone = sequential_times(config, model, range(k), folder, cache, MIX_TASKS)
    mixed = {**row(model, k, packed, alone), "tasks": ", ".join(MIX_TASKS)}
    logger.info("%s, %d-task pack: %s", model, k, mixed)
    return mixed


def row(model: str, k: int, packed: tuple[float, float], alone: dict[str, list[tuple[float, float]]]) -> dict:
    """The table row of K members: wall and CPU seconds packed and sequential (sums over the first K members alone);
    the ratios are against the faster sequential route, by wall time and by CPU time."""
    run_s, one_s = (sum(w for w, _ in alone[r][:k]) for r in ("run", "pack_of_one"))
    run_cpu, one_cpu = (sum(c for _, c in alone[r][:k]) for r in ("run", "pack_of_one"))
    best, best_cpu = min(run_s, one_s), min(run_cpu, one_cpu)
    return {"model": model, "K": k, "tasks": "/".join(TASKS) + " in turn", "packed_s": packed[0],
            "sequential_run_s": run_s, "sequential_pack_of_one_s": one_s,
            "capsules_per_hour_packed": 3600 * k / packed[0], "capsules_per_hour_sequential": 3600 * k / best,
            "ratio": best / packed[0],
            "packed_cpu_s": packed[1], "sequential_cpu_s": best_cpu, "ratio_cpu": best_cpu / packed[1]}


def run(config: dict[str, Any], out_dir: Path) -> BenchResult:
    """Every model and K; the table, and the target at K=9 on MiniLM when it was measured."""
    result = BenchResult(NAME, TITLE, config)
    with tempfile.TemporaryDirectory(prefix="bench-pack-") as tmp:
        rows = [row for model in config["models"] for row in measure(config, model, Path(tmp))]
    result.tables.append(Table("Capsules per hour: packed vs one after another",
                               ["model", "K", "tasks", "packed_s", "sequential_run_s", "sequential_pack_of_one_s",
                                "capsules_per_hour_packed", "capsules_per_hour_sequential", "ratio", "packed_cpu_s",
                                "sequential_cpu_s", "ratio_cpu"], rows))
    model, k, goal = TARGET
    for row in rows:
        if (row["model"], row["K"]) == (model, k):
            result.targets.append(at_least(f"capsules per hour, packed / sequential ({model}, K={k})",
                                           row["ratio"], goal, "x"))
    result.notes += [
        f"Members: tasks {' and '.join(TASKS)} alternating, seeds 0..K-1 (the row of {len(MIX_TASKS)} tasks: one "
        f"member per task of {', '.join(MIX_TASKS)}, seeds 0..{len(MIX_TASKS) - 1}, on generated data: the local "
        f"files hold no BoolQ train split), learning rates "
        f"{LEARNING_RATES} in turn; "
        f"{config['steps']} steps of batch {config['batch_size']} each, max_length {config['max_length']}, one "
        f"validation and one test of {config['max_eval_examples']} examples each (rank evaluation), "
        f"{config['source']} data.",
        "Sequential times are each member's own wall time, measured once per member right after the pack that first "
        "holds it (so packed and sequential runs see the same machine load); the time for K members is the sum over "
        "the first K. The ratio is against the faster sequential route. `pipelines.training.loop.run` also writes "
        "its checkpoint, artifact and result.json, which the pack does not yet do; packs of one load the base "
        "model once per member, which `run` with the shared cache does not.",
        "CPU seconds are this process's (all its threads): other processes on a shared machine change them far less "
        "than wall time; `ratio_cpu` compares those.",
        "One untimed pack of one first takes the first-use costs (imports, tokenizer, data) out of the timing.",
    ]
    return result
