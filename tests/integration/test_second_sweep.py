"""A second sweep started on the storage and MLflow store of a running one (a second `make demo`) is refused, and
the refusal names the running sweep's driver, by pid and command line, whichever lock stops it: the local MLflow
store's (held from the moment the first driver starts its server) or the sweep folder's (held once its services
answer). Naming the MLflow server instead would invite the user to kill it and break the first sweep."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.bad_inputs import ROOT, entry_env

from pipelines.services.folder_lock import current_holder
from pipelines.services.mlflow_server import STORE_LOCK_FILE, recorded_addresses
from pipelines.sweeps.run import SWEEP_LOCK_FILE

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]
SWEEP = ["pipelines/sweep.py", "--config", "pipelines/configs/smoke.yaml", "name=busy", "tasks=[rte]",
         "models=[tiny-t5]", "data_source=generated", "job.train.max_steps=5000", "job.train.eval_every_steps=1000"]
"""One long trial: the first sweep is still running when the second one is started, twice."""


def _wait_for(what: str, first: subprocess.Popen, probe: Callable[[], bool], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        assert first.poll() is None, f"the first sweep ended before {what}: {first.stdout.read()[-4000:]}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _assert_refused_naming(args: list[str], env: dict[str, str], first: subprocess.Popen, *phrases: str) -> None:
    """The second sweep exits 2 with one `error:` paragraph holding one of `phrases`, naming the first driver."""
    second = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert second.returncode == 2 and "Traceback" not in second.stderr, second.stderr[-3000:]
    errors = [line for line in second.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and any(phrase in errors[0] for phrase in phrases), second.stderr[-3000:]
    assert f"pid {first.pid} on " in errors[0], errors[0]  # the first sweep's driver ...
    assert ", running `python" in errors[0] and f" {' '.join(args[:4])} " in errors[0], errors[0]  # its command


def test_a_second_sweep_is_refused_naming_the_running_sweeps_driver(tmp_path: Path) -> None:
    store, storage = tmp_path / "mlflow", tmp_path / "sweeps"
    args = [*SWEEP, f"storage_path={storage}", f"tracking.local_dir={store}"]
    env = entry_env()
    first = subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        in_use = f"The sweep 'busy' in {storage / 'busy'} is being run by another driver ("
        # while the first driver's MLflow server and Ray start, the store's lock stops the second one (unless the
        # first took its sweep lock meanwhile: the second takes seconds to check its config)
        _wait_for("the first driver's store lock", first,
                  lambda: (current_holder(store / STORE_LOCK_FILE) or "").startswith(f"pid {first.pid} "))
        _assert_refused_naming(args, env, first, f"The MLflow store {store} is in use: another command serves it",
                               in_use)
        _wait_for("the first driver's sweep lock", first,
                  lambda: (current_holder(storage / "busy" / SWEEP_LOCK_FILE) or "").startswith(f"pid {first.pid} "))
        _assert_refused_naming(args, env, first, in_use)
        assert len(recorded_addresses(store)) == 1, "a refused sweep started no MLflow server of its own"
    finally:
        if first.poll() is None:
            first.send_signal(signal.SIGTERM)  # its clean stop: trials, Ray and its MLflow server end with it
            try:
                first.communicate(timeout=180)
            except subprocess.TimeoutExpired:
                os.killpg(first.pid, signal.SIGKILL)
                first.wait()
