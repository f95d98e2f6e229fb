"""Who packs with whom: a packed sweep's trials grouped into Tune trials of at most `pack.max_members` members.

Trials pack together when they share the base model (`config.base_key`: model, dtype, precision, device and the
capsule's slot count); each base's trials, in grid order (task, model, method row, `select:` value, seed), are cut
into packs of K, the last one smaller. A pack's name, `pack<NNN>-<model slug>-x<members>`, is the Tune trial's name
and folder; it is the same for the same sweep config, so `--resume` meets the same packs. Each member keeps what a
trial has: its own job config, config hash, output folder (`config.trial_job`) and MLflow run.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pipelines.config.schema import model_slug
from pipelines.sweeps.config import SweepConfig, Trial, base_key, trials


@dataclasses.dataclass(frozen=True)
class PackPlan:
    """One pack of a sweep: its name (the Tune trial's) and its members, in pack order."""

    name: str
    members: tuple[Trial, ...]


def sweep_packs(sweep: SweepConfig, points: list[Trial] | None = None) -> list[PackPlan]:
    """The packs of a packed sweep (`sweep.pack` set), every trial in exactly one."""
    size = sweep.pack.max_members
    by_base: dict[tuple, list[Trial]] = {}
    for trial in trials(sweep) if points is None else points:
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


def member_points(point: dict[str, Any], metrics: dict[str, Any]) -> list[tuple[dict, dict, str]]:
    """(trial point, its metrics, its pack name) of each trial of a Tune result: one for a plain trial (no pack:
    ""), each member of a pack with the metrics its pack reported for it (`member_report_key`)."""
    if not is_pack_point(point):
        return [(point, metrics, "")]
    return [(member, {key.removeprefix(member_report_key(i, "")): value for key, value in metrics.items()
                      if key.startswith(member_report_key(i, ""))}, point["pack"])
            for i, member in enumerate(point["members"])]


def member_report_key(index: int, metric: str) -> str:
    """The key of member `index`'s `metric` in its pack trial's Tune report."""
    return f"member{index}.{metric}"
