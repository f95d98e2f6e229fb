"""One Tune trial: the Accelerate job of one grid point, tracked in MLflow and reported to Tune; or, in a packed
sweep, the members of one pack trained in one loop (`run_pack_trial`, below).

How it runs depends on `resources.num_workers` (`pipelines.sweeps.resources.runs_in_trial_process`):
- One worker: the job runs inside the Tune trial's own process, which asks Tune for that worker's resources.
  Ray Train would start a controller actor and a worker group for every trial (new Python processes that
  import torch, a placement group, a process group) and tear them down afterwards: seconds to tens of
  seconds of fixed cost per trial, for capsule jobs whose own work may be a second. Tune reuses the trial
  process between trials (`reuse_actors`), which keeps its frozen base models (`pipelines.models.cache`).
- Several workers: the Tune function trainable builds and fits a Ray Train `TorchTrainer` itself (Ray 2.60
  Train V2; `Tuner(trainer)` is deprecated) and forwards worker reports to Tune with `TuneReportCallback`.
Either way `tracked_job` runs the job: the folder claimed, world rank 0 alone logging to MLflow over HTTP,
every validation reported, the capsule registered before the final report.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from pipelines.config.load import validate_job_config
from pipelines.services.ray_connect import environment_values
from pipelines.sweeps.config import TUNED_HEAP_ENV, SweepConfig, is_pack_point, member_report_key, trial_job
from pipelines.sweeps.console import quiet_trial_process
from pipelines.sweeps.resources import runs_in_trial_process, worker_bundle
from pipelines.sweeps.trial_process import (
    CLAIM_WAIT_S,
    final_report,
    is_refusal,
    prepare_trial_process,
    refusal_report,
    trial_tracking,
)

logger = logging.getLogger(__name__)
PROGRESS_EVERY_S = 30.0
"""How often a trial's progress bar redraws: parallel trials share the driver's console, one line per redraw."""


def run_trial(params: dict[str, Any], sweep: dict[str, Any], tracking_uri: str | None,
              run_context: dict[str, Any] | None = None) -> None:
    """Tune function trainable: run the job of the grid point in `params["point"]`, in this process or on Ray Train.

    `run_context`: what the driver knows for every run: ``tags`` (source and git tags) and ``ui_uri`` (the
    server a registered version's loading snippet names)."""
    from ray import tune

    quiet_trial_process()
    config, point = TypeAdapter(SweepConfig).validate_python(sweep), params["point"]
    if is_pack_point(point):  # a packed sweep's point (kept by Tune for --resume whatever `pack:` says now)
        run_pack_trial(point, config, tracking_uri, run_context)
        return
    searched = {**point.get("select", {}), **{k: v for k, v in params.items() if k != "point"}}
    job, tracking = _job_and_tracking(config, point, searched, tune.get_context().get_trial_name(), tracking_uri,
                                      run_context)
    loop_config = {"job": job, "tracking": tracking}
    if runs_in_trial_process(config.resources):
        _run_in_trial_process(loop_config, config.resources.cpus_per_worker)
    else:
        _fit_torch_trainer(config, loop_config)


def _job_and_tracking(config: SweepConfig, point: dict[str, Any], searched: dict[str, Any], trial: str,
                      uri: str | None, run_context: dict[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The job dict of grid point `point` with `searched` values, and its run's tracking dict in Tune trial `trial`."""
    entry = next(e for e in config.methods if e.key == point["method"])
    job, _ = trial_job(config, point["task"], point["model"], entry, point["seed"], searched)
    return job, trial_tracking(config, job, point, entry, searched, trial, uri, run_context)


def _run_in_trial_process(loop_config: dict[str, Any], cpus: float) -> None:
    """The job in this (reused) process, with the torch threads a Ray Train worker of `cpus` CPUs would have."""
    import torch
    from ray import tune

    from pipelines.models.cache import BASE_MODELS

    prepare_trial_process(cpus)
    run_unless_refused(
        lambda: tracked_job(loop_config, tune.report, is_main=True, base_models=BASE_MODELS,
                            final_extra=lambda: {"torch_threads": torch.get_num_threads(), "process_id": os.getpid(),
                                                 "base_model_loads": BASE_MODELS.loads,
                                                 "base_model_hits": BASE_MODELS.hits}),
        tune.report, says_why=True)


def _fit_torch_trainer(config: SweepConfig, loop_config: dict[str, Any]) -> None:
    import ray.train
    from ray.train.torch import TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    resources = config.resources
    trainer = TorchTrainer(
        train_loop_per_worker=worker_loop,
        train_loop_config=loop_config,
        scaling_config=ray.train.ScalingConfig(
            num_workers=resources.num_workers, use_gpu=resources.gpus_per_worker > 0,
            resources_per_worker=worker_bundle(resources),
        ),
        run_config=ray.train.RunConfig(
            # keyed like the job folder: a changed config never meets the Train state of another one
            name=Path(loop_config["job"]["output_dir"]).name,
            storage_path=str(config.folder() / "train"),
            failure_config=ray.train.FailureConfig(max_failures=config.failure.worker_max_failures),
            callbacks=[TuneReportCallback()],
        ),
    )
    trainer.fit()


def worker_loop(loop_config: dict[str, Any]) -> None:
    """Ray Train worker: run the job; rank 0 tracks it in MLflow. A job refused by its own input ends with the
    refusal as every worker's last report (Tune reads rank 0's): every rank reads the same config and data, so all
    are refused alike, and each reports once, as Ray Train's report expects of every rank."""
    import ray.train

    quiet_trial_process()
    is_main = ray.train.get_context().get_world_rank() == 0
    run_unless_refused(lambda: tracked_job(loop_config, ray.train.report, is_main=is_main), ray.train.report,
                       says_why=is_main)


def run_unless_refused(job: Callable[[], None], report_to: Callable[[dict[str, Any]], None], says_why: bool) -> None:
    """Run `job`; when its own input refuses it (`is_refusal`), send `refusal_report` to `report_to` and return, so
    that neither Ray Train (which restarts a worker group on any error: its failure policy cannot tell errors
    apart) nor Tune retries what would fail the same way. Other errors propagate: they are retried, as the machine
    may not fail again (a killed process, a lost server). `says_why`: log the refusal (one process of the trial)."""
    try:
        job()
    except Exception as err:
        if not is_refusal(err):
            raise
        if says_why:
            logger.error("Trial refused by its own input, not retried: %s", err)
        report_to(refusal_report(err))


def tracked_job(loop_config: dict[str, Any], report_to: Callable[[dict[str, float]], None], is_main: bool,
                base_models=None, final_extra: Callable[[], dict[str, float]] | None = None) -> None:
    """Run the job of `loop_config` in this process (`pipelines.tracking.jobs.tracked_job`: the folder claimed,
    the main process tracking it): every validation goes to `report_to`, then the final result, after the tracker
    finished (so the capsule is registered when Tune sees the trial end)."""
    from pipelines.tracking.jobs import RunPlan
    from pipelines.tracking.jobs import tracked_job as track
    from pipelines.training.loop import run

    config = validate_job_config(loop_config["job"])
    done = track(config, RunPlan.from_dict(loop_config["tracking"]),
                 lambda report, log: run(config, report, base_models=base_models, log=log,
                                         progress_every_s=PROGRESS_EVERY_S),
                 report_to, is_main=is_main, claim_wait_s=CLAIM_WAIT_S)
    report_to(final_report(done.result, done.reused, final_extra))


# One Tune trial of a packed sweep (`run_trial` hands `run_pack_trial` a pack's point): the members of one
# pack (`pipelines.sweeps.config.sweep_packs`) trained in one loop on one base model, in the Tune trial's own process
# (`pipelines.tracking.jobs.tracked_pack`).
#
# Each member is what a trial is in a sweep without packing: its job config from `config.trial_job` (same config
# hash, same output folder), its own MLflow run named and tagged as a trial's (`trial_process.trial_tracking`),
# nested like every trial's under the sweep's parent run, plus the tag ``pack`` (the pack trial's name), and its
# result.json. The pack trial has no run of its own: members then read in the UI's runs table exactly as unpacked
# trials do (one level under the sweep's run, comparable with any trial), and the tag groups them. Tune gets one final
# report: each member's final figures under ``member<i>.`` (what the summary reads, `config.member_points`),
# ``validation_score`` (the best member's, Tune's metric), counts of members trained and reused.

PACK_TAG = "pack"
"""Run tag of a pack member: the name of the pack (Tune trial) it trained in."""


def run_pack_trial(point: dict[str, Any], config: SweepConfig, tracking_uri: str | None,
                   run_context: dict[str, Any] | None) -> None:
    """The Tune trial of a packed sweep: train the pack of grid point `point` and report every member."""
    from ray import tune

    from pipelines.tracking.jobs import RunPlan, tracked_pack
    from pipelines.training.packed import train_unfinished_members

    name = tune.get_context().get_trial_name()
    members = [_member(config, member, name, tracking_uri, run_context or {}) for member in point["members"]]
    prepare_trial_process(config.resources.cpus_per_worker)
    info = {"name": point["pack"], "trials": [job.resolved_output_dir().name for job, _ in members],
            "heap": environment_values(TUNED_HEAP_ENV)}  # the glibc heap settings this process started with
    done = tracked_pack([job for job, _ in members], [RunPlan.from_dict(t) for _, t in members],
                        train_unfinished_members, claim_wait_s=CLAIM_WAIT_S, pack_info=info)
    tune.report(pack_report(done))


def _member(config: SweepConfig, point: dict[str, Any], pack: str, uri: str | None,
            context: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """A member's resolved job config and its run's tracking dict, as `run_trial` makes a trial's."""
    job, tracking = _job_and_tracking(config, point, dict(point.get("select", {})), pack, uri, context)
    tracking["tags"][PACK_TAG] = pack
    return validate_job_config(job), tracking


def pack_report(done: list) -> dict[str, float]:
    """The pack trial's one Tune report (`done`: each member's `TrackedResult`)."""
    report = {member_report_key(index, key): value for index, member in enumerate(done)
              for key, value in final_report(member.result, member.reused, None).items()}
    reused = sum(member.reused for member in done)
    return {"validation_score": max(m.result["metrics"]["best_validation_score"] for m in done),
            "members": float(len(done)), "members_reused": float(reused), "members_trained": float(len(done) - reused),
            "reused": float(reused == len(done)), **report}
