"""The training loop's side of `capt.phases`: start a method's next phase at its boundary step.

At a boundary the method changes itself (`begin_phase`, e.g. XPrompt prunes its prompt); the loop then starts the
new phase as a fresh training run would: the optimiser state (moments, step counts) is cleared, and the best
validation state restarts, so the job keeps the best state of its final phase. Early stopping applies only in the
final phase (stopping earlier would skip the phases still to come). The learning-rate schedule restarts at each
boundary when the method asks for it (`phases_restart_schedule`; `pipelines.training.setup` builds it so), and runs
on over the whole job otherwise. Which phase a job is in follows from its step alone, so a resumed job needs only
the method's `phase_state`, which the checkpoint carries (`pipelines.training.checkpoint`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch

from pipelines.training.checkpoint import LoopState, trainable_state

logger = logging.getLogger(__name__)
BatchLoss = Callable[[Any, dict], torch.Tensor]
"""The training loss of `model` on one collated batch."""


def phase_boundaries(job) -> list[int]:
    """The steps after which the job's method starts a new phase (empty for a one-phase method)."""
    if job.optimizer is None:
        return []
    return list(job.accelerator.unwrap_model(job.model).training_phases(job.total_steps))


def in_final_phase(job, step: int) -> bool:
    """Whether `step` lies in the method's last phase (always, for a one-phase method)."""
    return all(step >= boundary for boundary in phase_boundaries(job))


def begin_phase_if_due(job, loop: LoopState, best: dict, batch_loss: BatchLoss) -> None:
    """At a boundary step: let the method begin its next phase, clear the optimiser state, restart the best state."""
    boundaries = phase_boundaries(job)
    if loop.step not in boundaries:
        return
    index = boundaries.index(loop.step) + 1
    model = job.accelerator.unwrap_model(job.model)
    model.eval()  # scores without dropout: every rank computes the same ones on the same batches
    model.begin_phase(index, lambda: _training_losses(job, model, batch_loss))
    model.train()
    job.optimizer.optimizer.state.clear()
    loop.best_score, loop.best_step, loop.bad_evals = -math.inf, loop.step, 0
    best.clear()
    best.update(trainable_state(model))
    logger.info("%s: phase %d of %d begins after step %d (optimiser state cleared)", job.config.method.name,
                index + 1, len(boundaries) + 1, loop.step)


def _training_losses(job, model, batch_loss: BatchLoss) -> Iterator[torch.Tensor]:
    """The loss of successive training batches in a fixed order, the same on every rank (no sharding, no shuffle)."""
    from accelerate.utils import send_to_device

    loader = torch.utils.data.DataLoader(job.splits.train, batch_size=job.config.train.batch_size,
                                         shuffle=False, collate_fn=job.collator)
    for batch in loader:
        yield batch_loss(model, send_to_device(batch, job.accelerator.device))
