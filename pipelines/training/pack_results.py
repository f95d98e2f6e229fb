"""A pack member's result.json, written in its own folder as a single job writes its own
(`pipelines.training.loop._finish`): the same fields, sealed with the artifact's digests
(`pipelines.training.cached.seal_result`), so a sweep, `promote`, `report` and a later run that reuses it
(`pipelines.training.outputs.finished_result`) read it like any job's.

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
from pipelines.training.cached import seal_result
from pipelines.training.outputs import RESULT_FILE
from pipelines.training.pack_outputs import claimed_member_folders
from pipelines.training.pack_setup import Member, Pack, PackOptions, build_pack
from pipelines.training.packed import Report, fit_pack
from pipelines.training.result import result_record


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
