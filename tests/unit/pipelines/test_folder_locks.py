"""One writer per folder: a sweep's folder, a local MLflow store and a job's folder each refuse a second
holder at once, naming the first (pid, host, start time, command line); a killed holder leaves nothing locked; an
exclusive section waits for the process inside to leave."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from helpers.bad_inputs import ROOT, call_entry

from pipelines.services import LocalMlflowServer
from pipelines.services.folder_lock import FolderInUse, current_holder, exclusive, held_folder
from pipelines.services.mlflow_server import STORE_LOCK_FILE
from pipelines.services.probe import ServiceError
from pipelines.sweeps.run import SWEEP_LOCK_FILE

HOLDER = f"pid {os.getpid()} on {socket.gethostname()}, since "


def test_a_second_claim_is_refused_naming_the_first_until_it_lets_go(tmp_path):
    lock = tmp_path / "deep" / "folder.lock"
    with held_folder(lock):
        with pytest.raises(FolderInUse) as err, held_folder(lock):
            pass
        assert err.value.holder.startswith(HOLDER)
        started = time.monotonic()
        with pytest.raises(FolderInUse), held_folder(lock, wait_s=0.6):
            pass
        assert time.monotonic() - started >= 0.6, "wait_s waits for the holder before refusing"
    with held_folder(lock):
        pass


def test_a_killed_holder_leaves_the_folder_free(tmp_path):
    lock = tmp_path / "folder.lock"
    code = (f"import sys, time; sys.path.insert(0, {str(ROOT)!r})\n"
            "from pathlib import Path\nfrom pipelines.services.folder_lock import held_folder\n"
            f"with held_folder(Path({str(lock)!r})):\n    print('held', flush=True); time.sleep(60)\n")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(FolderInUse, match=f"pid {holder.pid} on "), held_folder(lock):
            pass
        named = current_holder(lock)
        assert named.startswith(f"pid {holder.pid} on ") and ", running `python" in named, named
        assert " -c 'import sys, time;" in named, named  # the holder's own command line, not this test's
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
    with held_folder(lock):
        pass


def test_an_exclusive_section_waits_for_the_other_process_to_leave_its_own(tmp_path):
    """`exclusive` (a spool's append or rewrite, a folder's replay) waits, it does not refuse: the second process
    enters once the first has left, never while it is inside."""
    lock, left = tmp_path / "deep" / "spool.lock", tmp_path / "left"
    code = (f"import sys, time; sys.path.insert(0, {str(ROOT)!r})\n"
            "from pathlib import Path\nfrom pipelines.services.folder_lock import exclusive\n"
            f"with exclusive(Path({str(lock)!r})):\n    print('inside', flush=True); time.sleep(1.0)\n"
            f"    Path({str(left)!r}).touch()\n")
    other = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline().strip() == "inside"
        with exclusive(lock):
            assert left.exists(), "entered while the other process was inside"
    finally:
        other.wait(10)
    with exclusive(tmp_path):  # a folder itself can be the lock: nothing is written into it
        assert sorted(p.name for p in tmp_path.iterdir()) == ["deep", "left"]


def test_a_local_mlflow_store_in_use_is_refused_before_a_server_starts(tmp_path):
    server = LocalMlflowServer(tmp_path)
    with held_folder(tmp_path / STORE_LOCK_FILE), pytest.raises(ServiceError) as err:
        server.start()
    # the holder is the command that started the server (here: this test), named by pid and command line
    assert f"The MLflow store {tmp_path} is in use: another command serves it" in str(err.value)
    assert f"and holds it ({HOLDER}" in str(err.value) and ", running `python" in str(err.value), str(err.value)
    assert "tracking.local_dir" in str(err.value) and not server.running and not (tmp_path / "mlflow.db").exists()
    server.stop()  # nothing to stop, and the refused claim holds nothing
    with held_folder(tmp_path / STORE_LOCK_FILE):
        pass


def test_a_second_driver_of_one_sweep_is_refused_before_ray_or_mlflow_start(tmp_path, capsys):
    folder = tmp_path / "sweeps" / "busy"
    args = ["--config", str(ROOT / "pipelines/configs/smoke.yaml"), "name=busy", f"storage_path={tmp_path / 'sweeps'}",
            f"tracking.local_dir={tmp_path / 'mlflow'}"]
    env = {**os.environ, "RAY_ADDRESS": "127.0.0.1:1"}  # a driver that went past the lock would fail differently
    with held_folder(folder / SWEEP_LOCK_FILE):
        done = call_entry("sweep", args, env, tmp_path, capsys)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"error: The sweep 'busy' in {folder} is being run by another driver ({HOLDER}" in done.stderr
    assert "--resume" in done.stderr and not (tmp_path / "mlflow").exists()
    assert sorted(p.name for p in folder.iterdir()) == [SWEEP_LOCK_FILE]


def test_a_local_store_remembers_the_addresses_it_was_served_at(tmp_path):
    from pipelines.services.mlflow_server import ADDRESSES_FILE

    server = LocalMlflowServer(tmp_path, port=23456)
    assert server.former_uris() == ()
    (tmp_path / ADDRESSES_FILE).write_text("http://127.0.0.1:21000\nhttp://127.0.0.1:23456\nhttp://127.0.0.1:21000\n"
                                           "http://127.0.0.1:22000\n")
    assert server.former_uris() == ("http://127.0.0.1:21000", "http://127.0.0.1:22000")
