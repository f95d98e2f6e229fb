"""Everything a job needs before its first step: Accelerator, data, model, method, optimiser, schedule."""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from capt import tasks
from capt.arch import ArchSpec
from capt.errors import CaptError
from capt.methods import get_method
from pipelines.adapted import adapt, build_method_config, install_job_readout, parameter_groups, sequence_overhead
from pipelines.config.schema import JobConfig, require_resolved, warmup_steps
from pipelines.models.loading import LoadedModel, load_model
from pipelines.training.checkpoint import install_hooks

logger = logging.getLogger(__name__)


@dataclass
class Job:
    """A job ready to train (model, optimiser, scheduler and loader prepared by Accelerate)."""

    config: JobConfig
    accelerator: Any
    model: nn.Module
    base_model: nn.Module
    tokenizer: Any
    spec: ArchSpec
    collator: Any
    splits: tasks.Splits
    train_loader: Any
    optimizer: Any
    scheduler: Any
    trainable: list[nn.Parameter]
    total_steps: int
    output_dir: Path


def make_accelerator(config: JobConfig):
    """Accelerator for CPU (gloo across processes) or GPUs (NCCL, bf16 by default)."""
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration

    use_cpu = config.train.cpu or not torch.cuda.is_available()
    precision = config.train.precision
    if precision == "auto":
        precision = "no" if use_cpu else "bf16"
    # cpu=True is what makes Accelerate set up gloo DDP across CPU processes (torchrun or Ray Train).
    accelerator = Accelerator(
        cpu=use_cpu,
        mixed_precision=precision,
        gradient_accumulation_steps=config.train.grad_accum_steps,
        dataloader_config=DataLoaderConfiguration(split_batches=True, use_seedable_sampler=True),
    )
    check_launch(accelerator.num_processes, str(accelerator.distributed_type.value))
    return accelerator


class LaunchMismatchError(CaptError, RuntimeError):
    """A launcher started several processes, but Accelerate joined them into fewer (each would train alone)."""


def check_launch(num_processes: int, distributed_type: str) -> None:
    """Stop every process when the launcher's world size differs from the processes Accelerate joined.

    Otherwise each process trains alone as rank 0 of 1 and they overwrite each other's outputs, silently.
    """
    # where torchrun / accelerate launch (the first two) and MPI say how many processes they started, by precedence
    started = next((int(value) for name in ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE")
                    if (value := os.environ.get(name, "").strip()).isdigit()), None)
    if started is None or started == num_processes:
        return
    raise LaunchMismatchError(
        f"The launcher started {started} processes (WORLD_SIZE={os.environ.get('WORLD_SIZE')}, "
        f"RANK={os.environ.get('RANK')}) but Accelerate joined {num_processes} (distributed type "
        f"{distributed_type}): each process would train alone and overwrite the others' outputs, so this job "
        "stops. Usually an Accelerate state was created before the job without cpu=True on a machine without "
        "CUDA. Launch two CPU processes with `torchrun --standalone --nproc_per_node 2 -m pipelines.train "
        "--config FILE`, or `ACCELERATE_USE_CPU=1 accelerate launch --config_file infra/accelerate/cpu_2proc.yaml "
        "-m pipelines.train --config FILE`; in your own script, create `Accelerator(cpu=True)` (or set "
        "ACCELERATE_USE_CPU=1) before anything else touches Accelerate; on GPUs, give every process its own GPU "
        "(num_processes at most the GPUs visible in CUDA_VISIBLE_DEVICES).")


def load_data(config: JobConfig) -> tasks.Splits:
    """The paper's splits of the configured task (train 90 %, validation 10 %, official validation = test)."""
    return tasks.load_splits(config.task.name, config.task.data_config(config.seed))


def build_job(config: JobConfig, loaded: LoadedModel | None = None) -> Job:
    """Build and prepare every piece of the job described by `config` (its defaults resolved, its readout installed);
    `loaded`: its base model, already loaded (e.g. from `pipelines.models.cache`), instead of loading it here."""
    from accelerate.utils import set_seed

    config = require_resolved(config, "build_job")
    accelerator = make_accelerator(config)
    _check_batch(config, accelerator.num_processes)
    set_seed(config.seed)
    splits = load_data(config)
    if loaded is None:
        loaded = load_model(config.model.name, num_labels(config), config.model.dtype)
    model = adapt(loaded.model, config.method.name, config.method.options, loaded.tokenizer)
    install_job_readout(model, loaded.model, config.model.readout)
    collator = job_collator(config, loaded, sequence_overhead(config.method.name, config.method.options))
    loader = train_loader(config, splits, collator, shuffle=True)
    install_hooks(accelerator)
    optim = config.optim
    groups = parameter_groups(model, loaded.model, optim.lr, optim.head_lr, optim.weight_decay)
    if not groups:  # nothing trainable (the training-free instance-only capsule on a generative model): evaluate only
        total_steps, optimizer, scheduler = 0, None, None
        model, loader = accelerator.prepare(model, loader)
    else:
        optimizer = new_optimizer(optim.name, groups, groups[0]["lr"])  # Adafactor (the paper's, fixed lr) or AdamW
        total_steps, budget, cut = step_budget(config, len(loader))
        logger.log(logging.WARNING if cut else logging.INFO, "%s/%s: %s", config.task.name, config.method.name, budget)
        # each phase runs the schedule afresh when the method asks for it
        restarts = list(model.training_phases(total_steps)) if model.phases_restart_schedule() else []
        scheduler = make_schedule(config, optimizer, total_steps, restarts)
        model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    model.train()
    output_dir = config.resolved_output_dir()
    if accelerator.is_main_process:
        output_dir.mkdir(parents=True, exist_ok=True)
    trainable = [p for p in model.parameters() if p.requires_grad]
    logger.info("%s: %d trainable parameters, %d train / %d validation / %d test examples, %d steps",
                config.method.name, sum(p.numel() for p in trainable), len(splits.train), len(splits.validation),
                len(splits.test), total_steps)
    return Job(config, accelerator, model, loaded.model, loaded.tokenizer, loaded.spec, collator, splits,
               loader, optimizer, scheduler, trainable, total_steps, output_dir)


def job_collator(config: JobConfig, loaded: LoadedModel, capsule_slots: int) -> tasks.Collator:
    """The collator of the job's task format and max_length, leaving `capsule_slots` positions for the method."""
    return tasks.Collator(loaded.tokenizer, loaded.family, max_length=config.model.max_length,
                          capsule_slots=capsule_slots, input_format=config.task.input_format)


def train_loader(config: JobConfig, splits: tasks.Splits, collator, **order) -> torch.utils.data.DataLoader:
    """The training batches in the order `order` gives (``shuffle=True``, or a ``sampler``).

    Full batches only, so every process sees an equal share and DDP matches one process exactly; the dropped
    remainder changes from epoch to epoch because the order is reshuffled."""
    return torch.utils.data.DataLoader(splits.train, batch_size=config.train.batch_size, collate_fn=collator,
                                       drop_last=len(splits.train) > config.train.batch_size, **order)


def num_labels(config: JobConfig) -> int:
    """Classes of the configured task (the size of an encoder model's classifier head)."""
    return tasks.get(config.task.name).num_labels


def _check_batch(config: JobConfig, processes: int) -> None:
    for key in ("batch_size", "eval_batch_size"):
        value = getattr(config.train, key)
        if value % processes:
            raise ValueError(f"train.{key}={value} is a global batch and must divide evenly across the "
                             f"{processes} processes (allowed: a multiple of {processes}).")


def new_optimizer(name: str, params: list, lr: float) -> torch.optim.Optimizer:
    """`name` ("adafactor": the paper's fixed-lr Adafactor, or AdamW) over `params` (tensors or groups;
    `lr` is the default for groups that name none)."""
    if name == "adafactor":
        from transformers.optimization import Adafactor

        return Adafactor(params, lr=lr, relative_step=False, scale_parameter=False, warmup_init=False)
    return torch.optim.AdamW(params, lr=lr)


def step_budget(config: JobConfig, batches_per_epoch: int) -> tuple[int, str, bool]:
    """(optimiser steps, the sentence that says which limit sets them, whether a given `max_steps` was cut)."""
    train = config.train
    per_epoch = max(1, math.ceil(batches_per_epoch / train.grad_accum_steps))
    total = min(per_epoch * train.max_epochs, train.max_steps or math.inf)
    epochs = f"max_epochs={train.max_epochs} ({per_epoch} steps per epoch)"
    if not train.max_steps:
        return total, f"training {total} steps: {epochs}", False
    if total < train.max_steps:
        return total, (f"training {total} steps, not max_steps={train.max_steps}: {epochs} is reached first; raise "
                       "train.max_epochs to train longer"), True
    return total, f"training {total} steps: max_steps={train.max_steps}, before {epochs} is reached", False


def make_schedule(config: JobConfig, optimizer, total_steps: int, restarts: list[int]):
    """Warm-up then linear decay to 0 (or constant), over the whole job, or over each segment between `restarts`."""
    from torch.optim.lr_scheduler import LambdaLR
    from transformers import get_constant_schedule_with_warmup, get_linear_schedule_with_warmup

    constant = config.optim.schedule == "constant"
    if not restarts:
        warmup = warmup_steps(config, total_steps)
        if constant:
            return get_constant_schedule_with_warmup(optimizer, num_warmup_steps=warmup)
        return get_linear_schedule_with_warmup(optimizer, num_warmup_steps=warmup, num_training_steps=total_steps)
    edges = [0, *restarts, total_steps]

    def factor(step: int) -> float:
        # the schedule of a fresh run as long as the segment [start, end) holding the step (the same warm-up ratio
        # and shape as the whole-job schedule, on the segment's own steps)
        start, end = next((a, b) for a, b in zip(edges, edges[1:], strict=False) if step < b or b == edges[-1])
        local, length = step - start, end - start
        warmup = warmup_steps(config, length)
        if local < warmup:
            return local / max(1, warmup)
        return 1.0 if constant else max(0.0, (length - local) / max(1, length - warmup))

    return LambdaLR(optimizer, factor)


# --- Which jobs can share one pack (a sweep checks its grid with these before any pack trains) ------------------------

SHARED_KEYS = ("model.name", "model.dtype", "train.precision", "train.cpu")
"""Settings every member of a pack must share: they make the one base model and where and how it runs."""


def pack_problems(configs: list[JobConfig]) -> list[str]:
    """Why these jobs cannot share one pack (empty when they can); each problem names the member and its reason."""
    if not configs:
        return ["a pack needs at least one member"]
    problems = []
    packs = [bool(getattr(get_method(c.method.name).model_class, "packs_capsules", False)) for c in configs]
    for i, config in enumerate(configs):
        for key in SHARED_KEYS:
            section, name = key.split(".")
            mine, theirs = getattr(getattr(config, section), name), getattr(getattr(configs[0], section), name)
            if mine != theirs:
                problems.append(f"member {i}: {key}={mine!r} differs from member 0's {theirs!r}: members share one "
                                "base model")
        if not packs[i]:
            problems.append(f"member {i}: method {config.method.name!r} does not pack: only CaPT and its ablations "
                            "(method 'capt' with any options) train a capsule per row on a frozen, shared base model")
        if config.train.grad_accum_steps != 1:
            problems.append(f"member {i}: train.grad_accum_steps={config.train.grad_accum_steps}: a pack steps every "
                            "member on each batch (allowed: 1)")
        if config.train.resume:
            problems.append(f"member {i}: train.resume=true is not supported in a pack (allowed: false; a pack "
                            "continues its members from its own checkpoints, PackOptions.checkpoints)")
    slots = {build_method_config(c.method.name, c.method.options).num_slots
             for c, packs_capsules in zip(configs, packs, strict=True) if packs_capsules}
    if len(slots) > 1:
        problems.append(f"members' capsules occupy different numbers of slots {sorted(slots)} (capsule length, "
                        "prepend fusion): capsules sharing one model must occupy the same number of slots")
    return problems
