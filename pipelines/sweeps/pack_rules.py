"""The sweep's `pack:` section and its rules: which sweeps and which trials can train packed.

    pack: {max_members: 3}

A packed sweep groups its trials that share a base model (`pipelines.sweeps.packs`) and trains each group in one
Tune trial, in one loop (`pipelines.training.packed`). Only what a pack can train is accepted, checked with every
other problem of the sweep (`pipelines.sweeps.config.trials`): CaPT and its ablations (method `capt`, whatever
`pipelines.training.pack_setup.pack_problems` accepts), one worker per trial, and grid values fixed on the driver.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import PositiveInt
from pydantic.dataclasses import dataclass

from pipelines.config.schema import STRICT
from pipelines.services.ray_connect import environment_values


@dataclass(config=STRICT)
class PackSection:
    """Packed trials: the trials that share a base model train together, at most `max_members` per Tune trial."""

    max_members: PositiveInt
    """Most trials per pack (K): one Tune trial trains them in one loop on one copy of the base model."""
    heap: Literal["tuned", "default"] = "tuned"
    """glibc heap of the sweep's trial processes: tuned (`TUNED_HEAP_ENV`: one arena, freed blocks kept mapped) or
    default (glibc's own settings, or whatever the environment says)."""


TUNED_HEAP_ENV = {"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(4 << 30),
                  "MALLOC_TOP_PAD_": str(512 << 20)}
"""glibc settings of a packed sweep's trial processes (Ray runtime_env variables; glibc reads them when a process
starts). A pack's step allocates and frees activations of hundreds of MB; in a Tune trial's thread glibc serves them
from a fresh mmap each time (and from a thread arena it trims), so the kernel zero-fills every page again: a 144-row
MiniLM step paid 14.5 s of kernel time for 13.2 s of compute, 5.6 s with these settings
(benchmarks/results/page_faults.md). Kept mapped, a trial process's resident memory stays at its peak."""


def trial_process_env(sweep: Any) -> dict[str, str]:
    """Environment variables every trial process of `sweep` (a `SweepConfig`) starts with: the tuned heap of a packed
    sweep, else none."""
    if sweep.pack is None or sweep.pack.heap != "tuned":
        return {}
    return dict(TUNED_HEAP_ENV)


def heap_in_force() -> dict[str, str]:
    """The glibc heap settings this process started with (recorded in each pack member's result.json)."""
    return environment_values(TUNED_HEAP_ENV)


def pack_option_problems(sweep: Any) -> list[str]:
    """What a packed sweep (a `SweepConfig` with `pack`) cannot have yet; empty when `pack` is off."""
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
    from pipelines.training.pack_setup import pack_problems

    return [f"pack: {problem.removeprefix('member 0: ')} (or drop `pack:`: one Tune trial per trial)"
            for problem in pack_problems([member_config(job)])]


def member_config(job: dict[str, Any]):
    """The resolved config a pack member trains with: the trial's, less `train.resume` (a pack trains an unfinished
    member afresh; `train.resume` is outside the config hash, so its folder and hash are the trial's)."""
    from pipelines.config.load import validate_job_config

    return validate_job_config({**job, "train": {**job.get("train", {}), "resume": False}})


def base_key(job: dict[str, Any]) -> tuple:
    """What members of one pack share (`pack_setup.SHARED_KEYS` and the capsule's slot count), for a valid job."""
    from pipelines.methods import build_method_config
    from pipelines.training.pack_setup import SHARED_KEYS

    config = member_config(job)
    shared = tuple(getattr(getattr(config, key.split(".")[0]), key.split(".")[1]) for key in SHARED_KEYS)
    return (*shared, build_method_config(config.method.name, config.method.options).num_slots)
