"""The training-loss curve: every `train.log_every_steps` optimiser steps, one point with the mean training loss
over those steps and the learning rate each optimiser group will use next.

A validation record's `train_loss` covers the steps since the validation before it, a handful of points per
run; the curve is what shows how training went between them. Its points go to the job's `log` callback (the
sweep sends them to MLflow as ``train/loss`` and ``train/lr``) and into result.json (`curve`). The sums live in
`LoopState`, so a resumed job continues the same curve.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pipelines.training.checkpoint import LoopState

Log = Callable[[dict[str, Any]], None]
"""Called with each curve point: ``step``, ``train_loss``, ``train_lr`` (and ``train_lr_<i>`` for group i > 0)."""


def curve_point_if_due(job, loop: LoopState, log: Log | None, final: bool = False) -> dict[str, Any] | None:
    """After an optimiser step: close the current window into a point when `log_every_steps` divides the step,
    or, with `final`, whatever steps are left (the last point then covers fewer steps). Returns the point."""
    every = job.config.train.log_every_steps
    if loop.log_count == 0 or (not final and loop.step % every):
        return None
    point = {"step": loop.step, "train_loss": loop.log_sum / loop.log_count, **learning_rates(job.optimizer)}
    loop.log_sum, loop.log_count = 0.0, 0
    loop.curve.append(point)
    if log is not None:
        log(dict(point))
    return point


def learning_rates(optimizer: Any) -> dict[str, float]:
    """The scheduled learning rate of each optimiser group: ``train_lr`` for the first, ``train_lr_<i>`` after it."""
    if optimizer is None:
        return {}
    rates = [float(group["lr"]) for group in optimizer.param_groups]
    return {("train_lr" if i == 0 else f"train_lr_{i}"): lr for i, lr in enumerate(rates)}
