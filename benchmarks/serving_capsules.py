"""The serving benchmark's capsules: one short real CaPT job per task and base model, and perturbed copies of them.

"rte": N distinct RTE capsules (the real one, then copies with moved values); "mix": every task's real capsule, then
perturbed copies in turn, so requests cycling through a set mix the tasks alike at every N. A smaller set is the start
of the larger one of its workload.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

SINGLE = "rte"  # the task of the one-capsule application and of the "rte" workload
MIX = "mix"  # the workload of every task's rows


def train_capsules(directory: Path, model: str, tasks: Sequence[str], steps: int,
                   dtype: str = "float32") -> dict[str, dict[str, Any]]:
    """One short real CaPT job of `model` per task (generated data); {task: its result dict}. With `dtype`
    "bfloat16" the frozen base is bf16 under bf16 autocast, and the engine serves it in bf16 (the job's dtype)."""
    from pipelines.config.load import load_job_config
    from pipelines.training.loop import run

    precision = {"bfloat16": "bf16", "float16": "fp16"}.get(dtype, "auto")
    results = {}
    for task in tasks:
        job = load_job_config(None, [], base={
            "model": {"name": model, "max_length": 96, "dtype": dtype},
            "task": {"name": task, "source": "generated", "generated_size": 16, "max_eval_examples": 4},
            "method": {"name": "capt"}, "output_dir": str(directory / task),
            "train": {"batch_size": 8, "eval_batch_size": 8, "max_steps": steps, "eval_every_steps": steps,
                      "eval_mode": "rank", "patience": None, "precision": precision}})
        results[task] = run(job)
    return results


def _served(name: str, task: str, folder: Path, results: dict[str, dict[str, Any]]) -> Any:
    from pipelines.serving.records import ServedCapsule

    return ServedCapsule(name, task, f"local-{name}", 1, folder, results[task])


def perturbed_copy(source: Path, target: Path, seed: int) -> Path:
    """A copy of the capsule artifact `source` at `target` whose capsule values each move by N(0, 1e-3) (a generator
    seeded with `seed`), sealed again (its digest manifest rewritten). An encoder classifier's task head is copied
    unchanged: the capsule's base-model fingerprint covers it."""
    import torch
    from safetensors.torch import load_file, save_file

    from capt.digest import seal

    shutil.copytree(source, target)
    path = target / "capsule.safetensors"
    generator = torch.Generator().manual_seed(seed)
    moved = {name: value + 1e-3 * torch.randn(value.shape, generator=generator, dtype=value.dtype)
             for name, value in load_file(str(path)).items()}
    save_file(moved, str(path), metadata={"format": "pt"})
    seal(target)
    return target


def capsule_sets(results: dict[str, dict[str, Any]], plan: Mapping[str, Sequence[int]],
                 directory: Path) -> dict[tuple[str, int], list]:
    """{(workload, count): served capsules} for `plan` {workload: counts}; workload `SINGLE` (RTE capsules) or
    `MIX` (every task of `results`, in its order)."""
    sets = {}
    for workload, counts in plan.items():
        tasks = [SINGLE] if workload == SINGLE else list(results)
        largest = [_member(results, tasks, i, directory / workload) for i in range(max(counts))]
        sets.update({(workload, count): largest[:count] for count in counts})
    return sets


def _member(results: dict[str, dict[str, Any]], tasks: list[str], i: int, folder: Path) -> Any:
    """Capsule i of a set: task i mod T, the real capsule the first time, a perturbed copy after."""
    task = tasks[i % len(tasks)]
    source = Path(results[task]["artifact_dir"])
    if i < len(tasks):
        return _served(task, task, source, results)
    return _served(f"{task}-{i}", task, perturbed_copy(source, folder / f"{i}-{task}", seed=i), results)


def extra_capsule(results: dict[str, dict[str, Any]], directory: Path) -> Any:
    """One more RTE capsule (a perturbed copy, under a new name) for the hot add into a running application."""
    folder = perturbed_copy(Path(results[SINGLE]["artifact_dir"]), directory / "added-rte", seed=10**6)
    return _served("rte-added", SINGLE, folder, results)


def write_manifest(capsules: Sequence[Any], path: Path) -> Path:
    """An application's capsules as a JSON Lines file for its replica to read a line at a time (`read_manifest`), as
    registry versions are fetched: constructor arguments Serve would keep for the replica's lifetime."""
    lines = [json.dumps({"name": c.name, "task": c.task, "model_name": c.model_name, "version": c.version,
                         "capsule_dir": str(c.capsule_dir),
                         "result_file": str(Path(c.result["artifact_dir"]).parent / "result.json")})
             for c in capsules]
    path.write_text("\n".join(lines) + "\n")
    return path


def read_manifest(path: str | Path) -> Iterator[Any]:
    """The `ServedCapsule`s of `write_manifest`'s file, a line at a time (no list of them all), each with its own
    parsed result (no two share one dict), as a registry source yields versions."""
    from pipelines.serving.records import ServedCapsule

    with Path(path).open(encoding="utf-8") as lines:
        for line in lines:
            entry = json.loads(line)
            yield ServedCapsule(entry["name"], entry["task"], entry["model_name"], entry["version"],
                                entry["capsule_dir"], json.loads(Path(entry["result_file"]).read_text()))


def weight_bytes(folder: str | Path) -> int:
    """Bytes of the weights a capsule loads: capsule.safetensors and, for encoder classifiers, head.safetensors."""
    return sum(path.stat().st_size for path in Path(folder).glob("*.safetensors"))
