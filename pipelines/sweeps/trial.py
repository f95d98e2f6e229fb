"""One Tune trial: the Accelerate job of one grid point, tracked in MLflow and reported to Tune.

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

import json
import logging
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from pipelines.config.load import validate_job_config
from pipelines.config.schema import model_slug
from pipelines.sweeps.config import SweepConfig, trial_job
from pipelines.sweeps.console import quiet_trial_process
from pipelines.sweeps.resources import runs_in_trial_process, worker_bundle
from pipelines.sweeps.select import SELECT_TAG, select_label
from pipelines.training.outputs import claim_job_folder, config_hash

logger = logging.getLogger(__name__)
RUN_DESCRIPTION = "mlflow.note.content"
"""The run tag MLflow shows as the run's description."""
PROGRESS_EVERY_S = 30.0
"""How often a trial's progress bar redraws: parallel trials share the driver's console, one line per redraw."""
CLAIM_WAIT_S = 60.0
"""How long a trial's main worker waits for the previous attempt of the same trial to let go of its folder."""
RESET_WAIT_S = "60"
"""Seconds Tune waits for a finished trial's thread before reusing its process (Tune's own default, 2 s, can be
shorter than a stopped trial's clean-up, e.g. marking its MLflow run failed, and then fails the next trial)."""


def run_trial(params: dict[str, Any], sweep: dict[str, Any], tracking_uri: str | None,
              run_context: dict[str, Any] | None = None) -> None:
    """Tune function trainable: run the job of the grid point in `params["point"]`, in this process or on Ray Train.

    `run_context`: what the driver knows for every run: ``tags`` (source and git tags) and ``ui_uri`` (the
    server a registered version's loading snippet names)."""
    from ray import tune

    quiet_trial_process()
    config = TypeAdapter(SweepConfig).validate_python(sweep)
    point = params["point"]
    searched = {**point.get("select", {}), **{k: v for k, v in params.items() if k != "point"}}
    entry = next(e for e in config.methods if e.key == point["method"])
    job = trial_job(config, point["task"], point["model"], entry, point["seed"], searched)
    name = tune.get_context().get_trial_name()
    tracking = _tracking(config, job, point, entry, searched, name, tracking_uri)
    context = run_context or {}
    tracking["tags"] = {**context.get("tags", {}), **tracking["tags"]}
    tracking["ui_uri"] = context.get("ui_uri")
    tracking["moved_from"] = tuple(context.get("moved_from", ()))
    loop_config = {"job": job, "tracking": tracking}
    if runs_in_trial_process(config.resources):
        _run_in_trial_process(loop_config, config.resources.cpus_per_worker)
    else:
        _fit_torch_trainer(config, loop_config)


def _run_in_trial_process(loop_config: dict[str, Any], cpus: float) -> None:
    """The job in this (reused) process, with the torch threads a Ray Train worker of `cpus` CPUs would have."""
    import torch
    from ray import tune

    from pipelines.models.cache import BASE_MODELS

    os.environ.setdefault("TUNE_FUNCTION_THREAD_TIMEOUT_S", RESET_WAIT_S)  # read by Tune when it resets this process
    # Ray sets OMP_NUM_THREADS for every actor from its CPUs (unless set already), as it does for Train workers.
    threads = int(os.environ.get("OMP_NUM_THREADS") or max(1, math.floor(cpus)))
    torch.set_num_threads(threads)
    _forget_accelerate_state()
    tracked_job(loop_config, tune.report, is_main=True, base_models=BASE_MODELS,
                final_extra=lambda: {"torch_threads": torch.get_num_threads(), "process_id": os.getpid(),
                                     "base_model_loads": BASE_MODELS.loads, "base_model_hits": BASE_MODELS.hits})


def _forget_accelerate_state() -> None:
    """Accelerate keeps one state per process: a reused trial process starts each job from none, as a new one does."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


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
            storage_path=str(config.storage_root() / config.name / "train"),
            failure_config=ray.train.FailureConfig(max_failures=config.failure.worker_max_failures),
            callbacks=[TuneReportCallback()],
        ),
    )
    trainer.fit()


def _tracking(config: SweepConfig, job: dict, point: dict, entry, searched: dict, trial: str, uri: str | None) -> dict:
    from pipelines.methods import registers_model

    slug = model_slug(point["model"])
    run_name = f"{point['task']}/{slug}/{entry.key}/s{point['seed']}"
    if searched:
        run_name += "/" + ",".join(f"{k}={v}" for k, v in sorted(searched.items()))
    return {
        "uri": uri, "experiment": config.experiment_name(), "run_name": run_name, "retry_s": config.tracking.retry_s,
        "system_metrics_interval_s": config.tracking.system_metrics_interval_s,
        "register": config.tracking.register and registers_model(entry.name),
        "tags": {"task": point["task"], "model": slug, "base_model": point["model"], "method": entry.key,
                 "method_name": entry.name, "seed": str(point["seed"]), "sweep": config.name, "trial": trial,
                 "data": "generated" if job["task"]["source"] == "generated" else "real",
                 "config_hash": config_hash(validate_job_config(job)),
                 SELECT_TAG: select_label(point.get("select", {})),
                 RUN_DESCRIPTION: f"{entry.key} on {point['task']} with base model {point['model']}, "
                                  f"seed {point['seed']} (trial {trial} of sweep {config.name})"},
    }


def worker_loop(loop_config: dict[str, Any]) -> None:
    """Ray Train worker: run the job; rank 0 tracks it in MLflow."""
    import ray.train

    quiet_trial_process()
    tracked_job(loop_config, ray.train.report, is_main=ray.train.get_context().get_world_rank() == 0)


def tracked_job(loop_config: dict[str, Any], report_to: Callable[[dict[str, float]], None], is_main: bool,
                base_models=None, final_extra: Callable[[], dict[str, float]] | None = None) -> None:
    """Run the job of `loop_config` in this process: every validation goes to `report_to` (and to MLflow from the
    main process, less its `train_loss`: MLflow's ``train/loss`` is the loss curve's, `pipelines.training.loss_curve`,
    and two values at one step would draw a zigzag), then the final result, after the tracker finished."""
    from pipelines.train import run

    config = validate_job_config(loop_config["job"])
    tracker = None

    def report(metrics: dict[str, Any]) -> None:
        numeric = _numeric(metrics)
        if tracker is not None:
            tracker.log_metrics({k: v for k, v in numeric.items() if k != "train_loss"}, step=int(metrics["step"]))
        report_to(numeric)

    def log(point: dict[str, Any]) -> None:
        if tracker is not None:
            tracker.log_metrics(_numeric(point), step=int(point["step"]))

    # The folder is claimed before the tracker reads or writes its run record there. A restarted worker
    # group or trial can start while the previous attempt's process is still exiting, hence the wait.
    with claim_job_folder(config, wait_s=CLAIM_WAIT_S):
        tracker = _start_tracker(loop_config["tracking"], config) if is_main else None
        reusing = tracker is not None and tracker.finished  # an earlier attempt finished: its result is reused
        stored = _stored_digest(config)
        try:
            result = run(config, report, base_models=base_models, log=log, progress_every_s=PROGRESS_EVERY_S)
            if reusing:  # believed only when its scores are those its run logged
                tracker.verify_reused(result, Path(config.resolved_output_dir()) / "result.json")
        except BaseException:
            if tracker is not None:
                tracker.fail()  # the run ends FAILED; a retried trial reopens the same run
            raise
        if tracker is not None:  # before the last report, so the capsule is registered when Tune sees the trial end
            tracker.finish(result, Path(result["artifact_dir"]), register=loop_config["tracking"]["register"])
    report_to(_final_report(result, stored, final_extra))


def _final_report(result: dict[str, Any], stored_digest: str | None,
                  final_extra: Callable[[], dict[str, float]] | None) -> dict[str, float]:
    """The trial's last report: the final scores, the steps, `final_extra`'s figures and ``reused``: 1 when the job
    returned the finished result already in its folder (its digest; a result trained now has one of its own)."""
    final = result["metrics"]
    extra = final_extra() if final_extra is not None else {}
    reused = stored_digest is not None and result.get("result_digest") == stored_digest
    return {**_numeric(final), "validation_score": final["best_validation_score"], "step": result["steps"],
            "reused": float(reused), **_numeric(extra)}


def _stored_digest(config) -> str | None:
    """The digest of the finished result already in the job's folder, if any: the job returns that same result
    (and trains nothing) when it reuses it; a result trained now has a digest of its own."""
    try:
        return json.loads((Path(config.resolved_output_dir()) / "result.json").read_text()).get("result_digest")
    except (OSError, ValueError, AttributeError):
        return None


def _start_tracker(tracking: dict[str, Any], config):
    if not tracking["uri"]:
        return None
    from pipelines.models.shape import model_shape
    from pipelines.tracking import TrialTracker
    from pipelines.tracking.run_content import run_params
    from pipelines.tracking.spool import RetryPolicy

    params, path_tags = run_params(config.to_dict(), model_shape(config.model.name).spec.classifier_head)
    tracker = TrialTracker(tracking["uri"], tracking["experiment"], tracking["run_name"],
                           {**tracking["tags"], **path_tags}, state_dir=Path(config.resolved_output_dir()),
                           retry=RetryPolicy(budget_s=tracking["retry_s"]),
                           system_metrics_interval_s=tracking.get("system_metrics_interval_s", 10.0),
                           ui_uri=tracking.get("ui_uri"), moved_from=tuple(tracking.get("moved_from", ())))
    tracker.start()
    tracker.log_params(params)
    return tracker


def _numeric(metrics: dict[str, Any]) -> dict[str, float]:
    """Finite numbers only (Tune and MLflow take floats)."""
    return {k: float(v) for k, v in metrics.items()
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(float(v))}
