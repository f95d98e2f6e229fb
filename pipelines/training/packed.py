"""Packed training: K CaPT jobs in one loop over one frozen base model (README: "Packed training").

    from pipelines.training.packed import train_pack
    results = train_pack([config_a, config_b, config_c])      # resolved JobConfigs (pipelines.config.load)

Each member runs a single job's schedule (`pipelines.training.loop.schedule`) and the pack drives them side by side
with the same `drive`. Each step's batch holds the next batch of every active member, rows routed to the member's
capsule (and head: `capt.packing.PackedCapsules`). Member m's loss is the mean over its own rows, so its gradient is
the one it gets training alone; the pack backpropagates the sum once, then every member clips and steps its own
optimiser and schedule.

Exactness (tests/unit/pipelines/test_packed_training.py): a pack of one is `pipelines.training.loop.run` step for step
(the same data order, `pack_setup.EpochSampler` being Accelerate's seedable sampler; the same optimiser groups,
schedule, clipping, validation points and early stopping; the same dropout stream). In a pack of K, with dropout off,
each member equals its pack of one within float noise (relative 1e-5 in fp32: only the batch's padding and size
differ); with dropout on, masks come from the pack's one random stream over the whole batch.

What differs from a single job: one process only; no loss-curve callbacks; checkpoints only with
`PackOptions.checkpoints`. `train_members` writes each member's result.json as a single job does, but
``wall_time_s`` and ``peak_memory_mb`` are the whole pack's (one loop, one process), ``tokens_per_second`` is left out
(not measured per member), and ``pack`` names the pack and its members.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from capt.atomic import write_atomically
from capt.heads import head_installed
from capt.packing import member_rows, merge_batches
from capt.tasks import Example, rank_classify
from pipelines.adapted import evaluate, metrics_of, model_inputs, save_artifact, sequence_log_likelihood
from pipelines.config.load import validate_job_config
from pipelines.config.schema import require_resolved
from pipelines.training.checkpoint import LoopState, copy_into, cpu_copies
from pipelines.training.loop import Report, drive, schedule, training_loss
from pipelines.training.outputs import RESULT_FILE, claim_job_folder, remove_paths, seal_result
from pipelines.training.pack_setup import Member, Pack, PackError, PackOptions, build_pack
from pipelines.training.result import final_scores, result_record

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
    its output_dir, in a single job's format; returns the results (result.json's content), in order. `pack_info` goes
    into each result as ``pack`` (e.g. the sweep's pack name and members)."""
    options = options or PackOptions()
    with claimed_member_folders(configs, keep_checkpoints=options.checkpoints):
        pack = build_pack(configs, options)
        started = time.perf_counter()
        packed = fit_pack(pack, reports)
        wall = time.perf_counter() - started
        results = []
        for member, out in zip(pack.members, packed, strict=True):
            result = result_record(member, pack.spec.family, member.loop, out["metrics"], member.best,
                                   member.stopped_early, wall, None, pack.accelerator.device, 1, True,
                                   out["artifact_dir"])
            result["pack"] = {"members": len(pack.members), "index": member.index, **(pack_info or {})}
            seal_result(result, out["artifact_dir"])
            write_atomically(member.config.resolved_output_dir() / RESULT_FILE,
                             json.dumps(result, indent=2, default=str))
            results.append(result)
        return results


def fit_pack(pack: Pack, reports: Mapping[int, Report] | None = None) -> list[dict[str, Any]]:
    """Train a built pack until its last member ends; each member's result, its best state restored and tested.
    `reports[i]`: called with member i's every validation record."""
    pack.reports = dict(reports or {})
    if pack.options.checkpoints:
        resumed = [m.index for m in pack.members if restore_member(pack, m)]
        if resumed:
            logger.info("pack members %s continue from their checkpoints", resumed)
    # with `train.score_untrained`, a member's test score before its first step, as a single job takes it
    # (`pipelines.training.loop.fit`): kept in its loop, so a resumed member keeps it too
    wanted = [m for m in pack.members if m.loop.wants_untrained_score(m.config.train)]
    scores = evaluate_members(pack, {m.index: m.splits.test for m in wanted})
    for member in wanted:
        member.loop.untrained_score = scores[member.index]["score"]
    pack.model.train(pack.options.dropout)
    schedules = {m.index: schedule(m.loop, m.config.train, m.total_steps, partial(_epoch_batches, m))
                 for m in pack.members if not m.stopped_early}  # a restored member whose patience ran out is done
    drive(schedules, partial(_pack_step, pack), lambda indices: _validate(pack, [pack.members[i] for i in indices]))
    return _finish(pack)


def _epoch_batches(member: Member, epoch: int, consumed: int) -> Iterator[dict]:
    """Member's batches of `epoch` after the first `consumed` (a resumed epoch: the rest)."""
    member.sampler.set_epoch(epoch)
    return itertools.islice(member.loader, consumed, None)


def _pack_step(pack: Pack, pending: dict[int, dict]) -> dict[int, bool]:
    """One forward and backward over every pending member's batch, then each member's own optimiser step (every
    member steps). The rows' members stay on the host, and the losses come back in one transfer: the step waits for
    the device once."""
    order = sorted(pending)
    batch, rows = _merged(pack, {i: pending[i] for i in order})
    picks = member_rows(rows, len(pack.members), pack.accelerator.device)
    with pack.accelerator.autocast():
        logits = pack.model.member_logits(batch, rows, picks)
    losses = torch.stack([training_loss(pack.spec, logits[i], batch["labels"][picks[i]]) for i in order])  # (K,)
    losses.sum().backward()  # one backward: member m's gradient is d loss_m / d its params
    values = losses.detach().tolist()
    if not all(math.isfinite(value) for value in values):
        bad = [i for i, value in zip(order, values, strict=True) if not math.isfinite(value)]
        raise PackDivergedError(f"The training loss of pack member(s) {bad} became non-finite: lower their optim.lr.")
    for index, value in zip(order, values, strict=True):
        member = pack.members[index]
        if clip := member.config.optim.max_grad_norm:
            torch.nn.utils.clip_grad_norm_(list(pack.model.member_parameters(index).values()), clip)
        member.optimizer.step()
        member.scheduler.step()
        member.optimizer.zero_grad()
        member.loop.add_loss(value)
        member.losses.append(value)
    return dict.fromkeys(order, True)


def _merged(pack: Pack, batches: Mapping[int, dict]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The members' batches as one batch on the device, and the member of each row (B,), kept on the host."""
    merged, positions = merge_batches(list(batches.values()), pack.members[next(iter(batches))].collator.pad_id)
    rows = torch.tensor(list(batches), dtype=torch.long)[positions]
    return {k: v.to(pack.accelerator.device) for k, v in merged.items()}, rows


def _validate(pack: Pack, members: list[Member]) -> dict[int, bool]:
    """Score the members' validation splits together and keep each one's best state; per member, whether its
    patience ran out (it stops)."""
    scores = evaluate_members(pack, {m.index: m.splits.validation for m in members})
    pack.model.train(pack.options.dropout)
    for member in members:
        record, improved = member.loop.record_validation(scores[member.index])
        if improved:
            member.best = member_state(pack, member)
        member.stopped_early = member.loop.out_of_patience(member.config.train.patience)
        # reported before it is checkpointed, as a single job does (`pipelines.training.loop`)
        if (report := pack.reports.get(member.index)) is not None:
            report(dict(record))
        if pack.options.checkpoints:
            save_member(pack, member)
        if member.stopped_early:
            logger.info("pack member %d (%s) stops early at step %d", member.index, member.config.task.name,
                        member.loop.step)
    return {m.index: m.stopped_early for m in members}


def _finish(pack: Pack) -> list[dict[str, Any]]:
    """Restore every member's best state, score the test splits (together), and describe each member's run as a
    single job's result does."""
    finals = {m.index: member_state(pack, m) for m in pack.members}
    for member in pack.members:
        copy_into(pack.model.member_parameters(member.index), member.best)
    tests = evaluate_members(pack, {m.index: m.splits.test for m in pack.members})
    results = []
    for member in pack.members:
        config, loop = member.config, member.loop
        metrics = final_scores(loop, tests[member.index])
        artifact = save_member_artifact(pack, member, metrics) if pack.options.write_artifacts else None
        results.append({
            "member": member.index, "task": config.task.name, "model": config.model.name,
            "method": config.method.name, "seed": config.seed,
            "metrics": metrics, "artifact_dir": None if artifact is None else str(artifact),
            "history": loop.history, "losses": member.losses, "steps": loop.step, "epochs": loop.epoch,
            "best_step": loop.best_step, "stopped_early": member.stopped_early, "total_steps": member.total_steps,
            "best_state": member.best, "final_state": finals[member.index], "config": config.to_dict(),
        })
    return results


# Packed evaluation: the members that score at the same point (a validation, the untrained or the final test) share
# batches, as their training steps do: scored one at a time, a pack of K would validate at K times the cost of one, each
# small forward bound by launching work on an accelerator. Batch n of every member's examples is merged into one batch
# (`capt.packing.merge_batches`) and each member's predictions read from its own rows: the ones it gets alone within
# float noise. Members scoring alone: a pack of one (exactly the single job's evaluation) and members that generate
# their answers (`train.eval_mode: generate`: decoding runs per member).


def evaluate_members(pack: Pack, requests: Mapping[int, Sequence[Example]]) -> dict[int, dict[str, float]]:
    """Task metrics of each member i over its examples `requests[i]`, members sharing batches where they can."""
    together = {i: examples for i, examples in requests.items()
                if pack.spec.classifier_head or pack.members[i].config.train.eval_mode == "rank"}
    if len(together) < 2:
        together = {}
    metrics = {i: evaluate_alone(pack, pack.members[i], examples)
               for i, examples in requests.items() if i not in together}
    predictions = _predict_together(pack, together) if together else {}
    metrics.update({i: metrics_of(examples, predictions[i]) for i, examples in together.items()})
    return {i: metrics[i] for i in requests}


def evaluate_alone(pack: Pack, member: Member, examples: Sequence[Example]) -> dict[str, float]:
    """Member `member`'s metrics over `examples`, scored on its own as a single job scores them."""
    cfg = member.config
    return evaluate(pack.accelerator, pack.model.member(member.index), examples, member.collator, pack.spec,
                    cfg.train.eval_mode, cfg.train.eval_batch_size, cfg.model.max_new_tokens, pack.loaded.tokenizer)


@torch.no_grad()
def _predict_together(pack: Pack, requests: Mapping[int, Sequence[Example]]) -> dict[int, list[int]]:
    """Each member i's label predictions for `requests[i]`: batch n of each member (its own
    `train.eval_batch_size`) merged into one forward, for every n."""
    pack.model.eval()
    sizes = {i: pack.members[i].config.train.eval_batch_size for i in requests}
    chunks = {i: [list(examples[start:start + sizes[i]]) for start in range(0, len(examples), sizes[i])]
              for i, examples in requests.items()}
    predictions: dict[int, list[int]] = {i: [] for i in requests}
    for n in range(max(len(member_chunks) for member_chunks in chunks.values())):
        present = {i: chunks[i][n] for i in requests if n < len(chunks[i])}
        scores = member_scores(pack, present)
        for i, chunk in present.items():
            predictions[i] += (scores[i].argmax(-1).tolist() if pack.spec.classifier_head
                               else rank_classify(scores[i].view(len(chunk), -1)))
    return predictions


def member_scores(pack: Pack, chunks: Mapping[int, list[Example]]) -> dict[int, torch.Tensor]:
    """From one merged forward over the members' chunks of examples, on the host: each member's head logits
    (N_i, C_i) (encoder classifiers), or its candidates' summed log-likelihoods (N_i * C_i,) for rank
    classification, each through its own capsule."""
    order = list(chunks)
    batch, rows = _merged(pack, {i: (pack.members[i].collator if pack.spec.classifier_head
                                     else pack.members[i].collator.candidate_batch)(chunks[i]) for i in order})
    if pack.spec.classifier_head:
        logits = pack.model.member_logits(batch, rows)
        return {i: logits[i].float().cpu() for i in order}
    labels = batch["labels"]
    # An encoder-decoder's labels build its decoder inputs; a causal LM scores its own input sequence.
    extra = {"labels": labels} if pack.spec.encoder_decoder else {}
    logits = pack.model(**model_inputs(batch), **extra, capsule=rows).logits
    scores = sequence_log_likelihood(logits, labels, shift=pack.spec.shifts_labels).cpu()  # (B,) one transfer
    picks = member_rows(rows, len(pack.members), scores.device)
    return {i: scores[picks[i]] for i in order}


# A member's outputs in its own folder: the artifact of its best state, written as a single job writes it, and its
# checkpoint (`PackOptions.checkpoints`): `<output_dir>/checkpoints/pack_member.pt`, replaced atomically at each of its
# validations, read with `torch.load(weights_only=True)` (tensors and plain values only). A resumed member sees the
# batches it had not seen yet in the order it would have (`pack_setup.EpochSampler`), with its optimiser and schedule
# where they were; the pack's dropout stream is not restored (drawn afresh by the pack that resumes).


REPLACED_OUTPUTS = ("artifact", RESULT_FILE, RESULT_FILE + ".tmp")
"""What a member's folder may hold from an interrupted end of a pack, removed before a pack that keeps checkpoints
trains it again."""


def save_member_artifact(pack: Pack, member: Member, metrics: dict[str, float]) -> Path:
    """Write the member's current capsule (and head) to `<its output_dir>/artifact`; returns that folder.

    The base model holds the member's head meanwhile (the artifact's fingerprint and head file are those of the model
    the member was trained as), and its own head again afterwards.
    """
    directory = member.config.resolved_output_dir() / "artifact"
    directory.parent.mkdir(parents=True, exist_ok=True)
    config, base = member.config, pack.loaded.model
    with head_installed(base, pack.model.member_head(member.index)):
        # the member as the `MethodModel` whose `save` writes the capsule files
        saver = SimpleNamespace(save=partial(pack.model.save_member, member.index))
        save_artifact(saver, base, config.method.name, directory, config.task.name, metrics, config.model.readout)
    return directory


@contextlib.contextmanager
def claimed_member_folders(configs: list, keep_checkpoints: bool = False) -> Iterator[None]:
    """Hold every member's output_dir as a single job holds its own (`pipelines.training.outputs.claim_job_folder`):
    locked for the pack's duration, another config's outputs refused, the member's config recorded.

    `keep_checkpoints`: the folder's outputs of the same config are kept as a resumed job keeps them (its checkpoints,
    its run record) but for the artifact and result.json, which this pack writes again (`REPLACED_OUTPUTS`); else
    they are removed, as a job that does not resume removes them."""
    folders = [str(config.resolved_output_dir().resolve()) for config in configs]
    shared = [(i, folder) for i, folder in enumerate(folders) if folders.index(folder) != i]
    if shared:
        i, folder = shared[0]
        raise PackError(f"member {i} writes to output_dir={folder}, as member {folders.index(folder)} does: each "
                        "member writes its artifact to a folder of its own (give it another output_dir)")
    with contextlib.ExitStack() as stack:
        for config in configs:
            stack.enter_context(claim_job_folder(with_resume(config, True) if keep_checkpoints else config))
            if keep_checkpoints:
                remove_paths([config.resolved_output_dir() / name for name in REPLACED_OUTPUTS])
        yield


def train_unfinished_members(configs: list, reports: Mapping[int, Report] | None = None,
                             pack_info: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """Train a tracked pack's unfinished members (`pipelines.tracking.jobs.tracked_pack`), each from its own last
    checkpoint where it has one (`PackOptions.checkpoints`); `train.resume` is set off, which a pack refuses."""
    return train_members([with_resume(c, False) for c in configs], reports, pack_info, PackOptions(checkpoints=True))


def with_resume(config, resume: bool):
    """The resolved `config` with `train.resume` set to `resume`: outside the config hash, so the same folder and hash
    (on: a claim keeps the folder's outputs of this config; off: what a pack member trains with)."""
    data = config.to_dict()
    return validate_job_config({**data, "train": {**data["train"], "resume": resume}})


CHECKPOINT = Path("checkpoints") / "pack_member.pt"
"""A member's checkpoint, under its output_dir."""


def checkpoint_path(member: Member) -> Path:
    """Where `member`'s checkpoint lives (`save_member` writes it, `restore_member` reads it)."""
    return member.config.resolved_output_dir() / CHECKPOINT


def member_state(pack: Pack, member: Member) -> dict[str, torch.Tensor]:
    """A CPU copy of `member`'s trainable tensors now (capsule, head)."""
    return cpu_copies(pack.model.member_parameters(member.index))


def save_member(pack: Pack, member: Member) -> None:
    """Write `member`'s state now (after one of its validations), replacing its previous checkpoint atomically."""
    path = checkpoint_path(member)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {"params": member_state(pack, member), "best": member.best, "optimizer": member.optimizer.state_dict(),
             "scheduler": member.scheduler.state_dict(), "loop": member.loop.to_json(), "losses": member.losses,
             "stopped_early": member.stopped_early}
    write_atomically(path, lambda staging: torch.save(state, staging))


def restore_member(pack: Pack, member: Member) -> bool:
    """Load `member`'s checkpoint into it, if it has one; True when it did."""
    path = checkpoint_path(member)
    if not path.is_file():
        return False
    state = torch.load(path, map_location="cpu", weights_only=True)
    params = pack.model.member_parameters(member.index)
    if set(params) != set(state["params"]):
        raise PackError(f"The pack checkpoint {path} holds {sorted(state['params'])}, but member {member.index} "
                        f"trains {sorted(params)}: delete {path} to train this member afresh.")
    copy_into(params, state["params"])
    member.optimizer.load_state_dict(state["optimizer"])
    member.scheduler.load_state_dict(state["scheduler"])
    member.loop = LoopState.from_json(state["loop"])
    member.best, member.losses = state["best"], list(state["losses"])
    member.stopped_early = bool(state["stopped_early"])
    return True
