"""Everything a packed training run needs before its first step: the members' checks, one frozen base model, and per
member its capsule (and head), data, loader, optimiser and schedule, built by the single job's own pieces.

A pack trains K jobs (`JobConfig`s) on one base model in one loop (`pipelines.training.packed`). Members may
differ in task, seed, learning rate, optimiser and every other training setting; they must share what the base
model is (name, dtype, precision, device), and their method must be one that packs (`capt.inject.CapsuleModel.
packs_capsules`: CaPT and its ablations, i.e. method `capt` with any options of one slot count).
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from capt import tasks
from capt.arch import ArchSpec
from capt.capsule import Capsule
from capt.errors import CaptError
from capt.heads import linear_head
from capt.packing import PackedCapsules
from pipelines.adapted import build_method_config
from pipelines.config.schema import JobConfig, require_resolved
from pipelines.models.loading import LoadedModel, load_model
from pipelines.training.checkpoint import LoopState
from pipelines.training.setup import (
    job_collator,
    load_data,
    make_accelerator,
    make_schedule,
    new_optimizer,
    num_labels,
    pack_problems,
    step_budget,
    train_loader,
)

logger = logging.getLogger(__name__)


class PackError(CaptError, ValueError):
    """Jobs that cannot train together in one pack; the message names each member and the reason."""


@dataclass(frozen=True)
class PackOptions:
    """How a pack trains its members together (what no member's own config says)."""

    dropout: bool = True
    """Keep the base model's dropout active while training, as a single job does (False: eval mode throughout)."""
    seed: int | None = None
    """Seed of the pack's own random stream (dropout masks of the whole batch); None: the first member's seed."""
    write_artifacts: bool = True
    """Write each member's best capsule (and head) as an artifact in its own output_dir, as a single job does."""
    checkpoints: bool = False
    """Save each member's state at each of its validations in its output_dir, and continue a member from it when a
    pack starts (`pipelines.training.packed`)."""


class EpochSampler(torch.utils.data.Sampler):
    """The order of Accelerate's seedable sampler in a single job: epoch e is one permutation drawn from a
    generator seeded with seed + e (`set_epoch`), so a member sees its batches in the order it would alone."""

    def __init__(self, size: int, seed: int) -> None:
        self.size, self.seed, self.epoch = size, seed, 0

    def set_epoch(self, epoch: int) -> None:
        """Draw the next iteration's order for `epoch`."""
        self.epoch = epoch

    def __iter__(self):
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter(torch.randperm(self.size, generator=generator).tolist())

    def __len__(self) -> int:
        return self.size


@dataclass
class Member:
    """One job of a pack: its data, optimiser and the state of its own loop."""

    index: int
    """Position in the pack (its capsule index in `PackedCapsules`)."""
    config: Any
    """Its resolved `JobConfig`."""
    splits: tasks.Splits
    """Its train / validation / test examples."""
    collator: Any
    """Its collator (its task's format and its own max_length)."""
    sampler: EpochSampler
    """Its data order (from its seed)."""
    loader: torch.utils.data.DataLoader
    """Its training batches."""
    optimizer: torch.optim.Optimizer
    """Its own optimiser over its capsule (and head)."""
    scheduler: Any
    """Its own learning-rate schedule."""
    total_steps: int
    """Its step budget (`pipelines.training.setup.step_budget`)."""
    loop: LoopState = field(default_factory=LoopState)
    """Steps, epochs, validation history, best score, patience."""
    best: dict[str, torch.Tensor] = field(default_factory=dict)
    """CPU copy of its trainable tensors at its best validation."""
    losses: list[float] = field(default_factory=list)
    """Its training loss at every step."""
    stopped_early: bool = False
    """Whether patience ran out."""


@dataclass
class Pack:
    """A pack ready to train: the base model with every member's capsule, and the members."""

    options: PackOptions
    """How the pack trains."""
    accelerator: Any
    """The Accelerator of the run (device, autocast, evaluation)."""
    model: PackedCapsules
    """The frozen base model with the members' capsules (and heads)."""
    loaded: LoadedModel
    """The base model, its tokenizer and family."""
    members: list[Member]
    """The members, in pack order."""
    reports: dict[int, Any] = field(default_factory=dict)
    """Member index -> the callable that gets its every validation record (`packed.fit_pack`)."""

    @property
    def spec(self) -> ArchSpec:
        """The base model's `capt.arch` spec."""
        return self.loaded.spec


def build_pack(configs: list[JobConfig], options: PackOptions | None = None) -> Pack:
    """Check the members, load the base model once and build every member (refused with `PackError`)."""
    from accelerate.utils import set_seed

    options = options or PackOptions()
    configs = [require_resolved(c, "build_pack") for c in configs]
    problems = pack_problems(configs)
    if problems:
        raise PackError("These jobs cannot train in one pack: " + "; ".join(problems) + ".")
    accelerator = make_accelerator(configs[0])
    if accelerator.num_processes > 1:
        raise PackError(f"A pack runs in one process; {accelerator.num_processes} were launched.")
    first = configs[0]
    loaded = load_model(first.model.name, num_labels(first), first.model.dtype)
    loaded.model.to(accelerator.device)
    capsules, heads = _capsules_and_heads(configs, loaded, accelerator.device)
    readouts = [c.model.readout for c in configs] if heads is not None else None
    model = PackedCapsules(loaded.model, capsules, heads, readouts)
    members = [_member(i, config, model, loaded) for i, config in enumerate(configs)]
    set_seed(first.seed if options.seed is None else options.seed)  # the pack's own stream: dropout masks
    model.train(options.dropout)
    return Pack(options, accelerator, model, loaded, members)


def _capsules_and_heads(configs, loaded: LoadedModel, device) -> tuple[list[Capsule], list[nn.Linear] | None]:
    """Each member's capsule, initialised as its single job would (seeded by its seed), and its head's initial state:
    the head a fresh load of the base model with that member's label count has (the seeded initialisation)."""
    from accelerate.utils import set_seed

    spec, model = loaded.spec, loaded.model
    heads = {num_labels(configs[0]): linear_head(model)} if spec.classifier_head else None
    capsules, member_heads = [], []
    for config in configs:
        set_seed(config.seed)  # a "normal" init draws from the seeded global stream, as `adapt` does in a job
        capsule_config = build_method_config(config.method.name, config.method.options)
        layers = capsule_config.resolve_layers(spec.num_layers(model))
        capsules.append(Capsule(capsule_config, layers, spec.hidden_size(model), device=device))
        if heads is not None:
            labels = num_labels(config)
            if labels not in heads:
                heads[labels] = linear_head(load_model(config.model.name, labels, config.model.dtype).model)
            member_heads.append(copy.deepcopy(heads[labels]).to(device).requires_grad_(True))
        if not any(p.requires_grad for p in capsules[-1].parameters()) and heads is None:
            raise PackError(f"member {len(capsules) - 1}: its capsule has nothing to train (task_vector=false on a "
                            "model without a classifier head): evaluate it as a single job instead")
    return capsules, member_heads if heads is not None else None


def _member(index: int, config, model: PackedCapsules, loaded: LoadedModel) -> Member:
    """Member `index`'s data, loader, optimiser and schedule, as `pipelines.training.setup.build_job` makes them."""
    splits = load_data(config)
    collator = job_collator(config, loaded, model.num_slots)
    sampler = EpochSampler(len(splits.train), config.seed)
    loader = train_loader(config, splits, collator, sampler=sampler)
    # the groups as `pipelines.adapted.parameter_groups` orders them: its capsule at optim.lr, then its head (if any)
    optim, params = config.optim, model.member_parameters(index)
    groups = [{"params": [p for n, p in params.items() if n.startswith(prefix)], "lr": lr,
               "weight_decay": optim.weight_decay} for prefix, lr in (("capsule.", optim.lr), ("head.", optim.head_lr))]
    optimizer = new_optimizer(optim.name, [g for g in groups if g["params"]], optim.lr)
    total_steps, budget, cut = step_budget(config, len(loader))
    logger.log(logging.WARNING if cut else logging.INFO, "pack member %d (%s): %s", index, config.task.name, budget)
    scheduler = make_schedule(config, optimizer, total_steps, [])
    return Member(index, config, splits, collator, sampler, loader, optimizer, scheduler, total_steps)
