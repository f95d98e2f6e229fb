"""XPrompt through the one job: prompt tuning, pruning at the boundary, re-training; artifact and resume keep masks."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.jobs import tiny_job
from safetensors.torch import load_file

from capt import tasks
from pipelines.adapted import load_artifact, predict
from pipelines.models.loading import load_model
from pipelines.training.checkpoint import PHASE_FILE, DamagedCheckpointError
from pipelines.training.loop import run
from pipelines.training.setup import build_job, load_data

TOKENS, PIECES = 4, 4
OPTIONS = {"num_tokens": TOKENS, "pieces": PIECES, "init_std": 0.5, "token_prune_fraction": 0.5,
           "piece_prune_fraction": 0.25, "pruning_at": 0.5}
BOUNDARY = 15
"""pruning_at 0.5 of the job's 30 steps."""


def _job(output_dir, **train):
    return tiny_job(output_dir, "tiny-t5", "xprompt", method={"options": OPTIONS}, optim={"lr": 0.3},
                    train={"eval_every_steps": 5, **train})


def _masks(directory) -> dict[str, torch.Tensor]:
    weights = load_file(str(directory / "artifact" / "adapter.safetensors"))
    return {name: weights[name] for name in ("token_mask", "piece_mask")}


@pytest.mark.slow
def test_xprompt_job_prunes_at_its_boundary_and_retrains(tmp_path, caplog):
    with caplog.at_level(logging.INFO):
        result = run(_job(tmp_path / "job"))
    kept_pieces = round(0.75 * (TOKENS // 2) * PIECES)
    assert f"xprompt pruning: {TOKENS // 2} of {TOKENS} tokens and {kept_pieces} of" in caplog.text
    assert f"phase 2 of 2 begins after step {BOUNDARY}" in caplog.text
    masks = _masks(tmp_path / "job")
    assert masks["token_mask"].sum() == TOKENS // 2
    assert (masks["piece_mask"] * masks["token_mask"][:, None]).sum() == kept_pieces

    final_phase = [r["train_loss"] for r in result["history"] if r["step"] > BOUNDARY]
    assert len(final_phase) == 3 and final_phase[-1] < final_phase[0], f"loss must fall after pruning: {final_phase}"
    assert result["best_step"] >= BOUNDARY  # the kept state is the pruned prompt's

    loaded = load_model("tiny-t5", tasks.get("rte").num_labels)
    reloaded = load_artifact(loaded.model, tmp_path / "job" / "artifact")
    assert reloaded.surviving_tokens == TOKENS // 2 and reloaded.surviving_pieces == kept_pieces
    collator = tasks.Collator(loaded.tokenizer, loaded.family, max_length=96, capsule_slots=TOKENS)
    test = load_data(_job(tmp_path / "job")).test
    predictions = predict(reloaded, test, collator, loaded.spec, "rank", 8, 10, loaded.tokenizer, "cpu")
    metrics = tasks.compute_metrics("rte", predictions, [e.label for e in test])
    assert metrics["score"] == pytest.approx(result["metrics"]["test_score"])


class _Interrupted(Exception):
    pass


def _interrupt_at(step: int):
    def report(record: dict) -> None:
        if record["step"] == step:
            raise _Interrupted
    return report


@pytest.mark.slow
def test_xprompt_job_resumed_after_pruning_keeps_its_masks(tmp_path):
    straight = run(_job(tmp_path / "straight"))
    with pytest.raises(_Interrupted):
        run(_job(tmp_path / "resumed"), report=_interrupt_at(BOUNDARY + 5))
    checkpoint = tmp_path / "resumed" / "checkpoints" / "latest"
    assert load_file(str(checkpoint / PHASE_FILE.format(index=0)))["token_mask"].sum() == TOKENS // 2

    resumed = run(_job(tmp_path / "resumed", resume=True))
    assert resumed["metrics"] == straight["metrics"]
    assert [r["train_loss"] for r in resumed["history"]] == [r["train_loss"] for r in straight["history"]]
    for name, mask in _masks(tmp_path / "straight").items():
        assert torch.equal(_masks(tmp_path / "resumed")[name], mask)


@pytest.mark.slow
def test_xprompt_checkpoint_without_its_masks_is_refused(tmp_path):
    with pytest.raises(_Interrupted):
        run(_job(tmp_path / "job"), report=_interrupt_at(BOUNDARY + 5))
    (tmp_path / "job" / "checkpoints" / "latest" / PHASE_FILE.format(index=0)).unlink()
    with pytest.raises(DamagedCheckpointError, match="pruning masks"):
        run(_job(tmp_path / "job", resume=True))


@pytest.mark.slow
def test_two_processes_prune_alike(tmp_path):
    root = Path(__file__).resolve().parents[3]
    job = ["model.name=tiny-t5", "task.source=generated", "task.generated_size=32", "task.max_eval_examples=8",
           "train.batch_size=8", "train.eval_batch_size=8", "train.max_steps=6", "train.eval_every_steps=3",
           "train.eval_mode=rank", "model.max_length=96", "method.name=xprompt",
           *(f"method.options.{key}={value}" for key, value in OPTIONS.items())]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               str(root / "tests" / "helpers" / "ddp_job.py"), str(tmp_path), *job]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(root)}
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, cwd=root)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert json.loads((tmp_path / "result.json").read_text())["ranks_in_sync"] is True
    rank0, rank1 = (load_file(str(tmp_path / f"rank{rank}.safetensors")) for rank in (0, 1))
    for name in ("prompt", "token_mask", "piece_mask"):
        assert torch.equal(rank0[name], rank1[name]), f"{name} differs between the ranks"
    assert rank0["token_mask"].sum() == TOKENS // 2


@pytest.mark.slow
def test_early_stopping_waits_for_the_final_phase(tmp_path):
    result = run(_job(tmp_path / "job", eval_every_steps=1, patience=1))
    scores = [r["validation_score"] for r in result["history"] if r["step"] < BOUNDARY]
    stalled = any(score <= max(scores[:index]) for index, score in enumerate(scores) if index)
    assert stalled, f"validation never stalled before pruning (a one-phase job would have stopped): {scores}"
    assert result["stopped_early"] and BOUNDARY < result["steps"] < 30
    assert result["best_step"] >= BOUNDARY


def _fresh_run_factor(step: int, length: int, warmup: int) -> float:
    """Linear warm-up to the lr over `warmup` steps, then linear decay to 0 at `length` (the schedule's equations)."""
    return step / warmup if step < warmup else (length - step) / (length - warmup)


@pytest.mark.parametrize("restart", [True, False], ids=["restarted", "one-schedule"])
def test_the_retraining_after_the_rewind_runs_the_lr_schedule_afresh(tmp_path, restart):
    options = {**OPTIONS, "restart_schedule": restart}
    config = tiny_job(tmp_path / "job", "tiny-t5", "xprompt", method={"options": options},
                      optim={"lr": 0.3, "warmup_ratio": 0.2}, train={"max_steps": 2 * BOUNDARY})
    job = build_job(config)
    lr_factor = job.scheduler.scheduler.lr_lambdas[0]  # the LambdaLR under Accelerate's wrapper
    factors = [lr_factor(step) for step in range(2 * BOUNDARY)]
    if restart:  # two fresh runs of 15 steps, 3 of them warm-up each
        expected = [_fresh_run_factor(step, BOUNDARY, 3) for step in range(BOUNDARY)] * 2
    else:  # one run of 30 steps, 6 of them warm-up
        expected = [_fresh_run_factor(step, 2 * BOUNDARY, 6) for step in range(2 * BOUNDARY)]
    assert factors == pytest.approx(expected, abs=1e-12)
