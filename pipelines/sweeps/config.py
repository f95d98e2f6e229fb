"""The sweep config: a grid of tasks x models x methods x seeds over a base job, plus Tune search options and the
`pack:` section (trials sharing a base model trained together) with its rules and its packs.

Every trial's job config is built and validated on the driver before Ray starts, so a bad sweep fails
at once with every problem listed.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    NonNegativeInt,
    PositiveInt,
    TypeAdapter,
    ValidationError,
)
from pydantic.dataclasses import dataclass

from pipelines.config.load import ignored_data_dir_note as job_data_dir_note
from pipelines.config.load import other_kind_hint, pydantic_problems, validate_job_config
from pipelines.config.schema import STRICT, Seed, TrackingSection, model_slug
from pipelines.config.sources import PipelineConfigError, merge_sources
from pipelines.sweeps.resources import ResourcesSection
from pipelines.sweeps.rules import (
    DISTINCT,
    DISTINCT_LABELS,
    DISTINCT_SLUGS,
    NON_EMPTY,
    RowLabel,
    SweepName,
    real_data_problems,
)
from pipelines.sweeps.select import combinations, select_label, select_problems, select_space
from pipelines.training.outputs import config_hash

SEARCH_KINDS = ("grid", "choice", "uniform", "loguniform", "randint")


@dataclass(config=STRICT)
class MethodEntry:
    """One row of the method axis: a method, its options and any job overrides it needs."""

    name: str
    """Method name (capt, prompt_tuning, ptuning_v2, lora, full_finetune)."""
    label: RowLabel | None = None
    """Row label in tables, run names and trial folders (default: the method name); ablations need distinct labels.
    Allowed: 1-100 letters, digits, '.', '_', '+' or '-', starting with a letter or digit."""
    options: dict[str, Any] = Field(default_factory=dict)
    """The method's own options (capt: CapsuleConfig fields)."""
    overrides: dict[str, Any] = Field(default_factory=dict)
    """Job config overrides for this method, as nested sections or dotted keys (e.g. {"optim.lr": 1e-4})."""
    models: list[str] | None = None
    """Restrict this row to these models (default: every model of the sweep)."""
    select: dict[str, list[Any]] = Field(default_factory=dict)
    """Candidate values of job keys for this row only, chosen on validation (see the sweep's `select`)."""

    @property
    def key(self) -> str:
        """The label used in trial names and tags."""
        return self.label or self.name


@dataclass(config=STRICT)
class FailureSection:
    """How often a failed trial or worker group is retried."""

    trial_max_failures: NonNegativeInt = 1
    """Tune retries of a failed trial (it resumes from its own checkpoint)."""
    worker_max_failures: NonNegativeInt = 1
    """Ray Train restarts of a trial's worker group. A one-worker trial runs in its Tune trial process instead:
    Tune retries it (trial_max_failures + 1) x (worker_max_failures + 1) - 1 times."""


@dataclass(config=STRICT)
class PackSection:
    """Packed trials: the trials that share a base model train together, at most `max_members` per Tune trial."""

    max_members: PositiveInt
    """Most trials per pack (K): one Tune trial trains them in one loop on one copy of the base model."""
    heap: Literal["tuned", "default"] = "tuned"
    """glibc heap of the sweep's trial processes: tuned (`TUNED_HEAP_ENV`: one arena, freed blocks kept mapped) or
    default (glibc's own settings, or whatever the environment says)."""


@dataclass(config=STRICT)
class SweepConfig:
    """A sweep: tasks x models x methods x seeds (a grid) over a base job, with optional Tune search."""

    name: SweepName = "smoke"
    """Sweep id: Tune experiment name, MLflow tag `sweep`, storage folder <storage_path>/<name>.
    Allowed: 1-100 letters, digits, '.', '_' or '-', starting with a letter or digit."""
    tasks: Annotated[list[str], NON_EMPTY, DISTINCT] = Field(default_factory=lambda: ["rte"])
    """Tasks (boolq, cb, copa, multirc, rte, wic, csqa), each once."""
    models: Annotated[list[str], NON_EMPTY, DISTINCT, DISTINCT_SLUGS] = Field(
        default_factory=lambda: ["tiny-t5"])
    """Base models (built-in names, hub ids or local paths), each once and with distinct slugs."""
    methods: Annotated[list[MethodEntry], NON_EMPTY, DISTINCT_LABELS] = Field(
        default_factory=lambda: [MethodEntry(name="capt")])
    """Method rows, with distinct labels."""
    seeds: Annotated[list[Seed], NON_EMPTY, DISTINCT] = Field(default_factory=lambda: [0])
    """Seeds, each once; every (task, model, method) runs once per seed."""
    data_source: Literal["auto", "real", "hub", "local", "generated"] = "auto"
    """Data source of every trial; auto: local when CAPT_DATA_DIR is set, else generated; real: local when
    CAPT_DATA_DIR is set, else the hub, and never generated (the paper presets)."""
    job: dict[str, Any] = Field(default_factory=dict)
    """Base job config sections applied to every trial (see pipelines/config/schema.py)."""
    model_overrides: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Per-model job overrides, keyed by model name (e.g. precision, batch size)."""
    task_overrides: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Per-task job overrides, keyed by task name (e.g. BoolQ from the hub)."""
    search: dict[str, dict[str, list[Any]]] = Field(default_factory=dict)
    """Tune search space over job keys: {"optim.lr": {"grid": [0.3, 0.5]}} (grid, choice, uniform, loguniform,
    randint)."""
    select: dict[str, list[Any]] = Field(default_factory=dict)
    """Candidate values of job keys, e.g. {"optim.lr": [0.01, 0.1, 0.3]}: a trial per value (x seeds); reports keep
    the value with the best mean validation score over seeds (pipelines/sweeps/select.py)."""
    num_samples: PositiveInt = 1
    """Tune samples of the search space per grid point."""
    scheduler: Literal["fifo", "asha"] = "fifo"
    """Trial scheduler; asha stops weak trials early on validation_score."""
    resources: ResourcesSection = Field(default_factory=ResourcesSection)
    """Per-trial resources."""
    failure: FailureSection = Field(default_factory=FailureSection)
    """Retries."""
    pack: PackSection | None = None
    """Packed trials, e.g. {max_members: 3}: trials sharing a base model train K per Tune trial in one loop (CaPT
    rows only; its rules: the end of this module). null (default): one Tune trial per trial."""
    tracking: TrackingSection = Field(default_factory=TrackingSection)
    """MLflow."""
    storage_path: str = "outputs/sweeps"
    """Ray storage (local or shared path; job outputs go under <storage_path>/<name>/jobs)."""

    def experiment_name(self) -> str:
        """MLflow experiment of this sweep."""
        return self.tracking.experiment or f"capt-{self.name}"

    def storage_root(self) -> Path:
        """Absolute storage folder (Ray needs an absolute path)."""
        return Path(self.storage_path).expanduser().resolve()

    def folder(self) -> Path:
        """This sweep's folder, <storage root>/<name>: Tune's experiment, the trials' `jobs/`, the summary."""
        return self.storage_root() / self.name


@dataclasses.dataclass(frozen=True)
class Trial:
    """One grid point: the names that identify it and its validated job config as a dict."""

    task: str
    model: str
    method: str
    seed: int
    job: dict[str, Any]
    select: dict[str, Any] = dataclasses.field(default_factory=dict)
    """This trial's combination of `select:` values (empty when the sweep selects nothing)."""

    @property
    def name(self) -> str:
        """Stable trial name: `<task>-<model slug>-<method label>-s<seed>`."""
        return f"{self.task}-{model_slug(self.model)}-{self.method}-s{self.seed}"


def load_sweep_config(path: str | os.PathLike | None, overrides: list[str] | tuple[str, ...] = (),
                      more_checks: Callable[[SweepConfig], list[str]] = lambda sweep: []) -> SweepConfig:
    """YAML + `key=value` overrides -> a validated SweepConfig whose every trial job is valid too; every problem
    (`more_checks`' too: a caller's own checks of a valid sweep, e.g. the folders it would write on this machine)
    raised at once."""
    raw = merge_sources(path, overrides, None)
    try:
        sweep = TypeAdapter(SweepConfig).validate_python(raw)
    except ValidationError as err:
        if hint := other_kind_hint(raw, "sweep"):  # its keys would all be unknown: name the command instead
            raise PipelineConfigError(f"Invalid sweep config {path or ''}: {hint}.") from None
        problems = pydantic_problems(err, SweepConfig)
        problems += _problems_beside(raw, {e["loc"][0] for e in err.errors() if e["loc"]}, more_checks)
        raise PipelineConfigError(f"Invalid sweep config {path or ''}: " + "; ".join(p.rstrip(".") for p in problems)
                             + ".") from None
    if problems := _grid(sweep)[1] + more_checks(sweep):
        raise _invalid_sweep(problems)
    # Resolved on the driver, what a trial's process would read differently: local paths (Tune runs trials in their
    # own working directories) and the data source (`auto` and `real` follow the driver's CAPT_DATA_DIR, not the
    # environment a worker node happens to have).
    if "://" not in sweep.storage_path:
        sweep = dataclasses.replace(sweep, storage_path=str(sweep.storage_root()))
    if os.environ.get("CAPT_DATA_DIR"):
        os.environ["CAPT_DATA_DIR"] = str(Path(os.environ["CAPT_DATA_DIR"]).expanduser().resolve())
    return dataclasses.replace(sweep, data_source=_data_source(sweep)["source"])


def _problems_beside(raw: Any, bad_keys: set[Any], more_checks: Callable[[SweepConfig], list[str]]) -> list[str]:
    """The other problems (the trials': unknown task or model, bad job values; `more_checks`') of the sweep without
    its invalid sections `bad_keys` (each left at its default), so that one run reports those too; none when that
    sweep is not valid."""
    if not isinstance(raw, dict) or not bad_keys:
        return []
    try:
        rest = TypeAdapter(SweepConfig).validate_python({k: v for k, v in raw.items() if k not in bad_keys})
        return _grid(rest)[1] + more_checks(rest)
    except (ValidationError, PipelineConfigError):
        return []


def trials(sweep: SweepConfig) -> list[Trial]:
    """Every grid point with its job config, validated; raises once listing every problem."""
    points, problems = _grid(sweep)
    if problems:
        raise _invalid_sweep(problems)
    return points


def _invalid_sweep(problems: list[str]) -> PipelineConfigError:
    """One error listing each distinct problem once."""
    return PipelineConfigError("Invalid sweep: " + " | ".join(dict.fromkeys(problems)))


def _grid(sweep: SweepConfig) -> tuple[list[Trial], list[str]]:
    """Every grid point with its job config, and every problem found in them (none: every trial is valid)."""
    problems = _search_problems(sweep.search) + select_problems("select", sweep.select, sweep.search)
    for entry in sweep.methods:
        problems += select_problems(f"methods[{entry.key}].select", entry.select, sweep.search)
    if problems:  # a bad select key would repeat in every trial
        return [], problems
    if too_large := grid_size_problem(sweep):  # before thousands of job configs are built only to be refused
        return [], [too_large]
    by_problem: dict[str, list[str]] = {}  # one line per distinct job problem, naming the trials it hits
    points: list[Trial] = []
    jobs_dir = sweep.folder() / "jobs"  # resolved once: the grid has up to MAX_TRIALS points
    for task, model, entry in itertools.product(sweep.tasks, sweep.models, sweep.methods):
        if entry.models is not None and model not in entry.models:
            continue
        for values, seed in itertools.product(combinations(select_space(sweep.select, entry.select)), sweep.seeds):
            job, invalid = trial_job(sweep, task, model, entry, seed, values, jobs_dir)
            try:
                found = [str(invalid)] if invalid else member_problems(sweep.pack, job)
            except PipelineConfigError as err:
                found = [str(err)]
            where = "/".join(filter(None, (task, model, entry.key, f"s{seed}", select_label(values))))
            for problem in found:
                by_problem.setdefault(problem, []).append(where)
            points.append(Trial(task, model, entry.key, seed, job, values))
    for problem, names in by_problem.items():
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        problems.append(f"{len(names)} trial(s) ({shown}): {problem}")
    problems += pack_option_problems(sweep)
    problems += real_data_problems(sweep.data_source, [(t.name, t.job.get("task", {}).get("source")) for t in points])
    if not points:
        problems.append(f"the grid is empty: no method row runs on models={sweep.models} (rows restricted by "
                        "methods[].models name none of them)")
    return points, problems


def trial_job(sweep: SweepConfig, task: str, model: str, entry: MethodEntry, seed: int,
              searched: dict[str, Any] | None = None,
              jobs_dir: Path | None = None) -> tuple[dict[str, Any], PipelineConfigError | None]:
    """The job dict of one grid point: base job < model < task < method overrides < selected and searched values;
    and why it is invalid (None when valid): the one validation its config hash needs serves `_grid`'s check too
    (`output_dir`, set after it, is a free-form path).

    Its output folder is `<trial name>-<config hash>` in `jobs_dir` (default: the sweep's `jobs/`): a trial whose
    config changed (grid, job keys, searched values, defaults) trains afresh in a new folder, and only an identical
    config reuses one.
    """
    parts = [{"task": _data_source(sweep)}, sweep.job, sweep.model_overrides.get(model, {}),
             sweep.task_overrides.get(task, {}), entry.overrides]
    fixed = {"model": {"name": model}, "task": {"name": task},
             "method": {"name": entry.name, "options": entry.options}, "seed": seed}
    job = merge_job_parts([*parts, fixed, searched or {}])
    job.setdefault("train", {})["resume"] = True  # a retried or resumed trial continues from its checkpoint
    invalid = None
    try:
        digest = config_hash(validate_job_config(job))
    except PipelineConfigError as err:  # `trials` reports the problem; the name only has to be stable
        digest, invalid = config_hash(job), err
    name = f"{Trial(task, model, entry.key, seed, {}).name}-{digest[:10]}"
    job["output_dir"] = str((jobs_dir or sweep.folder() / "jobs") / name)
    return job, invalid


def _data_source(sweep: SweepConfig) -> dict[str, Any]:
    source = sweep.data_source
    data_dir = os.environ.get("CAPT_DATA_DIR")
    if source in ("auto", "real"):
        source = "local" if data_dir else ("generated" if source == "auto" else "hub")
    return {"source": source, **({"data_dir": data_dir} if source == "local" and data_dir else {})}


def ignored_data_dir_note(sweep: SweepConfig) -> str | None:
    """One line, for the driver to say once, when CAPT_DATA_DIR is set but trials of `sweep` (its data source
    resolved by `load_sweep_config`) will not read it; None otherwise."""
    points = trials(sweep)
    ignoring = [t for t in points if job_data_dir_note(t.job["task"].get("source"), t.job["task"].get("data_dir"),
                                                       "", "")]
    if not ignoring:
        return None
    names = ", ".join(t.name for t in ignoring[:3]) + (", ..." if len(ignoring) > 3 else "")
    reader = ("every trial reads" if len(ignoring) == len(points) else
              f"{len(ignoring)} of {len(points)} trials ({names}) read")
    fix = ("set data_source=local (or leave it at auto)" if sweep.data_source != "local"
           else "drop their task.source / task.data_dir override")
    first = ignoring[0].job["task"]
    return job_data_dir_note(first.get("source"), first.get("data_dir"), reader, fix)


def _search_problems(search: dict[str, dict[str, list[Any]]]) -> list[str]:
    problems = []
    for key, spec in search.items():
        if len(spec) != 1 or next(iter(spec)) not in SEARCH_KINDS:
            problems.append(f"search.{key}={spec!r}: give exactly one of {', '.join(SEARCH_KINDS)}")
        elif next(iter(spec)) in ("uniform", "loguniform", "randint") and len(next(iter(spec.values()))) != 2:
            problems.append(f"search.{key}={spec!r}: ranges take [low, high]")
    return problems


# How many trials Tune makes of a grid, and the bound on it. Why the bound:
# Ray Tune (2.60, `BasicVariantGenerator`) builds every variant of the search space before its first trial starts, and
# deep-copies the whole space, grid values included, for each one: a grid of n trials costs n copies of n points.
# Measured on 2 CPUs: with 9,000 seeds no trial had started 340 s after Tune began (the driver was in its variant
# generation), and Ctrl-C took 230 s more to end it. The bound keeps that work to seconds; the count is taken from the
# axes' lengths, before any trial's job config is built.
MAX_TRIALS = 1500
"""Most trials one sweep may have: Tune's grid expansion takes the square of the count (1,000: 3.6 s, 2,000: 22 s on
2 busy CPUs); the largest shipped sweep (ablations.yaml) has 1,008."""


def tune_trials(sweep: SweepConfig) -> int:
    """Trials Tune runs: tasks x (models each method row runs on) x its select combinations x seeds (the grid
    points) x the combinations of `search`'s grid keys x `num_samples`."""
    rows = sum(len(combinations(select_space(sweep.select, entry.select)))
               for entry in sweep.methods for model in sweep.models
               if entry.models is None or model in entry.models)
    searched = math.prod(len(values) for spec in sweep.search.values() for kind, values in spec.items()
                         if kind == "grid")
    return len(sweep.tasks) * rows * len(sweep.seeds) * searched * sweep.num_samples


def grid_size_problem(sweep: SweepConfig) -> str | None:
    """Why the grid is too large for one sweep (its count, the bound, how to split it), or None."""
    count = tune_trials(sweep)
    if count <= MAX_TRIALS:
        return None
    axes = (f"{len(sweep.tasks)} task(s) x {len(sweep.models)} model(s) x {len(sweep.methods)} method row(s) x "
            f"{len(sweep.seeds)} seed(s)")
    return (f"the grid has {count:,} trials ({axes}, with select, search and num_samples), more than the "
            f"{MAX_TRIALS:,} one sweep runs: Ray Tune copies the whole grid for every trial it creates, before the "
            "first one starts, so a grid this size would hold the driver for minutes. Split it into sweeps of at "
            f"most {MAX_TRIALS:,} trials, each with its own name= and one tracking.experiment= (e.g. "
            "seeds=[0,...,499] name=NAME-a, then seeds=[500,...,999] name=NAME-b, both with "
            "tracking.experiment=NAME): their runs share one MLflow experiment and one report")


def merge_job_parts(parts: list[dict[str, Any]], merged: dict[str, Any] | None = None) -> dict[str, Any]:
    """Deep-merge job fragments into `merged` (default: a new dict), later ones winning; `"a.b": v` keys mean
    `{"a": {"b": v}}`.

    Plain dict merging here: OmegaConf takes ~40 ms per trial, seconds for a paper grid.
    """
    merged = {} if merged is None else merged
    for part in parts:
        for key, value in part.items():
            *path, leaf = key.split(".")
            target = merged
            for name in path:
                if not isinstance(target.get(name), dict):
                    target[name] = {}
                target = target[name]
            if isinstance(value, dict) and isinstance(target.get(leaf), dict):
                merge_job_parts([value], target[leaf])
            else:
                target[leaf] = copy.deepcopy(value)
    return merged


# The `pack:` section: which sweeps and which trials can train packed, and who packs with whom.
#
#     pack: {max_members: 3}
#
# A packed sweep groups its trials that share a base model (`base_key`: model, dtype, precision, device and the
# capsule's slot count) and trains each group in one Tune trial, in one loop (`pipelines.training.packed`). Only what
# a pack can train is accepted, checked with every other problem of the sweep (`trials`): CaPT and its ablations
# (method `capt`, whatever `pipelines.training.setup.pack_problems` accepts), one worker per trial, and grid values
# fixed on the driver. Each base's trials, in grid order (task, model, method row, `select:` value, seed), are cut
# into packs of K, the last one smaller. A pack's name, `pack<NNN>-<model slug>-x<members>`, is the Tune trial's name
# and folder; it is the same for the same sweep config, so `--resume` meets the same packs. Each member keeps what a
# trial has: its own job config, config hash, output folder (`trial_job`) and MLflow run.

TUNED_HEAP_ENV = {"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(4 << 30),
                  "MALLOC_TOP_PAD_": str(512 << 20)}
"""glibc settings of a packed sweep's trial processes (Ray runtime_env variables; glibc reads them when a process
starts). A pack's step allocates and frees activations of hundreds of MB; in a Tune trial's thread glibc serves them
from a fresh mmap each time (and from a thread arena it trims), so the kernel zero-fills every page again: a 144-row
MiniLM step paid 14.5 s of kernel time for 13.2 s of compute, 5.6 s with these settings
(benchmarks/results/page_faults.md). Kept mapped, a trial process's resident memory stays at its peak."""


def trial_process_env(sweep: SweepConfig) -> dict[str, str]:
    """Environment variables every trial process of `sweep` starts with: the tuned heap of a packed sweep, else
    none."""
    return dict(TUNED_HEAP_ENV) if sweep.pack is not None and sweep.pack.heap == "tuned" else {}


def pack_option_problems(sweep: SweepConfig) -> list[str]:
    """What a packed sweep cannot have yet; empty when `pack` is off."""
    if sweep.pack is None:
        return []
    problems = []
    if sweep.search:
        problems.append(f"search={sweep.search!r}: not supported with pack yet (Tune draws searched values once per "
                        "Tune trial, so a pack's members would share one draw); give the candidates as `select:` "
                        "(a trial per value, chosen on validation) or drop `pack:`")
    if sweep.num_samples != 1:
        problems.append(f"num_samples={sweep.num_samples}: not supported with pack yet (allowed: 1); give the "
                        "candidates as `select:` or drop `pack:`")
    if sweep.scheduler != "fifo":
        problems.append(f"scheduler={sweep.scheduler!r}: not supported with pack (allowed: fifo): ASHA stops a "
                        "whole Tune trial on one validation_score, and a pack trial trains several members")
    if sweep.resources.num_workers != 1:
        problems.append(f"resources.num_workers={sweep.resources.num_workers}: a pack trains in one process "
                        "(allowed with pack: 1)")
    return problems


def member_problems(pack: PackSection | None, job: dict[str, Any]) -> list[str]:
    """Why the trial of `job` (a valid trial job dict) cannot train in a pack; empty when it can or `pack` is off."""
    if pack is None:
        return []
    from pipelines.training.setup import pack_problems

    return [f"pack: {problem.removeprefix('member 0: ')} (or drop `pack:`: one Tune trial per trial)"
            for problem in pack_problems([member_config(job)])]


def member_config(job: dict[str, Any]):
    """The resolved config a pack member trains with: the trial's, less `train.resume` (a pack trains an unfinished
    member afresh; `train.resume` is outside the config hash, so its folder and hash are the trial's)."""
    return validate_job_config({**job, "train": {**job.get("train", {}), "resume": False}})


def base_key(job: dict[str, Any]) -> tuple:
    """What members of one pack share (`training.setup.SHARED_KEYS` and the capsule's slot count), for a valid job."""
    from pipelines.adapted import build_method_config
    from pipelines.training.setup import SHARED_KEYS

    config = member_config(job)
    shared = tuple(getattr(getattr(config, key.split(".")[0]), key.split(".")[1]) for key in SHARED_KEYS)
    return (*shared, build_method_config(config.method.name, config.method.options).num_slots)


@dataclasses.dataclass(frozen=True)
class PackPlan:
    """One pack of a sweep: its name (the Tune trial's) and its members, in pack order."""

    name: str
    members: tuple[Trial, ...]


def sweep_packs(sweep: SweepConfig) -> list[PackPlan]:
    """The packs of a packed sweep (`sweep.pack` set), every trial in exactly one."""
    size = sweep.pack.max_members
    by_base: dict[tuple, list[Trial]] = {}
    for trial in trials(sweep):
        by_base.setdefault(base_key(trial.job), []).append(trial)
    groups = [group[start:start + size] for group in by_base.values() for start in range(0, len(group), size)]
    return [PackPlan(f"pack{i:03d}-{model_slug(group[0].model)}-x{len(group)}", tuple(group))
            for i, group in enumerate(groups)]


def trial_point(trial: Trial) -> dict[str, Any]:
    """A trial as Tune's grid holds it (`run.param_space`)."""
    return {"task": trial.task, "model": trial.model, "method": trial.method, "seed": trial.seed,
            "select": trial.select}


def pack_point(plan: PackPlan) -> dict[str, Any]:
    """A pack as Tune's grid holds it: its name and its members' points."""
    return {"pack": plan.name, "members": [trial_point(t) for t in plan.members]}


def is_pack_point(point: dict[str, Any]) -> bool:
    """Whether a Tune grid point is a pack's (`pack_point`) rather than one trial's (`trial_point`)."""
    return "members" in point


def member_report_key(index: int, metric: str) -> str:
    """The key of member `index`'s `metric` in its pack trial's Tune report (`trial.pack_report` writes it,
    `member_points` reads it)."""
    return f"member{index}.{metric}"


def member_points(point: dict[str, Any], metrics: dict[str, Any]) -> list[tuple[dict, dict, str]]:
    """(trial point, its metrics, its pack name) of each trial of a Tune result: one for a plain trial (no pack:
    ""), each member of a pack with the metrics its pack reported for it (`member_report_key`)."""
    if not is_pack_point(point):
        return [(point, metrics, "")]
    return [(member, {key.removeprefix(member_report_key(i, "")): value for key, value in metrics.items()
                      if key.startswith(member_report_key(i, ""))}, point["pack"])
            for i, member in enumerate(point["members"])]
