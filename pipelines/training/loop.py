"""The training loop, one for every job: K >= 1 members, each on its own schedule, stepped together.

    from pipelines.training.loop import run
    result = run(config)                      # a resolved JobConfig (pipelines.config.load): train -> test -> artifact

A member's schedule (`schedule`) is the loop a job runs: epochs of batches, an optimiser step after each (after
every `train.grad_accum_steps` micro-batches), a validation every `train.eval_every_steps` steps or at each epoch's
end, early stopping once patience runs out, the step budget, and a last validation of the state it ends in.
`drive` runs K schedules side by side: each round it takes the next batch of every member still training and hands
them to one `step`, and validates together the members that reach a validation point at the same time; a member
whose schedule ends leaves, and the loop ends with the last one.

A single job (`run`, `fit`) is one schedule driven on Accelerate, one process or several: its `step` is the model's
forward and backward, and around the schedule it keeps a job's extras (the progress bar, the training-loss curve,
a method's phases, checkpoints every N steps). A pack (`pipelines.training.packed`) is K CaPT schedules over one
frozen base model: its `step` is one merged forward and backward.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from functools import partial
from typing import Any

import torch
from tqdm.auto import tqdm

from capt.arch.readout import remove_readout
from capt.atomic import write_atomically
from pipelines.adapted import evaluate, model_inputs, per_example_nll, save_artifact
from pipelines.config.schema import JobConfig, require_resolved
from pipelines.models.cache import BaseModelCache
from pipelines.training.checkpoint import (
    LATEST_CHECKPOINT,
    LoopState,
    load_checkpoint,
    restore_trainable,
    rng_restored_once_started,
    save_checkpoint,
    trainable_state,
)
from pipelines.training.disk_full import no_space_reported
from pipelines.training.outputs import claim_job_folder, finished_result, seal_result
from pipelines.training.result import final_scores, ranks_in_sync, result_record
from pipelines.training.setup import Job, build_job, num_labels

logger = logging.getLogger(__name__)
Report = Callable[[dict[str, Any]], None]
"""Called with each validation record."""
Log = Callable[[dict[str, Any]], None]
"""Called with each point of the training-loss curve: ``step``, ``train_loss``, ``train_lr`` (``train_lr_<i>`` for
optimiser group i > 0)."""
VALIDATE = object()
"""What a schedule yields where its member validates; the reply is whether the member's patience ran out."""
Schedule = Generator[Any, Any, None]


class TrainingDivergedError(RuntimeError):
    """The loss became NaN or infinite; the last good checkpoint is kept."""


def schedule(loop: LoopState, train, total_steps: int, epoch_batches: Callable[[int, int], Iterable],
             after_step: Callable[[], None] | None = None, checkpoint: Callable[[], None] | None = None) -> Schedule:
    """One member's loop: yields its batches and `VALIDATE` where it validates, advancing `loop` as it goes.

    `train`: the member's `TrainConfig`. `epoch_batches(epoch, consumed)`: the epoch's batches after the first
    `consumed` (a resumed epoch continues where it was). After a batch the driver replies whether it completed an
    optimiser step (False for a gradient-accumulation micro-batch); after `VALIDATE`, whether patience ran out.
    `after_step` runs after each optimiser step, `checkpoint` every `train.checkpoint_every_steps` steps."""
    while loop.epoch < train.max_epochs and loop.step < total_steps:
        for batch in epoch_batches(loop.epoch, loop.batches_in_epoch):
            stepped = yield batch
            loop.batches_in_epoch += 1
            if not stepped:
                continue
            loop.step += 1
            if after_step is not None:
                after_step()
            if train.eval_every_steps and loop.step % train.eval_every_steps == 0 and (yield VALIDATE):
                return
            if checkpoint is not None and train.checkpoint_every_steps \
                    and loop.step % train.checkpoint_every_steps == 0:
                checkpoint()
            if loop.step >= total_steps:
                break
        else:
            loop.epoch, loop.batches_in_epoch = loop.epoch + 1, 0
            if not train.eval_every_steps and (yield VALIDATE):
                return
    if not loop.history or loop.history[-1]["step"] != loop.step:
        yield VALIDATE  # the final state is always validated


def drive(schedules: Mapping[int, Schedule], step: Callable[[dict[int, Any]], dict[int, bool]],
          validate: Callable[[list[int]], dict[int, bool]]) -> None:
    """Run `schedules` (member index -> schedule) to their ends. `step(batches)` takes one batch per member still
    training and returns, per member, whether it completed an optimiser step; `validate(indices)` validates those
    members and returns, per member, whether its patience ran out. Each round, the members that validate before
    their next batch are validated together; a member whose schedule ended is left out."""
    replies: dict[int, Any] = dict.fromkeys(schedules)
    while True:
        batches: dict[int, Any] = {}
        while replies:
            asking = []
            for index, reply in replies.items():
                try:
                    item = schedules[index].send(reply)
                except StopIteration:
                    continue
                if item is VALIDATE:
                    asking.append(index)
                else:
                    batches[index] = item
            replies = validate(asking) if asking else {}
        if not batches:
            return
        replies = step(batches)


def training_loss(spec, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The mean loss of a batch: cross-entropy over a classifier head's labels, else the mean over examples of each
    one's token negative log-likelihood."""
    if spec.classifier_head:
        return torch.nn.functional.cross_entropy(logits.float(), labels)
    return per_example_nll(logits, labels, shift=spec.shifts_labels).mean()


def run(config: JobConfig, report: Report | None = None, base_models: BaseModelCache | None = None,
        log: Log | None = None, progress_every_s: float = 0.1) -> dict[str, Any]:
    """Run the job described by `config`; `report(metrics)` is called on every rank at each validation, `log(point)`
    at each point of the training-loss curve (every `train.log_every_steps` steps). The progress bar redraws at most
    every `progress_every_s` seconds (a sweep's trials share one console).

    `base_models`: a cache to take the base model from and give it back to (the sweep's single-worker trials,
    whose process is reused between trials); None loads it afresh, as a one-off job should.

    The job first claims its output folder (see `pipelines.training.outputs`): one job per folder, and never
    another config's outputs. With `train.resume`, a folder that already holds the finished result of
    this same config returns that result without training again (a restarted sweep never runs a trial
    twice), and a checkpoint of this same config is continued. `config` is the resolved config that
    `pipelines.config.load_job_config` returns (anything else is refused): its folder, hash and result hold the
    values used.
    """
    config = require_resolved(config, "pipelines.training.loop.run")
    with no_space_reported(config.resolved_output_dir()), claim_job_folder(config):
        finished = finished_result(config) if config.train.resume else None
        if finished is not None:
            logger.info("%s already holds the finished result of this job: not training again",
                        config.resolved_output_dir())
            return finished
        if base_models is None:
            return fit(build_job(config), report, log, progress_every_s)
        with base_models.lease(config.model.name, num_labels(config), config.model.dtype,
                               config.method.name) as loaded:
            job = build_job(config, loaded)
            result = fit(job, report, log, progress_every_s)
            remove_readout(job.base_model)
            job.accelerator.unwrap_model(job.model).detach()  # the cache keeps the bare base model
            return result


def fit(job: Job, report: Report | None = None, log: Log | None = None,
        progress_every_s: float = 0.1) -> dict[str, Any]:
    """Train a built job to the end; the model keeps the best-validation weights afterwards."""
    config, latest = job.config, job.output_dir / LATEST_CHECKPOINT
    job.accelerator.wait_for_everyone()  # the main process has claimed the folder: every rank sees the same state
    if config.train.resume and latest.is_dir():
        loop, best = load_checkpoint(job.accelerator, latest)
        logger.info("Resumed from %s at step %d", latest, loop.step)
        resumed_rng = torch.get_rng_state()  # as the checkpoint restored it
    else:
        loop, best, resumed_rng = LoopState(), trainable_state(job.accelerator.unwrap_model(job.model)), None
    if loop.wants_untrained_score(config.train):
        loop.untrained_score = _evaluate(job, job.splits.test)["score"]  # the reference training has to beat
        job.model.train()
    started = time.perf_counter()
    # closed on an error too, ending its line, so that the entry point's error paragraph starts a line of its own
    with tqdm(total=job.total_steps, initial=loop.step, disable=not job.accelerator.is_local_main_process,
              desc=f"{config.task.name}/{config.method.name}", mininterval=progress_every_s) as progress:
        stopped_early, tokens = _train(job, loop, progress, best, (report, log), resumed_rng)
        curve_point_if_due(job, loop, log, final=True)  # the steps after the last full window
    return _finish(job, loop, best, stopped_early, started, tokens)


def _train(job: Job, loop: LoopState, progress, best: dict, callbacks: tuple,
           resumed_rng: torch.Tensor | None = None) -> tuple[bool, int]:
    """The job's schedule, driven alone: (whether early stopping ended it, the tokens trained on: this process's
    times the processes). `best` is updated in place. `resumed_rng`: the random state of the checkpoint resumed from,
    set again once the resumed epoch's batches start. A method without training (no optimiser, no steps) only
    validates."""
    report, log = callbacks
    stopped_early, tokens = False, 0

    def epoch_batches(epoch: int, consumed: int) -> Iterable:
        nonlocal resumed_rng
        job.train_loader.set_epoch(epoch)
        batches = job.accelerator.skip_first_batches(job.train_loader, consumed)
        if resumed_rng is not None:
            batches, resumed_rng = rng_restored_once_started(batches, resumed_rng), None
        return batches

    def after_step() -> None:
        progress.update(1)
        if point := curve_point_if_due(job, loop, log):
            progress.set_postfix(loss=f"{point['train_loss']:.4g}", refresh=False)
        begin_phase_if_due(job, loop, best)

    def step(batches: dict[int, dict]) -> dict[int, bool]:
        nonlocal tokens
        tokens += _train_step(job, batches[0], loop)
        return {0: job.accelerator.sync_gradients}

    def validate(indices: list[int]) -> dict[int, bool]:
        nonlocal stopped_early
        stopped_early = _validate(job, loop, best, report)
        return {0: stopped_early}

    checkpoint = partial(save_checkpoint, job.accelerator, job.output_dir / LATEST_CHECKPOINT, loop, best)
    drive({0: schedule(loop, job.config.train, job.total_steps, epoch_batches, after_step, checkpoint)},
          step, validate)
    return stopped_early, tokens


def _train_step(job: Job, batch: dict, loop: LoopState) -> int:
    """One micro-batch forward and backward (an optimiser step once the accumulation completes); its tokens."""
    accelerator = job.accelerator
    with accelerator.accumulate(job.model):
        loss = _batch_loss(job, job.model, batch)
        if not torch.isfinite(loss.detach()).all():
            raise TrainingDivergedError(
                f"The training loss became {loss.item()} at step {loop.step} (epoch {loop.epoch}); the last good "
                f"checkpoint is kept in {job.output_dir / 'checkpoints'}. Lower optim.lr or check the data.")
        accelerator.backward(loss)
        if accelerator.sync_gradients and job.config.optim.max_grad_norm:
            accelerator.clip_grad_norm_(job.trainable, job.config.optim.max_grad_norm)
        job.optimizer.step()
        job.scheduler.step()
        job.optimizer.zero_grad()
    loop.add_loss(loss.item())
    return int(batch["attention_mask"].sum()) * accelerator.num_processes


def _batch_loss(job: Job, model, batch: dict) -> torch.Tensor:
    # T5 needs labels to build decoder inputs; decoder-only capsules derive the prompt from them.
    labels = {} if job.spec.classifier_head else {"labels": batch["labels"]}
    return training_loss(job.spec, model(**model_inputs(batch), **labels).logits, batch["labels"])


def _validate(job: Job, loop: LoopState, best: dict, report: Report | None) -> bool:
    """Score validation, keep the best trainable state, report; True when patience ran out."""
    record, improved = loop.record_validation(_evaluate(job, job.splits.validation))
    if improved:
        best.clear()
        best.update(trainable_state(job.accelerator.unwrap_model(job.model)))
    # reported before it is checkpointed: a kill between the two makes the resumed job validate this step again,
    # never leaves a checkpointed validation that no run logged
    if report is not None:
        report(dict(record))
    if job.config.train.checkpoint_every_steps is None:
        save_checkpoint(job.accelerator, job.output_dir / LATEST_CHECKPOINT, loop, best)
    job.model.train()
    # early stopping only in the method's final phase
    return loop.out_of_patience(job.config.train.patience) and all(loop.step >= b for b in phase_boundaries(job))


def _evaluate(job: Job, examples) -> dict[str, float]:
    cfg = job.config
    return evaluate(job.accelerator, job.model, examples, job.collator, job.spec, cfg.train.eval_mode,
                    cfg.train.eval_batch_size, cfg.model.max_new_tokens, job.tokenizer)


def _finish(job: Job, loop: LoopState, best: dict, stopped_early: bool, started: float,
            tokens: int) -> dict[str, Any]:
    """Test at the best checkpoint, write the artifact and result.json (rank 0), return the result."""
    accelerator = job.accelerator
    in_sync = ranks_in_sync(job.accelerator, job.trainable)
    restore_trainable(accelerator.unwrap_model(job.model), best)
    test = _evaluate(job, job.splits.test)
    wall = time.perf_counter() - started
    result = result_record(job, job.spec.family, loop, final_scores(loop, test), best, stopped_early, wall,
                           tokens / max(wall, 1e-9), accelerator.device, accelerator.num_processes, in_sync,
                           str(job.output_dir / "artifact"))
    if accelerator.is_main_process:
        save_artifact(accelerator.unwrap_model(job.model), job.base_model, job.config.method.name,
                      job.output_dir / "artifact", job.config.task.name, result["metrics"], job.config.model.readout)
        seal_result(result, job.output_dir / "artifact")  # the artifact's digests, then result.json's own
        write_atomically(job.output_dir / "result.json", json.dumps(result, indent=2, default=str))
    accelerator.wait_for_everyone()
    return result


# The training-loss curve. A validation record's train_loss covers the steps since the validation before it, a
# handful of points per run; the curve, one point every `train.log_every_steps` optimiser steps (the mean training
# loss over them and each optimiser group's next learning rate), shows how training went between them. Its points go
# to the job's `log` (a tracked job sends them to MLflow as train/loss and train/lr) and into result.json (`curve`);
# the sums live in `LoopState`, so a resumed job continues the same curve.

def curve_point_if_due(job, loop: LoopState, log: Log | None, final: bool = False) -> dict[str, Any] | None:
    """After an optimiser step: close the current window into a point when `log_every_steps` divides the step,
    or, with `final`, whatever steps are left (the last point then covers fewer steps). Returns the point."""
    every = job.config.train.log_every_steps
    if loop.log_count == 0 or (not final and loop.step % every):
        return None
    groups = job.optimizer.param_groups if job.optimizer is not None else []  # each group's scheduled rate
    point = {"step": loop.step, "train_loss": loop.log_sum / loop.log_count,
             **{("train_lr" if i == 0 else f"train_lr_{i}"): float(group["lr"]) for i, group in enumerate(groups)}}
    loop.log_sum, loop.log_count = 0.0, 0
    loop.curve.append(point)
    if log is not None:
        log(dict(point))
    return point


# A method's phases (`capt.phases`). At a boundary the method changes itself (`begin_phase`, e.g. XPrompt prunes its
# prompt); the loop then starts the new phase as a fresh training run would: the optimiser state (moments, step
# counts) is cleared, and the best validation state restarts, so the job keeps the best state of its final phase.
# Early stopping applies only in the final phase (stopping earlier would skip the phases still to come). The
# learning-rate schedule restarts at each boundary when the method asks for it (`phases_restart_schedule`;
# `pipelines.training.setup` builds it so). Which phase a job is in follows from its step alone, so a resumed job
# needs only the method's `phase_state`, which the checkpoint carries (`pipelines.training.checkpoint`).

def phase_boundaries(job) -> list[int]:
    """The steps after which the job's method starts a new phase (empty for a one-phase method)."""
    if job.optimizer is None:
        return []
    return list(job.accelerator.unwrap_model(job.model).training_phases(job.total_steps))


def begin_phase_if_due(job, loop: LoopState, best: dict) -> None:
    """At a boundary step: let the method begin its next phase, clear the optimiser state, restart the best state."""
    boundaries = phase_boundaries(job)
    if loop.step not in boundaries:
        return
    index = boundaries.index(loop.step) + 1
    model = job.accelerator.unwrap_model(job.model)

    def training_losses() -> Iterator[torch.Tensor]:
        # successive training batches in a fixed order, the same on every rank (no sharding, no shuffle)
        from accelerate.utils import send_to_device

        for batch in torch.utils.data.DataLoader(job.splits.train, batch_size=job.config.train.batch_size,
                                                 shuffle=False, collate_fn=job.collator):
            yield _batch_loss(job, model, send_to_device(batch, job.accelerator.device))

    model.eval()  # scores without dropout: every rank computes the same ones on the same batches
    model.begin_phase(index, training_losses)
    model.train()
    job.optimizer.optimizer.state.clear()
    loop.best_score, loop.best_step, loop.bad_evals = -math.inf, loop.step, 0
    best.clear()
    best.update(trainable_state(model))
    logger.info("%s: phase %d of %d begins after step %d (optimiser state cleared)", job.config.method.name,
                index + 1, len(boundaries) + 1, loop.step)
