"""Packed training: K CaPT jobs in one loop over one frozen base model (issue #34).

    from pipelines.training.packed import train_pack
    results = train_pack([config_a, config_b, config_c])      # resolved JobConfigs (pipelines.config.load)

Each member runs a single job's schedule (`pipelines.training.loop.schedule`: the same data order, step budget,
validation points, best state and early stopping) and the pack drives them side by side with the same loop
(`pipelines.training.loop.drive`). Each step's batch holds the next batch of every active member, rows routed to the
member's capsule (and head: `capt.packing.PackedCapsules`). Member m's loss is the mean over its own rows, so its
gradient is the one it gets training alone; the pack backpropagates the sum once, then every member clips and steps
its own optimiser and schedule. The members that validate at one point (and all of them for the untrained and the
final test scores) score their examples in shared batches (`pipelines.training.pack_eval`). When a member's schedule
ends (budget reached or patience out) it leaves the pack; the pack ends with its last member.

Exactness (tests/unit/pipelines/test_packed_training.py): a pack of one is `pipelines.training.loop.run` step for step
(the same data order, `pack_setup.EpochSampler` being Accelerate's seedable sampler; the same optimiser groups,
schedule, clipping, validation points and early stopping; the same dropout stream), so its capsule and history are
the job's. In a pack of K, with dropout off, each member's losses, validations and final capsule equal its pack of
one within float noise (relative 1e-5 in fp32: only the batch's padding and size differ).

What differs from a single job (`pipelines.training.loop.run`): one process only; no loss-curve callbacks; checkpoints
only with `PackOptions.checkpoints` (`pipelines.training.pack_outputs`: each member's state at its last validation,
continued by a pack run again); each member's best state is kept in memory and returned, and written as an artifact in
its output_dir (`pipelines.training.pack_outputs`; `pipelines.tracking.packs` adds result.json and MLflow runs); dropout
masks are drawn from the pack's one random stream over the whole batch, so a member's masks are not the ones it draws
alone (a pack of one draws the single job's).

`train_members` also writes each member's result.json in its folder as a single job writes its own
(`pipelines.training.loop._finish`): the same fields, sealed with the artifact's digests, so a sweep, `promote`,
`report` and a later run that reuses it read it like any job's. What is the pack's rather than the member's:
``wall_time_s`` and ``peak_memory_mb`` are the whole pack's (one loop, one process); ``tokens_per_second`` is left out
(not measured per member); ``pack`` names the pack and its members.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import time
from collections.abc import Iterator, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import torch

from capt.atomic import write_atomically
from pipelines.config.schema import require_resolved
from pipelines.training.loop import Report, drive, schedule, training_loss
from pipelines.training.outputs import RESULT_FILE, seal_result
from pipelines.training.pack_eval import evaluate_members
from pipelines.training.pack_outputs import (
    claimed_member_folders,
    member_state,
    restore_member,
    save_member,
    save_member_artifact,
)
from pipelines.training.pack_setup import Member, Pack, PackOptions, build_pack
from pipelines.training.result import result_record

logger = logging.getLogger(__name__)


class PackDivergedError(RuntimeError):
    """A member's training loss became NaN or infinite."""


def train_pack(configs: list, options: PackOptions | None = None,
               reports: Mapping[int, Report] | None = None) -> list[dict[str, Any]]:
    """Train the jobs `configs` (resolved `JobConfig`s) as one pack; one result per member, in order.

    When the members write artifacts (`PackOptions.write_artifacts`), each member's output_dir is claimed as a job
    claims its folder, for the whole pack. `reports[i]`, when given, gets member i's every validation record (as
    `pipelines.training.loop.run`'s `report` does)."""
    options = options or PackOptions()
    configs = [require_resolved(config, "train_pack") for config in configs]
    with claimed_member_folders(configs if options.write_artifacts else [], keep_checkpoints=options.checkpoints):
        return fit_pack(build_pack(configs, options), reports)


def train_members(configs: list, reports: Mapping[int, Report] | None = None,
                  pack_info: Mapping[str, Any] | None = None,
                  options: PackOptions | None = None) -> list[dict[str, Any]]:
    """Train `configs` (resolved, `train.resume` off) as one pack and write each member's artifact and result.json in
    its output_dir; returns the results (result.json's content), in order. `pack_info` goes into each result as
    ``pack`` (e.g. the sweep's pack name and members)."""
    options = options or PackOptions()
    with claimed_member_folders(configs, keep_checkpoints=options.checkpoints):
        pack = build_pack(configs, options)
        started = time.perf_counter()
        packed = fit_pack(pack, reports)
        wall = time.perf_counter() - started
        return [write_member_result(pack, member, out, wall, pack_info)
                for member, out in zip(pack.members, packed, strict=True)]


def write_member_result(pack: Pack, member: Member, packed: Mapping[str, Any], wall_s: float,
                        pack_info: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Member's result in a single job's format (`packed` is `fit_pack`'s result for it), sealed and written."""
    result = result_record(member, pack.spec.family, member.loop, packed["metrics"], member.best,
                           member.stopped_early, wall_s, None, pack.accelerator.device, 1, True,
                           packed["artifact_dir"])
    result["pack"] = {"members": len(pack.members), "index": member.index, **(pack_info or {})}
    seal_result(result, packed["artifact_dir"])
    write_atomically(Path(member.config.resolved_output_dir()) / RESULT_FILE, json.dumps(result, indent=2, default=str))
    return result


def fit_pack(pack: Pack, reports: Mapping[int, Report] | None = None) -> list[dict[str, Any]]:
    """Train a built pack until its last member ends; each member's result, its best state restored and tested.
    `reports[i]`: called with member i's every validation record."""
    pack.reports = dict(reports or {})
    if pack.options.checkpoints:
        resumed = [m.index for m in pack.members if restore_member(pack, m)]
        if resumed:
            logger.info("pack members %s continue from their checkpoints", resumed)
    _score_untrained(pack)
    schedules = {m.index: schedule(m.loop, m.config.train, m.total_steps, partial(_epoch_batches, m))
                 for m in pack.members if not m.stopped_early}  # a restored member whose patience ran out is done
    drive(schedules, partial(_pack_step, pack), lambda indices: _validate(pack, [pack.members[i] for i in indices]))
    return _finish(pack)


def _score_untrained(pack: Pack) -> None:
    """With `train.score_untrained`, a member's test score before its first step, as a single job takes it
    (`pipelines.training.loop.fit`): the reference its training has to beat (kept in its loop, so a resumed member
    keeps it too)."""
    wanted = [m for m in pack.members
              if m.config.train.score_untrained and m.loop.step == 0 and m.loop.untrained_score is None]
    scores = evaluate_members(pack, {m.index: m.splits.test for m in wanted})
    for member in wanted:
        member.loop.untrained_score = scores[member.index]["score"]
    pack.model.train(pack.options.dropout)


def _epoch_batches(member: Member, epoch: int, consumed: int) -> Iterator[dict]:
    """Member's batches of `epoch` after the first `consumed` (a resumed epoch: the rest)."""
    member.sampler.set_epoch(epoch)
    return itertools.islice(member.loader, consumed, None)


def _pack_step(pack: Pack, pending: dict[int, dict]) -> dict[int, bool]:
    """One forward and backward over every pending member's batch, then each member's own optimiser step (every
    member steps). The rows' members stay on the host, and the losses come back in one transfer: the step waits for
    the device once."""
    from capt.packing import member_rows, merge_batches

    order = sorted(pending)
    merged, positions = merge_batches([pending[i] for i in order], pack.members[order[0]].collator.pad_id)
    device = pack.accelerator.device
    batch = {k: v.to(device) for k, v in merged.items()}
    rows = torch.tensor(order, dtype=torch.long)[positions]  # (B,) member index of each row, on the host
    picks = member_rows(rows, len(pack.members), device)
    with pack.accelerator.autocast():
        logits = pack.model.member_logits(batch, rows, picks)
    losses = torch.stack([training_loss(pack.spec, logits[i], batch["labels"][picks[i]]) for i in order])  # (K,)
    losses.sum().backward()  # one backward: member m's gradient is d loss_m / d its params
    values = losses.detach().tolist()
    if not all(math.isfinite(value) for value in values):
        bad = [i for i, value in zip(order, values, strict=True) if not math.isfinite(value)]
        raise PackDivergedError(f"The training loss of pack member(s) {bad} became non-finite: lower their optim.lr.")
    for index, value in zip(order, values, strict=True):
        _optimizer_step(pack.members[index], pack, value)
    return dict.fromkeys(order, True)


def _optimizer_step(member: Member, pack: Pack, loss: float) -> None:
    clip = member.config.optim.max_grad_norm
    if clip:
        torch.nn.utils.clip_grad_norm_(list(pack.model.member_parameters(member.index).values()), clip)
    member.optimizer.step()
    member.scheduler.step()
    member.optimizer.zero_grad()
    member.loop.add_loss(loss)
    member.losses.append(loss)


def _validate(pack: Pack, members: list[Member]) -> dict[int, bool]:
    """Score the members' validation splits together and keep each one's best state; per member, whether its
    patience ran out (it stops)."""
    scores = evaluate_members(pack, {m.index: m.splits.validation for m in members})
    pack.model.train(pack.options.dropout)
    return {m.index: _record_validation(pack, m, scores[m.index]) for m in members}


def _record_validation(pack: Pack, member: Member, metrics: dict[str, float]) -> bool:
    """Member `member`'s validation record from `metrics`; True when its patience ran out."""
    record, improved = member.loop.record_validation(metrics)
    if improved:
        member.best = member_state(pack, member)
    patience = member.config.train.patience
    member.stopped_early = patience is not None and member.loop.bad_evals >= patience
    # reported before it is checkpointed, as a single job does (`pipelines.training.loop`)
    if (report := pack.reports.get(member.index)) is not None:
        report(dict(record))
    if pack.options.checkpoints:
        save_member(pack, member)
    if member.stopped_early:
        logger.info("pack member %d (%s) stops early at step %d", member.index, member.config.task.name,
                    member.loop.step)
    return member.stopped_early


def _finish(pack: Pack) -> list[dict[str, Any]]:
    """Restore every member's best state, score the test splits (together), and describe each member's run as a
    single job's result does."""
    finals = {m.index: member_state(pack, m) for m in pack.members}
    with torch.no_grad():
        for member in pack.members:
            for name, param in pack.model.member_parameters(member.index).items():
                param.copy_(member.best[name].to(param.device, param.dtype))
    tests = evaluate_members(pack, {m.index: m.splits.test for m in pack.members})
    return [_result(pack, m, tests[m.index], finals[m.index]) for m in pack.members]


def _result(pack: Pack, member: Member, test: dict[str, float], final: dict[str, torch.Tensor]) -> dict[str, Any]:
    config, loop = member.config, member.loop
    metrics = {"train_loss": loop.history[-1]["train_loss"], "best_validation_score": loop.best_score,
               **{f"test_{k}": v for k, v in test.items()}}
    artifact = save_member_artifact(pack, member, metrics) if pack.options.write_artifacts else None
    return {
        "member": member.index, "task": config.task.name, "model": config.model.name,
        "method": config.method.name, "seed": config.seed,
        "metrics": metrics, "artifact_dir": None if artifact is None else str(artifact),
        "history": loop.history, "losses": member.losses, "steps": loop.step, "epochs": loop.epoch,
        "best_step": loop.best_step, "stopped_early": member.stopped_early, "total_steps": member.total_steps,
        "best_state": member.best, "final_state": final, "config": config.to_dict(),
    }
