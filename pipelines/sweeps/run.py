"""Running a sweep: the Tune grid, the tracking server beside it, the results table and the champions.

`pipelines/sweep.py` is the entry point users submit; it calls `run_sweep` inside `tracking_server` and
`ray_cluster`, then `summary.results_table` and `promote_champions`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from capt.errors import CaptError
from capt.methods import get_method
from pipelines.config.schema import model_slug
from pipelines.config.sources import PipelineConfigError
from pipelines.provenance import registered_model_name
from pipelines.services.folder_lock import current_holder, folder_problem, held_folder
from pipelines.sweeps.config import SweepConfig, Trial, is_pack_point, pack_point, sweep_packs, trial_point, trials
from pipelines.sweeps.console import no_default_loggers, trial_lines, tune_loggers
from pipelines.sweeps.pending import PendingWatch, pending_timeout
from pipelines.sweeps.resources import (
    ResourcesSection,
    check_local_fit,
    pack_resources,
    runs_in_trial_process,
    trial_resources,
)
from pipelines.sweeps.resources import max_concurrent as _trials_at_once
from pipelines.sweeps.rules import local_data_problems

logger = logging.getLogger("pipelines.sweep")


def param_space(sweep: SweepConfig) -> dict:
    """Tune's space: one grid axis over the valid (task, model, method, seed) points, plus the search; a packed
    sweep's axis is over its packs (`pipelines.sweeps.config.sweep_packs`)."""
    from ray import tune

    if sweep.pack is not None:
        return {"point": tune.grid_search([pack_point(plan) for plan in sweep_packs(sweep)])}
    space = {"point": tune.grid_search([trial_point(t) for t in trials(sweep)])}
    for key, spec in sweep.search.items():
        kind, values = next(iter(spec.items()))
        space[key] = tune.grid_search(values) if kind == "grid" else getattr(tune, kind)(*(
            [values] if kind == "choice" else values))
    return space


def _trial_name(trial) -> str:
    point = trial.config["point"]
    if is_pack_point(point):
        return point["pack"]
    name = Trial(point["task"], point["model"], point["method"], point["seed"], {}).name
    extra = sorted([*point.get("select", {}).items(), *((k, v) for k, v in trial.config.items() if k != "point")])
    return name + "".join(f"-{k}={v:.3g}" if isinstance(v, float) else f"-{k}={v}" for k, v in extra)


def requested_resources(sweep: SweepConfig) -> ResourcesSection:
    """What each Tune trial of `sweep` asks Ray for: `sweep.resources`; in a packed sweep, what its largest pack
    needs (`pack_resources`: a GPU share per member). Every pack asks the same, so the local fit check, Tune's
    bound on trials at once and the pending watch all see one request; a last, smaller pack reserves as much."""
    if sweep.pack is None:
        return sweep.resources
    return pack_resources(sweep.resources, max(len(plan.members) for plan in sweep_packs(sweep)))


def max_concurrent(sweep: SweepConfig, cluster: dict[str, float], local: bool = True) -> int | None:
    """Tune's bound on trials at once (None: none, on a cluster that may scale; see `ResourcesSection`)."""
    return _trials_at_once(requested_resources(sweep), cluster, local)


def run_sweep(sweep: SweepConfig, tracking_uri: str | None, resume: bool, run_context: dict | None = None):
    """Fit (or restore and finish) the Tune experiment of `sweep`; returns Tune's ResultGrid.

    `run_context`: source tags and the UI's URI for every trial's run (`pipelines.sweeps.trial.run_trial`).

    Raises `ResourcesError` before the first trial when the local Ray cannot hold one, and after
    `resources.pending_timeout_s` when the trials' workers wait that long for resources.
    """
    import ray
    from ray import tune

    from pipelines.sweeps.trial import run_trial

    local = not os.environ.get("RAY_ADDRESS")  # as `ray_cluster` decides: no address, a local Ray of our own
    cluster, resources = ray.cluster_resources(), requested_resources(sweep)
    if local:
        check_local_fit(resources, cluster)
    # one trainable for every sweep (run_trial runs a pack's point as a pack): one process, one base model
    trainable = tune.with_resources(
        tune.with_parameters(run_trial, sweep=asdict(sweep), tracking_uri=tracking_uri, run_context=run_context),
        trial_resources(resources, cluster))
    path = sweep.folder()
    if resume and tune.Tuner.can_restore(str(path)):
        logger.info("Resuming sweep %s from %s", sweep.name, path)
        tuner = tune.Tuner.restore(str(path), trainable=trainable, resume_errored=True)
    else:
        scheduler = tune.schedulers.ASHAScheduler(grace_period=1) if sweep.scheduler == "asha" else None
        tuner = tune.Tuner(
            trainable, param_space=param_space(sweep),
            tune_config=tune.TuneConfig(
                metric="validation_score", mode="max", num_samples=sweep.num_samples, scheduler=scheduler,
                max_concurrent_trials=max_concurrent(sweep, cluster, local),
                # one-worker trials run in the trial process: reusing it skips a process start and a model load
                reuse_actors=runs_in_trial_process(sweep.resources),
                trial_name_creator=_trial_name, trial_dirname_creator=_trial_name),
            run_config=tune.RunConfig(  # what Tune prints: `pipelines.sweeps.console`
                name=sweep.name, storage_path=str(sweep.storage_root()), verbose=0,
                failure_config=tune.FailureConfig(max_failures=trial_retries(sweep)),
                callbacks=[*tune_loggers(), trial_lines()]),
        )
    with PendingWatch(resources, pending_timeout(resources, local)) as watch, no_default_loggers():
        grid = tuner.fit()
    watch.raise_if_gave_up()
    return grid


def trial_retries(sweep: SweepConfig) -> int:
    """Tune's retries of a failed trial. A one-worker trial has no Ray Train worker group to restart: Tune retries
    it as often as both levels together would have started its worker, (trial + 1) x (worker + 1) - 1 times."""
    failure = sweep.failure
    if runs_in_trial_process(sweep.resources):
        return (failure.trial_max_failures + 1) * (failure.worker_max_failures + 1) - 1
    return failure.trial_max_failures


SWEEP_LOCK_FILE = "sweep.lock"
"""In the sweep's folder (storage_path/name): held by the driver that runs the sweep."""


class SweepInUseError(CaptError, RuntimeError):
    """Another driver runs the same sweep (same storage_path and name) now."""


def sweep_folder_problems(sweep: SweepConfig) -> list[str]:
    """Why the folders a sweep writes into on this machine (its storage, a local MLflow store) or reads its trials'
    local data from cannot be used, each with the fix; relative paths are taken against the current directory.
    Checked before Ray or MLflow start (a config alone, e.g. checked for another machine, is not held to them)."""
    folders = {} if "://" in sweep.storage_path else {"storage_path": sweep.storage_path}
    if sweep.tracking.enabled and not (sweep.tracking.uri or os.environ.get("MLFLOW_TRACKING_URI")):
        folders["tracking.local_dir"] = sweep.tracking.local_dir
    problems = [f"{problem}: give {key} another folder" for key, path in folders.items()
                if (problem := folder_problem(key, path))]
    try:
        points = trials(sweep)
    except PipelineConfigError:  # the trials' own problems are reported beside these; their data is checked once valid
        points = []
    problems += local_data_problems([(t.name, t.job.get("task", {})) for t in points])
    return problems + ray_job_folder_problems(folders)


def ray_job_folder_problems(folders: dict[str, str]) -> list[str]:
    """Under `ray job submit --working-dir`, the entrypoint runs in Ray's temporary copy of that folder: a relative
    folder would put the results and the MLflow store there, out of the user's sight (and the closing links would
    name a store the user never opens). Such a sweep is refused before anything starts, with the flags to add."""
    try:  # set by Ray's job supervisor on a submitted job's entrypoint: its runtime_env (working_dir) as JSON
        runtime_env = json.loads(os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR") or "{}").get("runtime_env") or {}
    except (ValueError, AttributeError):
        return []
    if not runtime_env.get("working_dir"):
        return []
    fixes = {"storage_path": "storage_path=/ABSOLUTE/FOLDER (on the head node, or shared storage: s3://...)",
             "tracking.local_dir": "tracking.uri=http://HOST:PORT (your MLflow server), or tracking.local_dir="
                                   "/ABSOLUTE/FOLDER, or MLFLOW_TRACKING_URI in the environment of `ray start`"}
    return [f"{key}={path!r} is relative, and this sweep runs as a Ray job with a working_dir: its current folder "
            f"{os.getcwd()} is Ray's temporary copy of that directory, so the results would be written there, not "
            f"where you look; add {fixes[key]}"
            for key, path in folders.items() if not Path(path).expanduser().is_absolute()]


def hold_sweep_folder(sweep: SweepConfig) -> contextlib.AbstractContextManager[None]:
    """One driver per sweep folder: a second one (a double start, a `--resume` while the sweep still runs)
    would restore and write the same Tune experiment and trial folders."""
    if "://" in sweep.storage_path:  # remote storage: no folder here to lock; Tune owns the experiment there
        return contextlib.nullcontext()
    return held_folder(sweep.folder() / SWEEP_LOCK_FILE, refusal=lambda holder: _in_use(sweep, holder))


def refuse_a_running_sweep(sweep: SweepConfig) -> None:
    """`hold_sweep_folder`'s refusal, checked before Ray or MLflow start and without writing anything (a run that
    then fails to reach them leaves the storage as it was)."""
    if "://" not in sweep.storage_path and (holder := current_holder(sweep.folder() / SWEEP_LOCK_FILE)):
        raise _in_use(sweep, holder)


def _in_use(sweep: SweepConfig, holder: str) -> SweepInUseError:
    return SweepInUseError(
        f"The sweep {sweep.name!r} in {sweep.folder()} is being run by another driver ({holder}); "
        "one driver runs a sweep at a time. Wait for it to end or stop it (then `--resume` finishes the sweep), or "
        "give this one another name or storage_path.")


@contextlib.contextmanager
def tracking_server(sweep: SweepConfig, wait: bool = True) -> Iterator[TrackingEndpoint]:
    """The MLflow server to use: the configured one (checked now), or a local server started and stopped here.

    With ``wait=False`` the local server is only launched: the caller starts Ray meanwhile and calls
    `TrackingEndpoint.ready` before the first trial. Leaving the block stops the server.
    """
    from pipelines.services import LocalMlflowServer
    from pipelines.services.mlflow_server import check_mlflow_server

    uri = sweep.tracking.uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not sweep.tracking.enabled:
        yield TrackingEndpoint(None)
        return
    if uri:
        refuse_credentials_in_uri(uri)
        check_mlflow_server(uri, "MLflow tracking server (tracking.uri or MLFLOW_TRACKING_URI)")
        yield TrackingEndpoint(uri)
        return
    server = LocalMlflowServer(Path(sweep.tracking.local_dir)).start(wait=wait)
    try:
        yield TrackingEndpoint(server.uri, server)
    finally:
        server.stop()


@dataclass
class TrackingEndpoint:
    """The sweep's tracking URI (None: tracking off) and, for a local server, the server behind it."""

    uri: str | None
    """What trials log to."""
    local_server: Any = None
    """The `LocalMlflowServer` this sweep started, if any."""

    def release(self) -> None:
        """Nothing more will be logged: a local server may begin shutting down (the block's end waits for it)."""
        if self.local_server is not None:
            self.local_server.terminate()

    @property
    def moved_from(self) -> tuple[str, ...]:
        """Earlier addresses of a local store (a resumed sweep's trials spooled operations for them)."""
        return self.local_server.former_uris() if self.local_server is not None else ()

    def ready(self) -> str | None:
        """The URI, once the server answers (a local server still starting is waited for)."""
        if self.local_server is not None:
            self.local_server.wait_ready()
        return self.uri


def refuse_credentials_in_uri(uri: str) -> None:
    """A tracking URI with `user:password@` would travel to every trial in Ray's metadata and run records."""
    from pipelines.services.mlflow_server import credentials_in_uri

    if (shown := credentials_in_uri(uri)) is not None:
        raise PipelineConfigError(
            f"tracking.uri (or MLFLOW_TRACKING_URI) holds credentials ({shown} with a user name or password in "
            "it): they would be visible in Ray's job metadata and in every trial's run record. Give the URI "
            "without them and set MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD in the environment of the "
            "driver and of the cluster's nodes (infra/README.md).")


def champion_pairs(sweep: SweepConfig, rows: list[dict]) -> list[tuple[str, str]]:
    """(model, task) of every capsule this sweep registered (a done trial of a method that registers one), sorted:
    the champions it promotes."""
    capsule_rows = {e.key for e in sweep.methods if get_method(e.name).registers_model}
    return sorted({(r["model"], r["task"]) for r in rows if r["status"] == "done" and r["method"] in capsule_rows})


def promote_champions(sweep: SweepConfig, tracking_uri: str, rows: list[dict]) -> list[str]:
    """Promote the best capsule by validation score of every (model, task) this sweep registered; returns the
    model names."""
    from pipelines.tracking.promotion import SELECTION_METRIC, PromotionError, promote

    names = []
    for model, task in champion_pairs(sweep, rows):
        try:
            promote(tracking_uri=tracking_uri, model=model, task=task, metric=SELECTION_METRIC)
            names.append(registered_model_name(model_slug(model), task))
        except PromotionError as err:
            logger.warning("Not promoted: %s", err)
    return names


def unpromoted(sweep: SweepConfig, rows: list[dict], champions: list[str]) -> list[tuple[str, str]]:
    """The (model, task) pairs whose champion `promote_champions` did not set (`champions`: the names it did)."""
    return [(model, task) for model, task in champion_pairs(sweep, rows)
            if registered_model_name(model_slug(model), task) not in champions]
