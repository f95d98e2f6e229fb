"""One Tune trial of a packed sweep (`pipelines.sweeps.trial.run_trial` hands it a pack's point): the members of one
pack (`pipelines.sweeps.packs`) trained in one loop on one base model, in the Tune trial's own process
(`pipelines.tracking.packs`).

Each member is what a trial is in a sweep without packing: its job config from `config.trial_job` (same config hash,
same output folder), its own MLflow run named and tagged as a trial's (`trial_process.trial_tracking`), nested like
every trial's under the sweep's parent run, plus the tag ``pack`` (the pack trial's name), and its result.json. The pack
trial has no run of its own: members then read in the UI's runs table exactly as unpacked trials do (one level under
the sweep's run, comparable with any trial), and the tag groups them. Tune gets one final report: each member's final
figures under ``member<i>.`` (what the summary reads, `packs.member_points`), ``validation_score`` (the best member's,
Tune's metric), counts of members trained and reused.
"""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter

from pipelines.config.load import validate_job_config
from pipelines.sweeps.config import SweepConfig, trial_job
from pipelines.sweeps.console import quiet_trial_process
from pipelines.sweeps.pack_rules import heap_in_force
from pipelines.sweeps.packs import member_report_key
from pipelines.sweeps.trial_process import CLAIM_WAIT_S, final_report, prepare_trial_process, trial_tracking

PACK_TAG = "pack"
"""Run tag of a pack member: the name of the pack (Tune trial) it trained in."""


def run_pack_trial(params: dict[str, Any], sweep: dict[str, Any], tracking_uri: str | None,
                   run_context: dict[str, Any] | None = None) -> None:
    """Tune function trainable of a packed sweep: train the pack in `params["point"]` and report every member."""
    from ray import tune

    from pipelines.tracking.jobs import RunPlan
    from pipelines.tracking.packs import tracked_pack

    quiet_trial_process()
    config = TypeAdapter(SweepConfig).validate_python(sweep)
    point, name = params["point"], tune.get_context().get_trial_name()
    members = [_member(config, member, name, tracking_uri, run_context or {}) for member in point["members"]]
    prepare_trial_process(config.resources.cpus_per_worker)
    info = {"name": point["pack"], "trials": [job.resolved_output_dir().name for job, _ in members],
            "heap": heap_in_force()}
    done = tracked_pack([job for job, _ in members], [RunPlan.from_dict(t) for _, t in members],
                        claim_wait_s=CLAIM_WAIT_S, pack_info=info)
    tune.report(pack_report(done))


def _member(config: SweepConfig, point: dict[str, Any], pack: str, uri: str | None,
            context: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """A member's resolved job config and its run's tracking dict, as `pipelines.sweeps.trial.run_trial` makes a
    trial's."""
    entry = next(e for e in config.methods if e.key == point["method"])
    selected = dict(point.get("select", {}))
    job = trial_job(config, point["task"], point["model"], entry, point["seed"], selected)
    tracking = trial_tracking(config, job, point, entry, selected, pack, uri)
    tracking["tags"] = {**context.get("tags", {}), **tracking["tags"], PACK_TAG: pack}
    tracking["ui_uri"] = context.get("ui_uri")
    tracking["moved_from"] = tuple(context.get("moved_from", ()))
    return validate_job_config(job), tracking


def pack_report(done: list) -> dict[str, float]:
    """The pack trial's one Tune report (`done`: each member's `TrackedResult`)."""
    report: dict[str, float] = {}
    for index, member in enumerate(done):
        for key, value in final_report(member.result, member.reused, None).items():
            report[member_report_key(index, key)] = value
    reused = sum(member.reused for member in done)
    return {"validation_score": max(m.result["metrics"]["best_validation_score"] for m in done),
            "members": float(len(done)), "members_reused": float(reused), "members_trained": float(len(done) - reused),
            "reused": float(reused == len(done)), **report}
