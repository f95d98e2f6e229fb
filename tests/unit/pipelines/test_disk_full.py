"""A disk that fills up mid-job: one `error:` paragraph, exit 2, the last complete checkpoint kept and no partial
one, and the job resumes from it once there is room. The output folder is a real 4 MB tmpfs (root only)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipelines.training.disk_full import is_no_space

ROOT = Path(__file__).resolve().parents[3]
MAX_STEPS = 100  # the disk is filled within milliseconds of the first checkpoint, long before the last step
JOB = ["model.name=tiny-t5", "task.source=generated", "task.generated_size=48", "task.max_eval_examples=8",
       "train.batch_size=8", "train.eval_batch_size=8", f"train.max_steps={MAX_STEPS}", "train.eval_every_steps=50",
       "train.checkpoint_every_steps=2", "model.max_length=96", "train.patience=null"]


@pytest.fixture
def small_disk(tmp_path):
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {done.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(folder: Path) -> Path:
    filler = folder / "filler"
    with filler.open("wb", buffering=0) as handle, pytest.raises(OSError) as full:
        while True:
            handle.write(b"\0" * 4096)
    assert full.value.errno == errno.ENOSPC
    return filler


@pytest.mark.slow
def test_a_full_disk_stops_the_job_in_one_paragraph_and_the_resume_finishes_it(small_disk):
    job = small_disk / "job"
    command = [sys.executable, "-m", "pipelines.train", *JOB, f"output_dir={job}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    state = job / "checkpoints" / "latest" / "loop_state.json"
    deadline = time.monotonic() + 240
    while not state.is_file() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    filler = _fill(small_disk)
    _, stderr = proc.communicate(timeout=240)
    assert proc.returncode == 2, stderr[-3000:]
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert "Traceback" not in stderr and len(errors) == 1, stderr[-3000:]
    assert f"error: No space left on the device of output_dir={job}" in stderr
    assert f"the last complete checkpoint, {job / 'checkpoints' / 'latest'}, is kept" in stderr
    assert "run the job again with train.resume=true" in stderr
    assert not list(job.rglob("*.partial")), "no partial checkpoint is left"
    kept = json.loads(state.read_text())["step"]
    assert kept >= 2 and not (job / "result.json").exists()
    filler.unlink()
    resumed = subprocess.run([*command, "train.resume=true", f"train.max_steps={MAX_STEPS}"], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads((job / "result.json").read_text())["steps"] > kept


@pytest.mark.parametrize(("error", "full"), [
    (OSError(errno.ENOSPC, "No space left on device"), True),
    (OSError(errno.EDQUOT, "Disk quota exceeded"), True),
    (RuntimeError("[enforce fail at inline_container.cc:664] . PytorchStreamWriter failed writing file data/0: "
                  "file write failed"), True),
    (OSError(errno.EACCES, "Permission denied"), False),
    (ValueError("bad value"), False),
])
def test_what_counts_as_a_full_disk(error, full):
    assert is_no_space(error) is full
    try:
        raise RuntimeError("while saving") from error
    except RuntimeError as wrapped:
        assert is_no_space(wrapped) is full


def test_a_serialiser_stream_error_is_a_full_disk_only_on_a_nearly_full_device(tmp_path, monkeypatch):
    """torch's writer reports a full disk at a few KB free as a bare C++ stream error; the same text with room left
    is some other failure and keeps its own traceback."""
    from pipelines.training import disk_full

    stream = RuntimeError("basic_ios::clear: iostream error")
    assert not is_no_space(stream) and not is_no_space(stream, tmp_path), "this folder's device has room"
    monkeypatch.setattr(disk_full, "NEARLY_FULL_BYTES", shutil.disk_usage(tmp_path).free + 1)
    assert is_no_space(stream, tmp_path / "not" / "yet" / "made") and not is_no_space(ValueError("x"), tmp_path)
    with (pytest.raises(disk_full.NoSpaceError, match="No space left on the device of output_dir="),
          disk_full.no_space_reported(tmp_path)):
        raise RuntimeError("[enforce fail at inline_container.cc:603] . unexpected pos 64 vs 0")
