"""A pack member's result.json, written in its own folder as a single job writes its own (`pipelines.train._finish`):
the same fields, sealed with the artifact's digests (`pipelines.training.cached.seal_result`), so a sweep, `promote`,
`report` and a later run that reuses it (`pipelines.training.outputs.finished_result`) read it like any job's.

What is the pack's rather than the member's: ``wall_time_s`` and ``peak_memory_mb`` are the whole pack's (one loop,
one process); ``tokens_per_second`` is left out (not measured per member); ``pack`` names the pack and its members.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from capt.atomic import write_atomically
from pipelines.config.schema import model_slug
from pipelines.training.cached import seal_result
from pipelines.training.dataset_card import dataset_card
from pipelines.training.outputs import RESULT_FILE, config_hash
from pipelines.training.pack_outputs import claimed_member_folders
from pipelines.training.pack_setup import Member, Pack, PackOptions, build_pack
from pipelines.training.packed import Report, fit_pack
from pipelines.training.result import peak_memory_mb, reference_scores, resolved_optimizer


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
    config, loop = member.config, member.loop
    folder = Path(config.resolved_output_dir())
    result = {
        "task": config.task.name, "model": config.model.name, "model_slug": model_slug(config.model.name),
        "method": config.method.name, "seed": config.seed, "family": pack.spec.family,
        "metrics": {**packed["metrics"], **reference_scores(member, loop)},
        "history": loop.history, "curve": loop.curve, "steps": loop.step, "epochs": loop.epoch,
        "best_step": loop.best_step, "stopped_early": member.stopped_early, "wall_time_s": wall_s,
        "peak_memory_mb": peak_memory_mb(pack.accelerator.device),
        "trainable_parameters": sum(p.numel() for p in member.best.values()),
        "generated_data": config.task.source == "generated", "dataset": dataset_card(config.task, member.splits),
        "processes": 1, "ranks_in_sync": True, "optimizer": resolved_optimizer(member),
        "readout": config.model.readout, "artifact_dir": packed["artifact_dir"], "config": config.to_dict(),
        "config_hash": config_hash(config),
        "pack": {"members": len(pack.members), "index": member.index, **(pack_info or {})},
    }
    seal_result(result, packed["artifact_dir"])
    write_atomically(folder / RESULT_FILE, json.dumps(result, indent=2, default=str))
    return result
