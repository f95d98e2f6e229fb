"""The end of a sweep says what tracking left for later: operations per trial folder, the sweep's own run, and the
sync command; then the champions to promote once synced."""

from __future__ import annotations

from pathlib import Path

from pipelines.sweeps.config import load_sweep_config
from pipelines.sweeps.leftover import leftover_lines, spooled_operations
from pipelines.sweeps.run import hold_sweep_folder
from pipelines.tracking.spool import FAILED_FILE, PENDING_FILE, Spool
from pipelines.tracking.sweep_run import SWEEP_CLOSE_FILE, SweepClose, keep_for_sync

ROOT = Path(__file__).resolve().parents[3]
TEMPORARY_SERVER = "http://127.0.0.1:23456"


def _sweep(storage: str):
    return load_sweep_config(ROOT / "pipelines/configs/smoke.yaml", [f"storage_path={storage}", "name=left"])


def _spool(folder: Path, name: str, count: int) -> None:
    for step in range(count):
        Spool(folder / name).append({"op": "metrics", "run_id": "r1", "metrics": {"loss": 1.0}, "step": step,
                                     "tracking_uri": TEMPORARY_SERVER})


def test_nothing_spooled_leaves_nothing_to_say(tmp_path):
    sweep = _sweep(str(tmp_path))
    (tmp_path / "left" / "jobs" / "rte-tiny-t5-capt-s0-0a1b2c").mkdir(parents=True)
    _spool(tmp_path / "left" / "jobs" / "cb-tiny-t5-capt-s0-3d4e5f", PENDING_FILE, 0)
    assert spooled_operations(sweep) == {} and leftover_lines(sweep, TEMPORARY_SERVER, True) == []


def test_spooled_operations_are_counted_per_trial_with_the_command_that_uploads_them(tmp_path):
    sweep, jobs = _sweep(str(tmp_path)), tmp_path / "left" / "jobs"
    _spool(jobs / "rte-tiny-t5-capt-s0-0a1b2c", PENDING_FILE, 5)
    _spool(jobs / "cb-minilm-capt-s0-3d4e5f", PENDING_FILE, 2)
    _spool(jobs / "cb-minilm-capt-s0-3d4e5f", FAILED_FILE, 1)
    (jobs / "rte-tiny-t5-capt-s0-0a1b2c" / PENDING_FILE).open("ab").write(b'{"op": "metr')  # a torn last line
    assert spooled_operations(sweep) == {"cb-minilm-capt-s0-3d4e5f": 2, "rte-tiny-t5-capt-s0-0a1b2c": 6}
    local = leftover_lines(sweep, TEMPORARY_SERVER, local_server=True)
    assert local[0] == (f"Not fully tracked: 8 operations of 2 trials wait in their folders ({PENDING_FILE}) for "
                        "the MLflow server:")
    assert local[1:3] == ["  cb-minilm-capt-s0-3d4e5f: 2", "  rte-tiny-t5-capt-s0-0a1b2c: 6"]
    assert local[3] == (f"Upload them once the server answers: `make mlflow-ui`, then `python -m pipelines.tracking "
                        f"sync --root {tmp_path / 'left'} --tracking-uri http://127.0.0.1:5000 --moved-from "
                        f"{TEMPORARY_SERVER}`")
    assert local[4].startswith("Refused by the server and set aside: 1 operation of 1 trial (")
    remote = leftover_lines(sweep, "http://mlflow.internal:5000", local_server=False)
    assert remote[3].endswith(f"`python -m pipelines.tracking sync --root {tmp_path / 'left'}`")


def test_remote_storage_has_no_local_folders_to_count_or_lock(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sweep = _sweep("s3://bucket/sweeps")
    with hold_sweep_folder(sweep):
        assert spooled_operations(sweep) == {}
    assert list(tmp_path.iterdir()) == [], "no folder named after the URI appears in the working directory"


def test_a_sweep_run_the_server_did_not_close_is_named_with_the_sync_then_the_promotions_left(tmp_path):
    sweep, folder = _sweep(str(tmp_path)), tmp_path / "left"
    folder.mkdir()
    keep_for_sync(folder, SweepClose("0123456789abcdef0123456789abcdef", TEMPORARY_SERVER, "FINISHED", {},
                                     promote=[["google-t5/t5-base", "rte"], ["tiny-t5", "cb"]]))
    lines = leftover_lines(sweep, TEMPORARY_SERVER, local_server=True)
    assert lines[0] == ("The sweep's run 0123456789abcdef0123456789abcdef is not closed: the MLflow server did not "
                        f"take its status FINISHED, summary and description, kept in {folder / SWEEP_CLOSE_FILE}. "
                        f"Close it once the server answers: `make mlflow-ui`, then `python -m pipelines.tracking sync "
                        f"--root {folder} --tracking-uri http://127.0.0.1:5000 --moved-from {TEMPORARY_SERVER}`.")
    assert lines[1:] == [
        "Left to do once it is closed: the MLflow server was down when the sweep ended, so it could not promote its "
        "champions. Run:",
        "  python -m pipelines.promote --model google-t5/t5-base --task rte --tracking-uri http://127.0.0.1:5000",
        "  python -m pipelines.promote --model tiny-t5 --task cb --tracking-uri http://127.0.0.1:5000"]
    _spool(folder / "jobs" / "rte-tiny-t5-capt-s0-0a1b2c", PENDING_FILE, 1)
    remote = leftover_lines(sweep, "http://mlflow.internal:5000", local_server=False)
    assert remote[3].endswith("Close it once the server answers: the same sync.")
    assert remote[-1].endswith("--task cb --tracking-uri http://mlflow.internal:5000")
