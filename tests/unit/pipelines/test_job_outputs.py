"""A job's outputs belong to one config: never reused or replaced for another, one writer per folder,
and a damaged checkpoint is refused rather than resumed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.bad_inputs import call_entry
from helpers.jobs import tiny_job

from pipelines.config.load import load_job_config
from pipelines.training.checkpoint import DamagedCheckpointError
from pipelines.training.loop import run
from pipelines.training.outputs import CLAIM_FILE, JobFolderError, claim_job_folder, config_hash

ROOT = Path(__file__).resolve().parents[3]
TRAIN = {"max_steps": 4, "eval_every_steps": 2, "resume": True}


def _stamps(folder: Path) -> dict[str, int]:
    """Modification times of every file under `folder` but the lock (what a refused job must not touch)."""
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*")
            if p.is_file() and p.name != "job.lock"}


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A folder holding the finished result (and last checkpoint) of a job with optim.lr=0.3."""
    folder = tmp_path_factory.mktemp("finished")
    run(tiny_job(folder, optim={"lr": 0.3}, train=TRAIN))
    return folder


def _copy(finished: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "job"
    shutil.copytree(finished, folder)
    return folder


def test_a_changed_config_is_refused_naming_the_keys_that_differ(finished, tmp_path):
    folder = _copy(finished, tmp_path)
    (folder / "result.json").unlink()  # as a job killed after its last checkpoint leaves it
    shutil.rmtree(folder / "artifact")
    before = _stamps(folder)
    with pytest.raises(JobFolderError) as err:
        run(tiny_job(folder, optim={"lr": 0.01}, train=TRAIN))
    message = str(err.value)
    assert "optim.lr: 0.3 -> 0.01" in message and "checkpoints" in message
    assert "new output_dir" in message and "train.overwrite=true" in message
    assert _stamps(folder) == before, "nothing in the folder changed"


def test_another_configs_finished_result_is_never_replaced(finished, tmp_path):
    folder = _copy(finished, tmp_path)
    before = _stamps(folder)
    for resume in (True, False):
        with pytest.raises(JobFolderError, match="seed: 0 -> 1"):
            run(tiny_job(folder, optim={"lr": 0.3}, train={**TRAIN, "resume": resume}, seed=1))
    assert _stamps(folder) == before
    assert json.loads((folder / "result.json").read_text())["seed"] == 0


def test_the_same_config_returns_its_result_or_resumes_its_checkpoint(finished, tmp_path):
    folder = _copy(finished, tmp_path)
    first = json.loads((folder / "result.json").read_text())
    same = tiny_job(folder, optim={"lr": 0.3}, train={**TRAIN, "log_every_steps": 3})  # a key that changes nothing
    reported: list[dict] = []
    assert run(same, reported.append)["metrics"] == first["metrics"] and reported == []
    (folder / "result.json").unlink()
    shutil.rmtree(folder / "artifact")
    resumed = run(same, reported.append)
    assert reported == [], "resumed at the last step: nothing trained again"
    assert resumed["steps"] == 4 and resumed["metrics"] == first["metrics"]
    assert resumed["config_hash"] == config_hash(same) == first["config_hash"]


def test_overwrite_replaces_another_configs_outputs(finished, tmp_path):
    folder = _copy(finished, tmp_path)
    changed = tiny_job(folder, optim={"lr": 0.01}, train={**TRAIN, "overwrite": True})
    reported: list[dict] = []
    result = run(changed, reported.append)
    assert [r["step"] for r in reported] == [2, 4], "trained afresh from step 0"
    stored = json.loads((folder / "result.json").read_text())
    assert stored["config"]["optim"]["lr"] == 0.01 and stored["metrics"] == result["metrics"]
    assert json.loads((folder / CLAIM_FILE).read_text())["config_hash"] == config_hash(changed)
    assert stored["metrics"] != json.loads((finished / "result.json").read_text())["metrics"]


@pytest.mark.parametrize("missing", ["optimizer.bin", "loop_state.json", "trainable_0.safetensors",
                                     "best_trainable.safetensors"])
def test_a_damaged_checkpoint_is_refused_naming_the_missing_file(finished, tmp_path, missing):
    folder = _copy(finished, tmp_path)
    (folder / "result.json").unlink()
    (folder / "checkpoints" / "latest" / missing).unlink()
    with pytest.raises(DamagedCheckpointError) as err:
        run(tiny_job(folder, optim={"lr": 0.3}, train=TRAIN))
    assert f"{missing} is missing" in str(err.value) and "train.resume=false" in str(err.value)
    assert not (folder / "result.json").exists(), "no result from a guessed state"


def _job_command(folder: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "pipelines.train", "model.name=tiny-t5", "model.max_length=96", "task.name=rte",
            "task.source=generated", "task.generated_size=16", "task.max_eval_examples=8", "train.batch_size=16",
            "train.eval_batch_size=8", "train.eval_mode=rank", "train.patience=null", f"output_dir={folder}", *extra]


@pytest.mark.slow
def test_a_second_job_on_a_folder_in_use_fails_at_once(tmp_path, capsys):
    folder = tmp_path / "job"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    long = ["train.max_steps=100000", "train.max_epochs=100000", "train.eval_every_steps=50"]
    first = subprocess.Popen(_job_command(folder, *long), cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while not (folder / CLAIM_FILE).is_file() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert first.poll() is None, "the first job must be running"
        second = call_entry("train", _job_command(folder, *long)[3:], env, ROOT, capsys)  # main(argv) in this process
        assert second.returncode != 0 and "is in use by another job" in second.stderr
        assert f"pid {first.pid}" in second.stderr
        assert first.poll() is None, "the first job keeps running"
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    config = load_job_config(None, _job_command(folder, *long)[3:])
    with claim_job_folder(config):  # the kernel released the dead job's lock
        assert json.loads((folder / CLAIM_FILE).read_text())["config_hash"] == config_hash(config)
