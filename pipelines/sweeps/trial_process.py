"""What every Tune trial process of a sweep shares, whether it runs one trial's job or a pack's
(`pipelines.sweeps.trial`): the process prepared for a job, the run's tracking dict, the final report."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

from capt.methods import get_method
from pipelines.config.load import validate_job_config
from pipelines.sweeps.config import SweepConfig
from pipelines.sweeps.select import SELECT_TAG, select_label
from pipelines.tracking.jobs import job_run_name, job_run_tags
from pipelines.tracking.run_content import DESCRIPTION_TAG, numeric_metrics

CLAIM_WAIT_S = 60.0
"""How long a trial's main worker waits for the previous attempt of the same trial to let go of its folder."""
RESET_WAIT_S = "60"
"""Seconds Tune waits for a finished trial's thread before reusing its process (Tune's own default, 2 s, can be
shorter than a stopped trial's clean-up, e.g. marking its MLflow run failed, and then fails the next trial)."""


def prepare_trial_process(cpus: float) -> None:
    """Before a job in a (reused) Tune trial process: the torch threads a Ray Train worker of `cpus` CPUs would have,
    no Accelerate state left from the previous job."""
    import torch

    os.environ.setdefault("TUNE_FUNCTION_THREAD_TIMEOUT_S", RESET_WAIT_S)  # read by Tune when it resets this process
    # Ray sets OMP_NUM_THREADS for every actor from its CPUs (unless set already), as it does for Train workers.
    threads = int(os.environ.get("OMP_NUM_THREADS") or max(1, math.floor(cpus)))
    torch.set_num_threads(threads)
    forget_accelerate_state()


def forget_accelerate_state() -> None:
    """Accelerate keeps one state per process: a reused trial process starts each job from none, as a new one does."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def trial_tracking(config: SweepConfig, job: dict, point: dict, entry, searched: dict, trial: str,
                   uri: str | None, run_context: dict[str, Any] | None = None) -> dict:
    """The `RunPlan` fields (a plain dict, for Ray) of the run of the grid point `point` in Tune trial `trial`;
    `run_context` (`pipelines.sweeps.trial.run_trial`) adds its tags, the UI's URI and the store's former URIs."""
    job_config, context = validate_job_config(job), run_context or {}
    run_name = job_run_name(job_config, entry.key) + (f"/{select_label(searched)}" if searched else "")
    return {
        "uri": uri, "experiment": config.experiment_name(), "run_name": run_name, "retry_s": config.tracking.retry_s,
        "system_metrics_interval_s": config.tracking.system_metrics_interval_s,
        "register": config.tracking.register and get_method(entry.name).registers_model,
        "tags": {**context.get("tags", {}), **job_run_tags(job_config, entry.key), "sweep": config.name,
                 "trial": trial, SELECT_TAG: select_label(point.get("select", {})),
                 DESCRIPTION_TAG: f"{entry.key} on {point['task']} with base model {point['model']}, "
                                  f"seed {point['seed']} (trial {trial} of sweep {config.name})"},
        "ui_uri": context.get("ui_uri"), "moved_from": tuple(context.get("moved_from", ())),
    }


REFUSED_KEY = "refused"
"""The last report of a trial refused by its own input: the reason, one line (`refusal_report`)."""


def is_refusal(err: BaseException) -> bool:
    """An error the trial's own input causes (its config, data, a cached result or artifact failing its check, the
    model's files): the same on every attempt, so not retried. A held job folder (a previous attempt still ending)
    and a full disk are the machine's state, and are retried."""
    from capt.errors import CaptError
    from pipelines.training.disk_full import NoSpaceError
    from pipelines.training.outputs import JobFolderError

    return isinstance(err, CaptError) and not isinstance(err, JobFolderError | NoSpaceError)


def refusal_report(err: BaseException) -> dict[str, Any]:
    """What a refused trial reports last (Tune then ends it without a retry): the reason on one line, and the worst
    validation score (Tune requires its metric in every result; a scheduler ranks the trial last)."""
    reason = " ".join(str(err).split())
    return {REFUSED_KEY: f"{type(err).__name__}: {reason[:300]}{'...' if len(reason) > 300 else ''}",
            "validation_score": float("-inf")}


def final_report(result: dict[str, Any], reused: bool,
                 final_extra: Callable[[], dict[str, float]] | None) -> dict[str, float]:
    """The trial's last report: the final scores, the steps, `final_extra`'s figures and ``reused``: 1 when the job
    returned the finished result already in its folder."""
    final = result["metrics"]
    extra = final_extra() if final_extra is not None else {}
    return {**numeric_metrics(final), "validation_score": final["best_validation_score"], "step": result["steps"],
            "reused": float(reused), **numeric_metrics(extra)}


