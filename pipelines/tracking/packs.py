"""A pack of jobs tracked in MLflow as single jobs are (`pipelines.tracking.jobs`): every member's folder claimed,
its own run (params, every validation, the final metrics, result.json and the capsule, a registry version when
asked), its result.json in its own folder.

A member whose folder already holds the finished result of its exact config (`outputs.finished_result`, verified, and
checked against its finished run's scores as `tracked_job` checks a reused result) is not trained again: the others
train as a pack (the `train` handed in: `pipelines.training.packed.train_unfinished_members`), each saving its state at
every validation (`pipelines.training.packed`). An unfinished member, e.g. after a killed sweep, continues from its last
checkpoint (from scratch when it has none) in the pack run again; its run is the one it had (`TrialTracker` reopens it
from the record in its folder). If the pack raises, every run not finished ends FAILED.

Imports no mlflow itself: `pipelines.tracking` is imported only when a run is tracked.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipelines.tracking.jobs import RunPlan, TrackedResult, start_tracker, stored_digest
from pipelines.tracking.spool import numeric_metrics
from pipelines.training.outputs import RESULT_FILE, claim_job_folder, finished_result

logger = logging.getLogger(__name__)


TrainPack = Callable[[list, dict[int, Callable[[dict[str, Any]], None]], dict[str, Any] | None], list[dict[str, Any]]]
"""Trains a pack's unfinished members (configs, validation reporters by member index, pack info) and returns their
results in order: `pipelines.training.packed.train_unfinished_members`, handed in as a job's `train` is to
`tracked_job`."""


def tracked_pack(configs: list, plans: list[RunPlan], train: TrainPack, claim_wait_s: float = 0.0,
                 pack_info: dict[str, Any] | None = None) -> list[TrackedResult]:
    """Run the jobs `configs` (resolved) as one pack, each tracked by its `plans[i]`, the unfinished ones trained by
    `train`; their results, in order."""
    with contextlib.ExitStack() as stack:
        for config in configs:
            stack.enter_context(claim_job_folder(config, wait_s=claim_wait_s))
        trackers = [start_tracker(plan, config) if plan.uri else None
                    for plan, config in zip(plans, configs, strict=True)]
        stored = [stored_digest(config) for config in configs]
        try:
            results = _results(configs, trackers, train, pack_info)
        except BaseException as err:
            for tracker in trackers:
                if tracker is not None:
                    tracker.fail(err)
            raise
        for tracker, plan, result in zip(trackers, plans, results, strict=True):
            if tracker is not None:
                tracker.finish(result, Path(result["artifact_dir"]), register=plan.register)
    return [TrackedResult(result, digest is not None and result.get("result_digest") == digest,
                          *((tracker.run_id, tracker.run_url) if tracker is not None else ()))
            for result, digest, tracker in zip(results, stored, trackers, strict=True)]


def _results(configs: list, trackers: list, train: TrainPack,
             pack_info: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Each member's result: the finished one in its folder (verified), else trained now with the other such."""
    results = [finished_result(config) for config in configs]
    for config, tracker, result in zip(configs, trackers, results, strict=True):
        if result is not None and tracker is not None and tracker.finished:  # as `tracked_job` checks a reused one
            tracker.verify_reused(result, Path(config.resolved_output_dir()) / RESULT_FILE)
    todo = [i for i, result in enumerate(results) if result is None]
    if todo:
        logger.info("Pack %s: training %d member(s), reusing %d", (pack_info or {}).get("name", ""), len(todo),
                    len(configs) - len(todo))
        reports = {j: _reporter(trackers[i]) for j, i in enumerate(todo) if trackers[i] is not None}
        trained = train([configs[i] for i in todo], reports, pack_info)
        for i, result in zip(todo, trained, strict=True):
            results[i] = result
    return results


def _reporter(tracker) -> Callable[[dict[str, Any]], None]:
    """Logs a member's validation records to its run: a pack draws no loss curve of its own, so each record's
    ``train_loss`` (the mean since the previous validation) is the run's ``train/loss``."""
    def report(record: dict[str, Any]) -> None:
        tracker.log_metrics(numeric_metrics(record), step=int(record["step"]))
    return report
