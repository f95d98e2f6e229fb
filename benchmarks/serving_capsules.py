"""The serving benchmark's capsules: one short real CaPT job per task and base model, and on-disk copies of them.

A set of N capsules holds, for N = 1, the RTE capsule alone; for N >= the number of tasks, the real capsules
followed by copies of them in turn (capsule i is a copy of task i mod T, in a folder of its own, loaded under a
name of its own), so that requests cycling through the set mix the tasks in the same proportions at every N.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SINGLE = "rte"
"""The task of the one-capsule application."""


def train_capsules(directory: Path, model: str, tasks: Sequence[str], steps: int) -> dict[str, dict[str, Any]]:
    """One short real CaPT job of `model` per task (generated data); {task: its result dict}."""
    from pipelines.config.load import load_job_config
    from pipelines.train import run

    results = {}
    for task in tasks:
        job = load_job_config(None, [], base={
            "model": {"name": model, "max_length": 96},
            "task": {"name": task, "source": "generated", "generated_size": 16, "max_eval_examples": 4},
            "method": {"name": "capt"}, "output_dir": str(directory / task),
            "train": {"batch_size": 8, "eval_batch_size": 8, "max_steps": steps, "eval_every_steps": steps,
                      "eval_mode": "rank", "patience": None}})
        results[task] = run(job)
    return results


def _served(name: str, task: str, folder: Path, results: dict[str, dict[str, Any]]) -> Any:
    from pipelines.serving.engine import ServedCapsule

    return ServedCapsule(name, task, f"local-{name}", 1, folder, results[task])


def capsule_sets(results: dict[str, dict[str, Any]], counts: Sequence[int], directory: Path) -> dict[int, list]:
    """{count: served capsules}: 1 is RTE alone; a larger count the real capsules (in `results`' order), then
    on-disk copies of them in turn, each copy its own folder and name."""
    tasks = list(results)
    sets = {}
    for count in counts:
        if count == 1:
            sets[count] = [_served(SINGLE, SINGLE, Path(results[SINGLE]["artifact_dir"]), results)]
            continue
        chosen = []
        for i in range(count):
            task = tasks[i % len(tasks)]
            folder = Path(results[task]["artifact_dir"])
            if i >= len(tasks):
                folder = Path(shutil.copytree(folder, directory / f"copy-{count}-{i}-{task}"))
            chosen.append(_served(task if i < len(tasks) else f"{task}-{i}", task, folder, results))
        sets[count] = chosen
    return sets


def extra_capsule(results: dict[str, dict[str, Any]], directory: Path) -> Any:
    """One more capsule (a copy of RTE's, under a new name) for the hot add into a running application."""
    folder = Path(shutil.copytree(Path(results[SINGLE]["artifact_dir"]), directory / "added-rte"))
    return _served("rte-added", SINGLE, folder, results)


def weight_bytes(folder: str | Path) -> int:
    """Bytes of the weights a capsule loads: capsule.safetensors and, for encoder classifiers, head.safetensors."""
    return sum(path.stat().st_size for path in Path(folder).glob("*.safetensors"))
