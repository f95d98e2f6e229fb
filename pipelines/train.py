"""One training job: train -> validate -> early stop -> test at the best checkpoint -> artifact.

    python -m pipelines.train --config pipelines/configs/job/smoke.yaml [key.sub=value ...]
    torchrun --standalone --nproc_per_node 2 -m pipelines.train --config FILE      # 2 processes (gloo on CPU)

`run(config, report=..., log=...)` is the same job as a function; the sweep calls it inside Ray Train workers.
With `--tracking-uri URI` (or MLFLOW_TRACKING_URI) the job logs one MLflow run as a sweep's trial does
(`pipelines.tracking.jobs`, `pipelines.tracking.job_cli`).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from tqdm.auto import tqdm

from capt.arch.readout import remove_readout
from capt.atomic import write_atomically
from pipelines.cli_errors import cli_main
from pipelines.config.checks import ignored_data_dir_note
from pipelines.config.load import require_resolved
from pipelines.config.schema import JobConfig
from pipelines.evaluation import evaluate, per_example_nll
from pipelines.methods import model_inputs, save_artifact
from pipelines.models.cache import BaseModelCache
from pipelines.tracking.job_cli import TRACKING_HELP, add_tracking_flags, train_from_cli
from pipelines.training.cached import seal_result
from pipelines.training.checkpoint import (
    LoopState,
    load_checkpoint,
    restore_trainable,
    rng_restored_once_started,
    save_checkpoint,
    trainable_state,
)
from pipelines.training.disk_full import no_space_reported
from pipelines.training.loss_curve import Log, curve_point_if_due
from pipelines.training.outputs import claim_job_folder, finished_result, is_main_process
from pipelines.training.phases import begin_phase_if_due, in_final_phase
from pipelines.training.result import ranks_in_sync, result_record
from pipelines.training.setup import Job, build_job, num_labels

logger = logging.getLogger(__name__)
Report = Callable[[dict[str, Any]], None]



class TrainingDivergedError(RuntimeError):
    """The loss became NaN or infinite; the last good checkpoint is kept."""


@dataclass
class _Meter:
    """Throughput of this process's run (not part of the resumable state)."""

    tokens: int = 0
    started: float = 0.0


def run(config: JobConfig, report: Report | None = None, base_models: BaseModelCache | None = None,
        log: Log | None = None, progress_every_s: float = 0.1) -> dict[str, Any]:
    """Run the job described by `config`; `report(metrics)` is called on every rank at each validation, `log(point)`
    at each point of the training-loss curve (every `train.log_every_steps` steps, `pipelines.training.loss_curve`).
    The progress bar redraws at most every `progress_every_s` seconds (a sweep's trials share one console).

    `base_models`: a cache to take the base model from and give it back to (the sweep's single-worker trials,
    whose process is reused between trials); None loads it afresh, as a one-off job should.

    The job first claims its output folder (see `pipelines.training.outputs`): one job per folder, and never
    another config's outputs. With `train.resume`, a folder that already holds the finished result of
    this same config returns that result without training again (a restarted sweep never runs a trial
    twice), and a checkpoint of this same config is continued. `config` is the resolved config that
    `pipelines.config.load_job_config` returns (anything else is refused): its folder, hash and result hold the
    values used.
    """
    config = require_resolved(config, "pipelines.train.run")
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
    config = job.config
    accelerator = job.accelerator
    loop, best, resumed_rng = _start_or_resume(job)
    if config.train.score_untrained and loop.step == 0 and loop.untrained_score is None:
        loop.untrained_score = _evaluate(job, job.splits.test)["score"]  # the reference training has to beat
        job.model.train()
    meter = _Meter(started=time.perf_counter())
    # closed on an error too, ending its line, so that the entry point's error paragraph starts a line of its own
    with tqdm(total=job.total_steps, initial=loop.step, disable=not accelerator.is_local_main_process,
              desc=f"{config.task.name}/{config.method.name}", mininterval=progress_every_s) as progress:
        if job.optimizer is None:  # training-free method: validate and test only
            stopped_early = _validate(job, loop, best, report)
        else:
            stopped_early = _train(job, loop, meter, progress, best, (report, log), resumed_rng)
            curve_point_if_due(job, loop, log, final=True)  # the steps after the last full window
    return _finish(job, loop, meter, best, stopped_early)


def _start_or_resume(job: Job) -> tuple[LoopState, dict, torch.Tensor | None]:
    """(loop, best weights, torch's CPU random state as the checkpoint restored it; None when starting afresh)."""
    latest = job.output_dir / "checkpoints" / "latest"
    job.accelerator.wait_for_everyone()  # the main process has claimed the folder: every rank sees the same state
    if job.config.train.resume and latest.is_dir():
        loop, best = load_checkpoint(job.accelerator, latest)
        logger.info("Resumed from %s at step %d", latest, loop.step)
        return loop, best, torch.get_rng_state()
    return LoopState(), trainable_state(job.accelerator.unwrap_model(job.model)), None


def _train(job: Job, loop: LoopState, meter: _Meter, progress, best: dict, callbacks: tuple,
           resumed_rng: torch.Tensor | None = None) -> bool:
    """The epoch loop; returns True when early stopping ended it. `best` is updated in place. `resumed_rng`: the
    random state of the checkpoint resumed from, set again once the resumed epoch's batches start."""
    cfg, (report, log) = job.config.train, callbacks
    while loop.epoch < cfg.max_epochs and loop.step < job.total_steps:
        job.train_loader.set_epoch(loop.epoch)
        batches = job.accelerator.skip_first_batches(job.train_loader, loop.batches_in_epoch)
        if resumed_rng is not None:
            batches, resumed_rng = rng_restored_once_started(batches, resumed_rng), None
        for batch in batches:
            _train_step(job, batch, loop, meter)
            loop.batches_in_epoch += 1
            if not job.accelerator.sync_gradients:
                continue
            progress.update(1)
            if point := curve_point_if_due(job, loop, log):
                progress.set_postfix(loss=f"{point['train_loss']:.4g}", refresh=False)
            begin_phase_if_due(job, loop, best, partial(_batch_loss, job))
            if cfg.eval_every_steps and loop.step % cfg.eval_every_steps == 0 and _validate(job, loop, best, report):
                return True
            if cfg.checkpoint_every_steps and loop.step % cfg.checkpoint_every_steps == 0:
                save_checkpoint(job.accelerator, job.output_dir / "checkpoints" / "latest", loop, best)
            if loop.step >= job.total_steps:
                break
        else:
            loop.epoch, loop.batches_in_epoch = loop.epoch + 1, 0
            if not cfg.eval_every_steps and _validate(job, loop, best, report):
                return True
    if not loop.history or loop.history[-1]["step"] != loop.step:
        return _validate(job, loop, best, report)  # the final state is always validated
    return False


def _train_step(job: Job, batch: dict, loop: LoopState, meter: _Meter) -> None:
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
    meter.tokens += int(batch["attention_mask"].sum()) * accelerator.num_processes
    if accelerator.sync_gradients:
        loop.step += 1


def _batch_loss(job: Job, model, batch: dict) -> torch.Tensor:
    return _loss(job, model(**model_inputs(batch), **_label_kwargs(job, batch)), batch)


def _label_kwargs(job: Job, batch: dict) -> dict:
    # T5 needs labels to build decoder inputs; decoder-only capsules derive the prompt from them.
    return {} if job.spec.classifier_head else {"labels": batch["labels"]}


def _loss(job: Job, outputs, batch: dict) -> torch.Tensor:
    if job.spec.classifier_head:
        return torch.nn.functional.cross_entropy(outputs.logits.float(), batch["labels"])
    return per_example_nll(outputs.logits, batch["labels"], shift=job.spec.shifts_labels).mean()


def _validate(job: Job, loop: LoopState, best: dict, report: Report | None) -> bool:
    """Score validation, keep the best trainable state, report; True when patience ran out."""
    metrics = _evaluate(job, job.splits.validation)
    record = {"step": loop.step, "epoch": loop.epoch, "train_loss": loop.mean_loss(),
              **{f"validation_{k}": v for k, v in metrics.items()}}
    loop.loss_sum, loop.loss_count = 0.0, 0  # each record's train_loss covers the steps since the last one
    loop.history.append(record)
    if metrics["score"] > loop.best_score:
        loop.best_score, loop.best_step, loop.bad_evals = metrics["score"], loop.step, 0
        best.clear()
        best.update(trainable_state(job.accelerator.unwrap_model(job.model)))
    else:
        loop.bad_evals += 1
    record["best_validation_score"] = loop.best_score
    # reported before it is checkpointed: a kill between the two makes the resumed job validate this step again,
    # never leaves a checkpointed validation that no run logged
    if report is not None:
        report(dict(record))
    if job.config.train.checkpoint_every_steps is None:
        save_checkpoint(job.accelerator, job.output_dir / "checkpoints" / "latest", loop, best)
    job.model.train()
    patience = job.config.train.patience
    return patience is not None and loop.bad_evals >= patience and in_final_phase(job, loop.step)


def _evaluate(job: Job, examples) -> dict[str, float]:
    cfg = job.config
    return evaluate(job.accelerator, job.model, examples, job.collator, job.spec, cfg.train.eval_mode,
                    cfg.train.eval_batch_size, cfg.model.max_new_tokens, job.tokenizer)


def _finish(job: Job, loop: LoopState, meter: _Meter, best: dict, stopped_early: bool) -> dict[str, Any]:
    """Test at the best checkpoint, write the artifact and result.json (rank 0), return the result."""
    accelerator = job.accelerator
    in_sync = ranks_in_sync(job)
    restore_trainable(accelerator.unwrap_model(job.model), best)
    test = _evaluate(job, job.splits.test)
    wall = time.perf_counter() - meter.started
    scores = {"train_loss": loop.history[-1]["train_loss"], "best_validation_score": loop.best_score,
              **{f"test_{k}": v for k, v in test.items()}}
    result = result_record(job, job.spec.family, loop, scores, best, stopped_early, wall,
                           meter.tokens / max(wall, 1e-9), accelerator.device, accelerator.num_processes, in_sync,
                           str(job.output_dir / "artifact"))
    if accelerator.is_main_process:
        save_artifact(accelerator.unwrap_model(job.model), job.base_model, job.config.method.name,
                      job.output_dir / "artifact", job.config.task.name, result["metrics"], job.config.model.readout)
        seal_result(result, job.output_dir / "artifact")  # the artifact's digests, then result.json's own
        write_atomically(job.output_dir / "result.json", json.dumps(result, indent=2, default=str))
    accelerator.wait_for_everyone()
    return result


def main(argv: list[str] | None = None) -> int:
    """CLI: validate the config (every problem at once) and the tracking server, then run the job; exit 2 on bad
    input."""
    parser = argparse.ArgumentParser(prog="python -m pipelines.train", description=__doc__.split("\n")[0],
                                     epilog=TRACKING_HELP)
    parser.add_argument("--config", help="job YAML (see pipelines/configs/job/)")
    parser.add_argument("overrides", nargs="*", help="key.sub=value overrides, e.g. train.max_steps=20")
    add_tracking_flags(parser)
    return cli_main(parser, argv, lambda args: train_from_cli(args, _run_once_noted),
                    expected=(TrainingDivergedError,))


def _run_once_noted(config: JobConfig, report: Report | None = None, log: Log | None = None) -> dict[str, Any]:
    """`run` for the command line: first says (once, main process) that CAPT_DATA_DIR is ignored when the job does
    not read it; not in `run`, which every trial of a sweep calls too."""
    note = ignored_data_dir_note(config.task.source, config.task.data_dir, "this job reads",
                                 "run it with task.source=local" if config.task.source != "local"
                                 else "leave task.data_dir unset")
    if note and is_main_process():
        logger.warning(note)
    return run(config, report, log=log)


if __name__ == "__main__":
    sys.exit(main())
