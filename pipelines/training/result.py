"""What a finished job's result.json says beside its scores: the optimiser it ran with and its table default,
the reference levels its test score is measured against, whether DDP kept the ranks equal, peak memory, and its data
in a few lines (the dataset card: task, real or generated, where it came from, split sizes, a content hash and sample
rows; the tracker logs it as the run's MLflow dataset input)."""

from __future__ import annotations

import hashlib
import json
from typing import Any, Protocol

import torch

from capt import tasks
from capt.methods import optim_default
from capt.tasks.levels import reference_levels
from capt.tasks.loading import single_label_warning
from pipelines.config.schema import ResolvedJobConfig, TaskSection, model_slug, warmup_steps
from pipelines.training.checkpoint import LoopState
from pipelines.training.outputs import config_hash


class TrainedJob(Protocol):
    """What a result reads of the job it describes: a single job (`pipelines.training.setup.Job`) or a pack member
    (`pipelines.training.pack_setup.Member`)."""

    config: ResolvedJobConfig
    splits: tasks.Splits
    optimizer: Any
    total_steps: int


def result_record(job: TrainedJob, family: str, loop: LoopState, scores: dict[str, float],
                  best: dict[str, torch.Tensor], stopped_early: bool, wall_s: float, tokens_per_second: float | None,
                  device: torch.device, processes: int, in_sync: bool, artifact_dir: str) -> dict[str, Any]:
    """result.json's content for `job` (a single job, or a pack member: what `reference_scores` reads), before it is
    sealed: `scores` (train loss, best validation, test scores) with the reference levels, the loop's history and
    the run's facts. One builder, so a pack member's result has a single job's fields in a single job's order."""
    config = job.config
    return {
        "task": config.task.name, "model": config.model.name, "model_slug": model_slug(config.model.name),
        "method": config.method.name, "seed": config.seed, "family": family,
        "metrics": {**scores, **reference_scores(job, loop)},
        "history": loop.history, "curve": loop.curve, "steps": loop.step, "epochs": loop.epoch,
        "best_step": loop.best_step, "stopped_early": stopped_early, "wall_time_s": wall_s,
        **({} if tokens_per_second is None else {"tokens_per_second": tokens_per_second}),
        "peak_memory_mb": peak_memory_mb(device), "trainable_parameters": sum(p.numel() for p in best.values()),
        "generated_data": config.task.source == "generated", "dataset": dataset_card(config.task, job.splits),
        "processes": processes, "ranks_in_sync": in_sync, "optimizer": resolved_optimizer(job, family),
        "readout": config.model.readout, "artifact_dir": artifact_dir, "config": config.to_dict(),
        "config_hash": config_hash(config),
    }


def final_scores(loop: LoopState, test: dict[str, float]) -> dict[str, float]:
    """A finished run's scores: its last training loss, its best validation score and its test metrics."""
    return {"train_loss": loop.history[-1]["train_loss"], "best_validation_score": loop.best_score,
            **{f"test_{k}": v for k, v in test.items()}}


def reference_scores(job: TrainedJob, loop: LoopState) -> dict[str, float]:
    """What the test score is measured against: the majority class, chance and (if scored) the untrained model."""
    scores = {f"test_{k}": v for k, v in reference_levels(job.splits.train, job.splits.test).items()}
    if loop.untrained_score is not None:
        scores["test_untrained_score"] = loop.untrained_score
    return scores


def resolved_optimizer(job: TrainedJob, family: str) -> dict[str, Any]:
    """The optimiser and schedule the job trained with, and the table default of its method and model `family`."""
    optim, method = job.config.optim, job.config.method.name
    default = optim_default(method, family)
    # each group's learning rate before any schedule and its number of parameters (the method's groups, then a
    # classifier head's); none for a training-free job
    groups = [{"lr": group.get("initial_lr", group["lr"]), "parameters": sum(p.numel() for p in group["params"])}
              for group in (job.optimizer.param_groups if job.optimizer is not None else [])]
    return {"name": optim.name, "lr": optim.lr, "head_lr": optim.head_lr, "weight_decay": optim.weight_decay,
            "schedule": optim.schedule, "warmup_steps": warmup_steps(job.config, job.total_steps),
            "total_steps": job.total_steps, "groups": groups,
            "default": {"name": default.optimizer, "lr": default.lr, "source": default.source}}


def ranks_in_sync(accelerator: Any, trainable: list[torch.nn.Parameter]) -> bool:
    """Whether every process of `accelerator` holds the same `trainable` weights (DDP kept the replicas identical)."""
    if accelerator.num_processes == 1:
        return True
    params = [p.detach().double() for p in trainable]
    checksum = torch.stack([sum(p.sum() for p in params), sum(p.abs().sum() for p in params)])  # (2,)
    gathered = accelerator.gather(checksum.to(accelerator.device).unsqueeze(0))  # (processes, 2)
    return bool((gathered == gathered[0]).all())


def peak_memory_mb(device: torch.device) -> float:
    """The process's peak memory: CUDA's allocator on a GPU, the resident set size on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def content_digest(splits: tasks.Splits) -> str:
    """A short hash of every example (split, uid, fields, label): equal data, equal digest."""
    digest = hashlib.sha256()
    for name, rows in (("train", splits.train), ("validation", splits.validation), ("test", splits.test)):
        for example in rows:
            digest.update(json.dumps([name, example.uid, example.fields, example.label], sort_keys=True).encode())
    return digest.hexdigest()[:16]


def dataset_card(section: TaskSection, splits: tasks.Splits) -> dict[str, Any]:
    """The card of the splits a job trained and was scored on (see the module docstring)."""
    generated = any(e.is_generated for rows in (splits.train, splits.test) for e in rows)
    kind = "generated" if generated else "real"
    origin = {"generated": "generated by capt.tasks (not benchmark data)", "hub": "Hugging Face hub",
              "local": str(section.data_dir or tasks.DataConfig().data_dir)}[section.source]
    label_names = tasks.get(section.name).label_names
    samples = [{**{k: v if len(v) <= 200 else v[:199] + "…" for k, v in e.fields.items()},
                "label": label_names[e.label]} for e in splits.train[:3]]  # 3 training rows, values cut to 200 chars
    return {"name": f"{section.name}-{kind}", "task": section.name, "generated": generated, "source": section.source,
            "origin": origin, "sizes": splits.sizes(), "digest": content_digest(splits),
            "label_counts": {split: {label_names[k]: n for k, n in counts.items()}
                             for split, counts in splits.label_counts().items()},
            "sample_rows": samples,
            "warnings": [warning] if (warning := single_label_warning(splits.train, origin)) else []}
