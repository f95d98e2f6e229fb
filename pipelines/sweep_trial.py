"""One Tune trial: a Ray Train `TorchTrainer` whose workers run `pipelines.train.run` with Accelerate.

The Tune function trainable builds and fits the trainer itself (Ray 2.60 Train V2; `Tuner(trainer)` is
deprecated) and forwards worker reports to Tune with `TuneReportCallback`. World rank 0 alone logs to
MLflow over HTTP; every rank reports to Ray Train the same number of times.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from pipelines.config import flatten, model_slug, validate_job_config
from pipelines.job_outputs import claim_job_folder, config_hash
from pipelines.sweep_config import SweepConfig, trial_job
from pipelines.sweep_resources import worker_bundle
from pipelines.sweep_select import SELECT_TAG, select_label

logger = logging.getLogger(__name__)
CLAIM_WAIT_S = 60.0
"""How long a trial's main worker waits for the previous attempt of the same trial to let go of its folder."""


def run_trial(params: dict[str, Any], sweep: dict[str, Any], tracking_uri: str | None) -> None:
    """Tune function trainable: fit one TorchTrainer for the grid point in `params["point"]`."""
    import ray.train
    from ray import tune
    from ray.train.torch import TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    config = TypeAdapter(SweepConfig).validate_python(sweep)
    point = params["point"]
    searched = {**point.get("select", {}), **{k: v for k, v in params.items() if k != "point"}}
    entry = next(e for e in config.methods if e.key == point["method"])
    job = trial_job(config, point["task"], point["model"], entry, point["seed"], searched)
    name = tune.get_context().get_trial_name()
    resources = config.resources
    trainer = TorchTrainer(
        train_loop_per_worker=worker_loop,
        train_loop_config={"job": job, "tracking": _tracking(config, job, point, entry, searched, name, tracking_uri)},
        scaling_config=ray.train.ScalingConfig(
            num_workers=resources.num_workers, use_gpu=resources.gpus_per_worker > 0,
            resources_per_worker=worker_bundle(resources),
        ),
        run_config=ray.train.RunConfig(
            # keyed like the job folder: a changed config never meets the Train state of another one
            name=Path(job["output_dir"]).name, storage_path=str(config.storage_root() / config.name / "train"),
            failure_config=ray.train.FailureConfig(max_failures=config.failure.worker_max_failures),
            callbacks=[TuneReportCallback()],
        ),
    )
    trainer.fit()


def _tracking(config: SweepConfig, job: dict, point: dict, entry, searched: dict, trial: str, uri: str | None) -> dict:
    slug = model_slug(point["model"])
    run_name = f"{point['task']}/{slug}/{entry.key}/s{point['seed']}"
    if searched:
        run_name += "/" + ",".join(f"{k}={v}" for k, v in sorted(searched.items()))
    return {
        "uri": uri, "experiment": config.experiment_name(), "run_name": run_name, "retry_s": config.tracking.retry_s,
        "register": config.tracking.register and entry.name == "capt",
        "tags": {"task": point["task"], "model": slug, "base_model": point["model"], "method": entry.key,
                 "method_name": entry.name, "seed": str(point["seed"]), "sweep": config.name, "trial": trial,
                 "config_hash": config_hash(validate_job_config(job)), SELECT_TAG: select_label(point.get("select", {}))},
    }


def worker_loop(loop_config: dict[str, Any]) -> None:
    """Ray Train worker: run the job; rank 0 tracks it in MLflow."""
    import ray.train

    from pipelines.train import run

    config = validate_job_config(loop_config["job"])
    rank = ray.train.get_context().get_world_rank()
    tracker = None

    def report(metrics: dict[str, Any]) -> None:
        numeric = _numeric(metrics)
        if tracker is not None:
            tracker.log_metrics(numeric, step=int(metrics["step"]))
        ray.train.report(numeric)

    # The folder is claimed before the tracker reads or writes its run record there. A restarted worker
    # group can start while the previous attempt's process is still exiting, hence the wait.
    with claim_job_folder(config, wait_s=CLAIM_WAIT_S):
        tracker = _start_tracker(loop_config["tracking"], config) if rank == 0 else None
        try:
            result = run(config, report)
        except BaseException:
            if tracker is not None:
                tracker.fail()  # the run ends FAILED; a retried trial reopens the same run
            raise
        if tracker is not None:  # before the last report, so the capsule is registered when Tune sees the trial end
            tracker.finish(result, Path(result["artifact_dir"]), register=loop_config["tracking"]["register"])
    final = result["metrics"]
    ray.train.report({**_numeric(final), "validation_score": final["best_validation_score"], "step": result["steps"]})


def _start_tracker(tracking: dict[str, Any], config):
    if not tracking["uri"]:
        return None
    from pipelines.tracking import TrialTracker
    from pipelines.tracking_spool import RetryPolicy

    tracker = TrialTracker(tracking["uri"], tracking["experiment"], tracking["run_name"], tracking["tags"],
                           state_dir=Path(config.resolved_output_dir()), retry=RetryPolicy(budget_s=tracking["retry_s"]))
    tracker.start()
    tracker.log_params(flatten(config.to_dict()))
    return tracker


def _numeric(metrics: dict[str, Any]) -> dict[str, float]:
    """Finite numbers only (Tune and MLflow take floats)."""
    return {k: float(v) for k, v in metrics.items()
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(float(v))}
