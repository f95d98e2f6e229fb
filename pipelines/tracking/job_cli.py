"""`python -m pipelines.train`'s command line around the job: its ``--tracking-uri`` / ``--experiment`` /
``--register`` flags, the server checked before the job starts, the job run (tracked when a server is given), and
the lines it ends with (the scores, then the run's URL or how to track it)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from capt.methods import get_method
from pipelines.config.load import load_job_config
from pipelines.config.schema import JobConfig
from pipelines.services.folder_lock import folder_problem
from pipelines.services.mlflow_server import check_mlflow_server, credentials_in_uri
from pipelines.services.probe import ServiceError
from pipelines.tracking.jobs import (
    JOB_EXPERIMENT,
    RunPlan,
    TrackedResult,
    job_run_tags,
    single_job_run_name,
    tracked_job,
)
from pipelines.training.outputs import is_main_process

URI_ENV = "MLFLOW_TRACKING_URI"
NOT_TRACKED = (f"Not tracked in MLflow (no --tracking-uri and no {URI_ENV}): to log this job as an MLflow run, run "
               f"it again with --tracking-uri http://HOST:PORT or with {URI_ENV} set.")
TRACKING_HELP = (
    f"MLflow: with --tracking-uri URI, or else the environment variable {URI_ENV}, the job logs one MLflow run (in "
    f"experiment --experiment, default {JOB_EXPERIMENT}) as a sweep's trial does: the resolved config as params, "
    "the loss curve and every validation, the final scores, the dataset, result.json and the capsule artifact with "
    "its digest, tags task/model/method/seed; the server is checked before training (exit 2 when it does not "
    "answer like MLflow), and the run's URL is printed at the end. A job whose finished result is reused "
    "(train.resume=true, same config) logs no second run. Without either, the job is not tracked.")


def add_tracking_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tracking-uri", metavar="URI", default=None,
                        help=f"MLflow tracking server to log this job's run to (default: env {URI_ENV}; "
                             "neither: the job is not tracked)")
    parser.add_argument("--experiment", metavar="NAME", default=JOB_EXPERIMENT,
                        help=f"MLflow experiment of the run (default: {JOB_EXPERIMENT})")
    parser.add_argument("--register", action="store_true",
                        help="also register the capsule as a new version of capt-<model>-<task>, as a sweep does")


def job_plan(args: argparse.Namespace, config: JobConfig) -> RunPlan:
    """The job's run plan; a given server is checked now, before anything is written (`ServiceError`)."""
    uri = args.tracking_uri or os.environ.get(URI_ENV) or None
    if uri is None:
        return RunPlan(None)
    origin = "--tracking-uri" if args.tracking_uri else URI_ENV
    if (shown := credentials_in_uri(uri)) is not None:  # refused as the sweep refuses them too
        raise ServiceError(
            f"{origin} holds credentials ({shown} with a user name or password in it): they would be written into "
            "the job folder's MLflow run record. Give the URI without them and set MLFLOW_TRACKING_USERNAME / "
            "MLFLOW_TRACKING_PASSWORD in the environment instead.")
    check_mlflow_server(uri, f"MLflow tracking server ({origin}; without it the job trains untracked)")
    from pipelines.tracking.experiment import source_tags
    from pipelines.tracking.run_content import DESCRIPTION_TAG, RUN_KIND_TAG

    tags = {**source_tags("pipelines/train.py"), **job_run_tags(config), RUN_KIND_TAG: "job",
            DESCRIPTION_TAG: f"{config.method.name} on {config.task.name} with base model {config.model.name}, "
                             f"seed {config.seed} (a single job, python -m pipelines.train)"}
    if args.config:
        tags["config_file"] = os.path.relpath(args.config) if Path(args.config).is_absolute() else args.config
    return RunPlan(uri, args.experiment, single_job_run_name(config), tags,
                   register=args.register and get_method(config.method.name).registers_model)


def train_from_cli(args: argparse.Namespace, run: Callable[..., dict[str, Any]]) -> int:
    """The job of the command line `args`, run by `run` (`pipelines.training.loop.run`) and tracked by its plan."""
    config = load_job_config(args.config, args.overrides, more_checks=_output_folder_problems)
    plan = job_plan(args, config)  # a given server is checked before anything is written
    folder = config.resolved_output_dir()
    print(f"Output folder: {folder.absolute()}" + ("" if folder.is_absolute() else
          f" (output_dir {str(folder)!r} taken against the current directory)"), file=sys.stderr)
    if plan.uri:
        print(f"Tracking in MLflow at {plan.uri}, experiment {plan.experiment!r}, run {plan.run_name!r}",
              file=sys.stderr)
    try:
        tracked = tracked_job(config, plan, lambda report, log: run(config, report, log=log),
                              is_main=is_main_process())
    finally:
        # gloo's threads alive at interpreter exit can abort the process ("terminate called without an active
        # exception", SIGABRT) after a finished job: tear down the `accelerate launch` process group first
        import torch.distributed

        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    print(json.dumps({"output_dir": str(Path(tracked.result["artifact_dir"]).parent), **tracked.result["metrics"]},
                     indent=2))
    if is_main_process():
        print(tracking_line(plan, tracked, folder.absolute()), file=sys.stderr)
    return 0


def _output_folder_problems(raw: dict[str, Any]) -> list[str]:
    """A given `output_dir` that cannot be written, reported with the config's other problems (the job checks its
    folder again, fully, before writing: `pipelines.services.folder_lock.check_job_folder`)."""
    given = raw.get("output_dir")
    problem = folder_problem("output_dir", given) if isinstance(given, str) and given else None
    return [problem] if problem else []


def tracking_line(plan: RunPlan, tracked: TrackedResult, folder: Path) -> str:
    """The job's last line: where its run is, or how to track it."""
    if plan.uri is None:
        return NOT_TRACKED
    if tracked.run_id is None:
        return (f"MLflow run not uploaded yet ({plan.uri} stopped answering): its operations are kept in {folder}; "
                f"upload them with: python -m pipelines.tracking sync --root {folder}")
    where = tracked.run_url or f"{tracked.run_id} (experiment {plan.experiment!r} at {plan.uri})"
    reused = " (the finished result already in the folder was reused, not trained again)"
    return f"MLflow run: {where}" + (reused if tracked.reused else "")
