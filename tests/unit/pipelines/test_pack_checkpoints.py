"""Pack member checkpoints (`PackOptions.checkpoints`): a pack interrupted in one member's report of a validation,
run again, continues that member from its last checkpoint (saved after its previous report, mid-epoch) and trains
the other from scratch; every validation is reported once, and with dropout off both end as in a pack never
interrupted (same losses, validations and capsule). Real tiny T5, generated or real task files."""

from __future__ import annotations

import os

import pytest
import torch

from pipelines.config.load import load_job_config
from pipelines.training.pack_setup import PackOptions
from pipelines.training.packed import CHECKPOINT, train_pack

OPTIONS = PackOptions(dropout=False, checkpoints=True)


def _members(folder) -> list:
    """Two members, 24 examples in batches of 8 (3 per epoch), 7 steps, validation every 2 (mid-epoch)."""
    source = "local" if os.environ.get("CAPT_DATA_DIR") else "generated"
    return [load_job_config(None, [
        "model.name=tiny-t5", f"task.name={task}", f"task.source={source}", "task.generated_size=48",
        "task.max_train_examples=24", "task.max_eval_examples=8", "train.batch_size=8", "train.eval_batch_size=8",
        "train.max_steps=7", "train.eval_every_steps=2", "train.eval_mode=rank", "train.patience=null",
        "model.max_length=96", "train.cpu=true", f"seed={seed}", f"output_dir={folder}/{task}-s{seed}"])
        for task, seed in (("rte", 0), ("cb", 1))]


class _Killed(Exception):
    pass


@pytest.mark.slow
def test_an_interrupted_pack_continues_each_member_from_its_checkpoint(tmp_path):
    whole = train_pack(_members(tmp_path / "whole"), OPTIONS)
    configs = _members(tmp_path / "resumed")
    seen: dict[int, list[int]] = {0: [], 1: []}

    def kill_member0_at_step_4(record: dict) -> None:
        if record["step"] == 4:
            raise _Killed  # killed before its step-4 validation reached the tracker
        seen[0].append(record["step"])

    with pytest.raises(_Killed):
        train_pack(configs, OPTIONS, reports={0: kill_member0_at_step_4})
    # member 0 reports before it checkpoints: its last checkpoint is step 2's, so its step-4 validation runs again
    saved = torch.load(configs[0].resolved_output_dir() / CHECKPOINT, weights_only=True)
    assert '"step": 2' in saved["loop"] and '"batches_in_epoch": 2' in saved["loop"]
    (configs[1].resolved_output_dir() / CHECKPOINT).unlink()  # as if it had validated nothing: it starts over
    resumed = train_pack(configs, OPTIONS, reports={i: lambda r, i=i: seen[i].append(r["step"]) for i in seen})
    assert seen == {0: [2, 4, 6, 7], 1: [2, 4, 6, 7]}, (
        "every validation reported once: member 0 continued at step 2 (mid-epoch), member 1 started over")
    for again, alone in zip(resumed, whole, strict=True):
        assert again["steps"] == alone["steps"] == 7 and len(again["losses"]) == 7
        torch.testing.assert_close(torch.tensor(again["losses"]), torch.tensor(alone["losses"]), rtol=1e-5, atol=0)
        assert [r["step"] for r in again["history"]] == [2, 4, 6, 7]
        for mine, theirs in zip(again["history"], alone["history"], strict=True):
            assert mine == pytest.approx(theirs, rel=1e-5)
        for name, tensor in alone["final_state"].items():
            torch.testing.assert_close(again["final_state"][name], tensor, rtol=1e-5, atol=1e-6)
