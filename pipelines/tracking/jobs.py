"""A job, or a pack of jobs, tracked in MLflow: each job's folder claimed, one run per job folder, every validation
(and a single job's loss curve) logged, the result and capsule logged at the end. `python -m pipelines.train` and the
sweep's trials run jobs this way.

`tracked_job` runs the job given as a function of its two callbacks (``train(report, log)``, e.g.
`pipelines.training.loop.run` bound to its config) and tracks it when `RunPlan.uri` is set; without a URI it only claims
the folder and runs the job. The run's record lives in the job folder (`pipelines.tracking.spool`): a job whose run
already finished there (its result reused, `pipelines.training.outputs.finished_result`) logs nothing again, and a
result reused from an earlier attempt is believed only when its scores are those its run logged.

`tracked_pack` runs several jobs so: a member whose folder already holds its finished result is not trained again; the
others train as a pack (the `train` handed in: `pipelines.training.packed.train_unfinished_members`), each saving its
state at every validation, so that an unfinished member, e.g. after a killed sweep, continues from its last checkpoint
in its own run (`TrialTracker` reopens it from the record in its folder). If the job or pack raises, every run not
finished ends FAILED.

Imports no mlflow itself: `pipelines.tracking` is imported only when a run is tracked.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines.config.load import validate_job_config
from pipelines.config.schema import JobConfig, flatten, model_slug
from pipelines.config.sources import PipelineConfigError
from pipelines.models import smollm2
from pipelines.tracking.run_content import numeric_metrics
from pipelines.training.outputs import RESULT_FILE, claim_job_folder, config_hash, finished_result, hashed_config

logger = logging.getLogger(__name__)

Report = Callable[[dict[str, Any]], None]
Train = Callable[[Report, Report], dict[str, Any]]
"""The job itself: ``train(report, log)`` returns the result; `report` gets every validation, `log` every point
of the training-loss curve (the arguments of `pipelines.training.loop.run`)."""
TrainPack = Callable[[list, dict[int, Report], dict[str, Any] | None], list[dict[str, Any]]]
"""Trains a pack's unfinished members (configs, validation reporters by member index, pack info) and returns their
results in order: `pipelines.training.packed.train_unfinished_members`."""
JOB_EXPERIMENT = "capt-jobs"
"""The experiment of single jobs (`python -m pipelines.train`) unless another is given."""
NOT_HYPERPARAMETERS = ("model.name", "model.max_new_tokens", "task.", "method.name", "seed", "train.eval_batch_size",
                       "train.eval_every_steps", "train.eval_mode", "train.eval_test_each_validation",
                       "train.score_untrained", "train.cpu")
"""Key prefixes of a job's config that its run name leaves out (`single_job_run_name`): what the name says already
(task, model, method, seed), which data it reads (the `task` section; the run's params and ``data`` tag say it),
and when, how and where it is evaluated or run: they change what is measured or where, not what is learned."""
MAX_SETTINGS_CHARS = 120
"""Most characters of settings a run name lists (MLflow keeps 250 characters of a run name)."""
_UNSET = object()


@dataclass(frozen=True)
class RunPlan:
    """What a job's MLflow run is: the server, experiment, name and tags, and how it is logged."""

    uri: str | None
    """Tracking server; None: the job is not tracked."""
    experiment: str = JOB_EXPERIMENT
    run_name: str = ""
    tags: Mapping[str, str] = field(default_factory=dict)
    retry_s: float = 30.0
    """How long each call retries an unreachable server before spooling it."""
    system_metrics_interval_s: float = 10.0
    register: bool = False
    """Register the capsule as a new version of ``capt-<model>-<task>``."""
    ui_uri: str | None = None
    """The server a registered version's loading snippet names, and the run URL's host (default: `uri`)."""
    moved_from: tuple[str, ...] = ()
    """Earlier addresses of the same server (a local store served again at a new port)."""

    @classmethod
    def from_dict(cls, tracking: Mapping[str, Any]) -> RunPlan:
        """The plan of a sweep trial's ``tracking`` dict (Ray passes plain dicts to its workers)."""
        known = {k: v for k, v in tracking.items() if k in cls.__dataclass_fields__ and v is not None}
        known["uri"] = tracking.get("uri")
        if "moved_from" in known:
            known["moved_from"] = tuple(known["moved_from"])
        return cls(**known)


@dataclass(frozen=True)
class TrackedResult:
    """What `tracked_job` returns."""

    result: dict[str, Any]
    """The job's result (result.json's content)."""
    reused: bool
    """The job returned the finished result already in its folder (it trained nothing)."""
    run_id: str | None = None
    """The MLflow run; None when not tracked, or while the run exists only in the spool (server unreachable)."""
    run_url: str | None = None
    """The run's page in the MLflow UI."""


def tracked_job(config: JobConfig, plan: RunPlan, train: Train, report_to: Report | None = None, is_main: bool = True,
                claim_wait_s: float = 0.0) -> TrackedResult:
    """Run ``train(report, log)`` with the job folder claimed, tracked by the main process when `plan.uri` is set.

    Every validation goes to `report_to` (finite numbers only) and to MLflow, less its `train_loss`: MLflow's
    ``train/loss`` is the loss curve's (`pipelines.training.loop.curve_point_if_due`), and two values at one step would
    draw a zigzag. The run ends FAILED when the job raises, FINISHED with the result, the dataset and the capsule
    otherwise.
    `claim_wait_s`: how long to wait for a previous attempt of the same job to let go of its folder.
    """
    def run(trackers: list) -> list[dict[str, Any]]:
        tracker = trackers[0]

        def report(metrics: dict[str, Any]) -> None:
            numeric = numeric_metrics(metrics)
            if tracker is not None:
                tracker.log_metrics({k: v for k, v in numeric.items() if k != "train_loss"}, step=int(metrics["step"]))
            if report_to is not None:
                report_to(numeric)

        def log(point: dict[str, Any]) -> None:
            if tracker is not None:
                tracker.log_metrics(numeric_metrics(point), step=int(point["step"]))

        reusing = tracker is not None and tracker.finished  # an earlier attempt finished: its result is reused
        result = train(report, log)
        if reusing:  # believed only when its scores are those its run logged
            tracker.verify_reused(result, Path(config.resolved_output_dir()) / RESULT_FILE)
        return [result]

    return _run_tracked([config], [plan], run, claim_wait_s, is_main)[0]


def tracked_pack(configs: list, plans: list[RunPlan], train: TrainPack, claim_wait_s: float = 0.0,
                 pack_info: dict[str, Any] | None = None) -> list[TrackedResult]:
    """Run the jobs `configs` (resolved) as one pack, each tracked by its `plans[i]`, the unfinished ones trained by
    `train`; their results, in order."""
    return _run_tracked(configs, plans, lambda trackers: _pack_results(configs, trackers, train, pack_info),
                        claim_wait_s)


def _run_tracked(configs: list, plans: list[RunPlan], run: Callable[[list], list[dict[str, Any]]],
                 claim_wait_s: float, is_main: bool = True) -> list[TrackedResult]:
    """``run(trackers)`` with every job folder claimed (before a tracker reads or writes its run record there) and,
    on the main process, each planned run started; every run ends FAILED when `run` raises (a retried job reopens
    the same run), FINISHED with its result otherwise."""
    with contextlib.ExitStack() as stack:
        for config in configs:
            stack.enter_context(claim_job_folder(config, wait_s=claim_wait_s))
        trackers = [start_tracker(plan, config) if is_main and plan.uri else None
                    for plan, config in zip(plans, configs, strict=True)]
        stored = [stored_digest(config) for config in configs]
        try:
            results = run(trackers)
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


def _pack_results(configs: list, trackers: list, train: TrainPack,
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
        reports = {j: _pack_reporter(trackers[i]) for j, i in enumerate(todo) if trackers[i] is not None}
        trained = train([configs[i] for i in todo], reports, pack_info)
        for i, result in zip(todo, trained, strict=True):
            results[i] = result
    return results


def _pack_reporter(tracker) -> Report:
    """Logs a member's validation records to its run: a pack draws no loss curve of its own, so each record's
    ``train_loss`` (the mean since the previous validation) is the run's ``train/loss``."""
    return lambda record: tracker.log_metrics(numeric_metrics(record), step=int(record["step"]))


def start_tracker(plan: RunPlan, config: JobConfig):
    """The job's `pipelines.tracking.TrialTracker`, started (or its run reopened), with the resolved config as
    params (paths as tags)."""
    from pipelines.models.shape import model_shape
    from pipelines.tracking import TrialTracker
    from pipelines.tracking.run_content import run_params
    from pipelines.tracking.spool import RetryPolicy

    params, path_tags = run_params(config.to_dict(), model_shape(config.model.name).spec.classifier_head)
    tracker = TrialTracker(plan.uri, plan.experiment, plan.run_name or job_run_name(config),
                           {**plan.tags, **path_tags}, state_dir=Path(config.resolved_output_dir()),
                           retry=RetryPolicy(budget_s=plan.retry_s),
                           system_metrics_interval_s=plan.system_metrics_interval_s, ui_uri=plan.ui_uri,
                           moved_from=plan.moved_from)
    tracker.start()
    tracker.log_params(params)
    return tracker


def job_run_name(config: JobConfig, method_key: str | None = None) -> str:
    """``<task>/<model-slug>/<method>/s<seed>``, the name of every job's run (a sweep adds its searched values)."""
    return f"{config.task.name}/{model_slug(config.model.name)}/{method_key or config.method.name}/s{config.seed}"


def single_job_run_name(config: JobConfig) -> str:
    """A single job's run name: `job_run_name`, its lr, then each other hyper-parameter whose value is not the one
    its method runs with on that task and model when nothing else is set (`changed_hyperparameters`):
    ``cb/minilm/capt/s0 lr=0.05 weight_decay=0.01 max_steps=200``. Jobs that differ in any hyper-parameter (what
    `NOT_HYPERPARAMETERS` leaves out is not one) get different names, and a name says how its job departs from
    the method's own settings.

    Keys rather than a config-hash suffix: the runs table and the report's kept/left-out note show names, and
    ``batch_size=8`` tells a reader which runs differ and how, where a hash would send them to the params; the hash
    is the run's ``config_hash`` tag already. The lr is always shown, the value readers look for first. Past
    `MAX_SETTINGS_CHARS` of settings the name ends with how many more differ and the first characters of the config
    hash, so that it stays short and still tells every config apart. A sweep's trials are named by `job_run_name`
    and their grid point's values instead (`pipelines.sweeps.trial_process.trial_tracking`): within a sweep these
    are what tells its trials apart, and the demo's names stay ``cb/minilm/capt/s0``."""
    differing = changed_hyperparameters(config)
    settings = [f"{_short_key(key, differing)}={_short_value(value)}" for key, value in differing.items()]
    shown = []
    for setting in settings:
        if len(" ".join([*shown, setting])) > MAX_SETTINGS_CHARS:
            shown.append(f"+{len(settings) - len(shown)} more #{config_hash(config)[:8]}")
            break
        shown.append(setting)
    return " ".join([job_run_name(config), *shown])


def changed_hyperparameters(config: JobConfig) -> dict[str, Any]:
    """The job's lr and every other hyper-parameter (a dotted key of the config as `config_hash` sees it, less
    `NOT_HYPERPARAMETERS`) whose value differs from the resolved config that the job's method runs with on the job's
    task (its data settings included), model and seed when nothing else is set (only the lr where that is not a valid
    job on its own), lr first, then in the config's order."""
    ours = flatten(hashed_config(config))
    bare = {"model": {"name": config.model.name}, "task": dataclasses.asdict(config.task),
            "method": {"name": config.method.name}, "seed": config.seed}
    try:
        theirs = flatten(hashed_config(validate_job_config(bare)))
    except PipelineConfigError:
        theirs = ours
    changed = {key: value for key, value in ours.items()
               if not key.startswith(NOT_HYPERPARAMETERS) and (key == "optim.lr" or theirs.get(key, _UNSET) != value)}
    return dict(sorted(changed.items(), key=lambda item: item[0] != "optim.lr"))


def _short_key(key: str, keys: Mapping[str, Any]) -> str:
    """`key`'s last part (``optim.weight_decay`` -> ``weight_decay``), or the whole key where that part is ``name``
    or is shared with another key of `keys`."""
    leaf = key.rpartition(".")[2]
    shared = sum(other.rpartition(".")[2] == leaf for other in keys) > 1
    return key if leaf == "name" or shared else leaf


def _short_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if value is None or isinstance(value, bool):
        return json.dumps(value)  # null, true, false: as a config file or override writes them
    return json.dumps(value, separators=(",", ":")) if isinstance(value, list | dict) else str(value)


def job_run_tags(config: JobConfig, method_key: str | None = None) -> dict[str, str]:
    """The tags every job's run has: task, model, base model, method, seed, real or generated data, config hash, and
    what the base model's weights are where the name alone does not say (SmolLM2: a dequantised 4-bit release)."""
    weights = {"base_model_weights": smollm2.WEIGHTS_NOTE} if config.model.name == smollm2.NAME else {}
    return {"task": config.task.name, "model": model_slug(config.model.name), "base_model": config.model.name,
            "method": method_key or config.method.name, "method_name": config.method.name, "seed": str(config.seed),
            "data": "generated" if config.task.source == "generated" else "real", "config_hash": config_hash(config),
            **weights}


def stored_digest(config: JobConfig) -> str | None:
    """The digest of the finished result already in the job's folder, if any: the job returns that same result
    (and trains nothing) when it reuses it; a result trained now has a digest of its own."""
    try:
        return json.loads((Path(config.resolved_output_dir()) / "result.json").read_text()).get("result_digest")
    except (OSError, ValueError, AttributeError):
        return None
