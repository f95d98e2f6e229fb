"""No orphans: what an entry point started dies with it, even when the entry point is SIGKILLed.

A sweep starts a local MLflow server (which starts uvicorn) and a local Ray (a dozen daemons and agents, some
started by other daemons). When the driver exits normally its `with` blocks stop them; when it is killed
nothing runs in it any more, and those processes live on for a minute or for ever. `reap_on_death` marks the
block's processes with an environment variable every process started from it inherits (`REAP_ENV`, a fresh
token), and starts a small watcher in a session of its own (so a kill of the driver's process group spares it)
that learns of the driver's death from the end of a pipe only the driver holds, then terminates every process
carrying the token (SIGTERM, then SIGKILL after `GRACE_S`). A parent-death signal (`PR_SET_PDEATHSIG`)
would reach only direct children, a process group only those that stay in it (the MLflow server and Ray's
daemons start sessions of their own), and a list of descendants loses those reparented before it was read.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from typing import BinaryIO

import psutil

REAP_ENV = "CAPT_REAP_TOKEN"
"""The variable that marks the processes started in a `reap_on_death` block."""
GRACE_S = 5.0
"""How long the orphans get to exit on SIGTERM before SIGKILL."""
_DONE = b"done\n"
_THIS_FILE = os.path.abspath(__file__)
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(_THIS_FILE)))


@contextlib.contextmanager
def reap_on_death() -> Iterator[None]:
    """For the block: if this process dies, whatever it started in the block is terminated within seconds."""
    token, before = secrets.token_hex(8), os.environ.get(REAP_ENV)
    # this file run by its path, isolated (-I: no script folder or PYTHONPATH on sys.path): the watcher imports
    # psutil alone, not the `pipelines` packages that `-m` would import first (half a second of CPU per command)
    watcher = subprocess.Popen([sys.executable, "-I", _THIS_FILE, token], stdin=subprocess.PIPE,
                               start_new_session=True, cwd=_ROOT,
                               env={k: v for k, v in os.environ.items() if k != REAP_ENV})
    os.environ[REAP_ENV] = token
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(REAP_ENV, None)
        else:
            os.environ[REAP_ENV] = before
        with contextlib.suppress(OSError):
            watcher.stdin.write(_DONE)
            watcher.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            watcher.wait(10)


def watch(token: str, commands: BinaryIO) -> list[int]:
    """Wait for "done" (a normal end: nothing to do) or the end of `commands` (the driver died: reap): SIGTERM the
    live processes whose environment carries `token`, SIGKILL those that outlive `GRACE_S`; their pids."""
    if commands.readline() == _DONE:
        return []
    marked = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if process.pid != os.getpid() and process.environ().get(REAP_ENV) == token:
                marked.append(process)
    for process in marked:
        with contextlib.suppress(psutil.Error):
            process.terminate()
    _, left = psutil.wait_procs(marked, timeout=GRACE_S)
    for process in left:
        with contextlib.suppress(psutil.Error):
            process.kill()
    return [process.pid for process in marked]


if __name__ == "__main__":
    watch(sys.argv[1], sys.stdin.buffer)
