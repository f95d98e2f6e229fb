"""`python -m pipelines.serve` as a test's real process, stopped however the test ends."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from helpers.bad_inputs import ROOT


@contextlib.contextmanager
def serve_entry_point(command: list[str], env: dict[str, str], log: Path,
                      start_timeout_s: float = 240) -> Iterator[tuple[subprocess.Popen, str]]:
    """Start `command` (its output in `log`) and wait for its "Serving ..." line; yield (process, that line).

    At the end, also when the start fails or a test raises, the process gets SIGINT (its clean shutdown, which stops
    the Ray it started); one still running after 120 s is killed with its whole process group, so that a failed start
    cannot leave a Ray cluster running after the session. The caller checks the exit status after the block.
    """
    with open(log, "wb") as sink:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        yield proc, _wait_for_serving(proc, log, start_timeout_s)
    finally:
        _stop(proc)


def _wait_for_serving(proc: subprocess.Popen, log: Path, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while not (line := re.search(r"^Serving .*$", log.read_text(errors="replace"), re.M)):
        assert proc.poll() is None, f"the server exited: {log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"the server did not start: {log.read_text()[-3000:]}"
        time.sleep(1)
    return line.group(0)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
