"""A job killed after a checkpoint and resumed ends exactly where an uninterrupted run ends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[3]
JOB = ["model.name=tiny-t5", "task.source=generated", "task.generated_size=48", "task.max_eval_examples=8",
       "train.batch_size=8", "train.eval_batch_size=8", "train.max_steps=24", "train.eval_every_steps=8",
       "train.checkpoint_every_steps=2", "train.eval_mode=rank", "model.max_length=96", "method.options.init=normal",
       "train.patience=null"]


def _command(output_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "pipelines.train", *JOB, f"output_dir={output_dir}", *extra]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def _kill_after_checkpoint(output_dir: Path, min_step: int) -> int:
    """Start the job, SIGKILL it once a checkpoint at `min_step` or later exists; return the killed step."""
    proc = subprocess.Popen(_command(output_dir), cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    state = output_dir / "checkpoints" / "latest" / "loop_state.json"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if state.is_file() and (step := json.loads(state.read_text())["step"]) >= min_step:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return step
        time.sleep(0.01)
    proc.kill()
    pytest.fail(f"the job ended (rc={proc.returncode}) before a checkpoint at step {min_step} could be killed")


def _run_in_this_process(output_dir: Path) -> None:
    """The uninterrupted job of `_command`, run here (no second interpreter to start); its caller holds torch on the
    one thread that the command's OMP_NUM_THREADS=1 gives it: the losses match bit for bit only on the same count."""
    from pipelines.config.load import load_job_config
    from pipelines.training.loop import run

    run(load_job_config(None, [*JOB, f"output_dir={output_dir}"]))


@pytest.mark.slow
def test_killed_job_resumes_to_the_same_result(tmp_path, one_thread):
    killed_at = _kill_after_checkpoint(tmp_path / "resumed", min_step=10)
    assert not (tmp_path / "resumed" / "result.json").exists()
    subprocess.run(_command(tmp_path / "resumed", "train.resume=true"), cwd=ROOT, env=_env(), check=True,
                   capture_output=True, timeout=300)
    _run_in_this_process(tmp_path / "straight")
    resumed = json.loads((tmp_path / "resumed" / "result.json").read_text())
    straight = json.loads((tmp_path / "straight" / "result.json").read_text())
    assert 10 <= killed_at < 24 and resumed["steps"] == straight["steps"] == 24
    assert resumed["metrics"] == straight["metrics"]
    assert [r["train_loss"] for r in resumed["history"]] == [r["train_loss"] for r in straight["history"]]
    assert [p["step"] for p in resumed["curve"]] == [10, 20, 24]  # the checkpoint carries the curve's open window
    assert [p["train_loss"] for p in resumed["curve"]] == [p["train_loss"] for p in straight["curve"]]
    capsule = "artifact/capsule.safetensors"
    assert torch.equal(load_file(str(tmp_path / "resumed" / capsule))["vectors"],
                       load_file(str(tmp_path / "straight" / capsule))["vectors"])


def test_resuming_a_finished_job_returns_its_result_without_training_again(tmp_path):
    from helpers.jobs import tiny_job

    from pipelines.training.loop import run
    from pipelines.training.outputs import JobFolderError

    config = tiny_job(tmp_path, train={"max_steps": 4, "eval_every_steps": 2, "resume": True})
    first = run(config)
    result_file, capsule = tmp_path / "result.json", tmp_path / "artifact" / "capsule.safetensors"
    written = (result_file.stat().st_mtime_ns, capsule.stat().st_mtime_ns)
    reported = []
    again = run(config, reported.append)
    assert again["metrics"] == first["metrics"] and reported == [], "nothing was trained or reported"
    assert (result_file.stat().st_mtime_ns, capsule.stat().st_mtime_ns) == written

    longer = tiny_job(tmp_path, train={"max_steps": 6, "eval_every_steps": 2, "resume": True})
    with pytest.raises(JobFolderError, match=r"train\.max_steps: 4 -> 6"):
        run(longer)  # another config never continues this one's checkpoint
    assert json.loads(result_file.read_text())["steps"] == 4


class _Killed(Exception):
    pass


def test_a_job_killed_while_reporting_a_validation_reports_it_again_when_resumed(tmp_path):
    """A job reports each validation before it checkpoints it: killed in between, the resumed job validates that
    step again, so no validation is checkpointed that no tracker logged."""
    from helpers.jobs import tiny_job

    from pipelines.training.loop import run

    config = tiny_job(tmp_path, train={"max_steps": 6, "eval_every_steps": 2, "resume": True})
    reported: list[int] = []

    def killed_at_step_4(record: dict) -> None:
        if record["step"] == 4:
            raise _Killed
        reported.append(record["step"])

    with pytest.raises(_Killed):
        run(config, killed_at_step_4)
    state = json.loads((tmp_path / "checkpoints" / "latest" / "loop_state.json").read_text())
    assert state["step"] == 2, "the step-4 validation was not checkpointed: it was never reported"
    result = run(config, lambda record: reported.append(record["step"]))
    assert reported == [2, 4, 6] and [r["step"] for r in result["history"]] == [2, 4, 6]


@pytest.mark.slow
def test_a_job_with_dropout_resumed_mid_epoch_ends_as_an_uninterrupted_one(tmp_path):
    """MiniLM trains with dropout: a resumed job draws its masks exactly where the uninterrupted job drew them
    (starting the resumed epoch's DataLoader iterator again must not move torch's random stream)."""
    from helpers.jobs import tiny_job

    from pipelines.training.loop import run

    def job(folder: Path):
        return tiny_job(folder, "minilm", "capt", "task.generated_size=48", "task.max_eval_examples=4",
                        train={"batch_size": 8, "max_steps": 10, "eval_every_steps": 5, "checkpoint_every_steps": 2,
                               "resume": True, "max_epochs": 4})

    def killed_at_step_5(record: dict) -> None:
        if record["step"] == 5:
            raise _Killed

    with pytest.raises(_Killed):
        run(job(tmp_path / "resumed"), killed_at_step_5)
    state = json.loads((tmp_path / "resumed" / "checkpoints" / "latest" / "loop_state.json").read_text())
    assert state["step"] == 4 and state["batches_in_epoch"] not in (0, None), state  # mid-epoch
    resumed, straight = run(job(tmp_path / "resumed")), run(job(tmp_path / "straight"))
    assert [r["train_loss"] for r in resumed["history"]] == [r["train_loss"] for r in straight["history"]]
    capsule = "artifact/capsule.safetensors"
    assert torch.equal(load_file(str(tmp_path / "resumed" / capsule))["vectors"],
                       load_file(str(tmp_path / "straight" / capsule))["vectors"])
