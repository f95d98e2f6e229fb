"""The folders the pipeline writes into (a job's output folder, a sweep's storage folder, a local MLflow store):
checked before anything is written (`folder_problem`, `check_job_folder`), and locked between processes.

The locks are all one `flock` idiom: the kernel releases a lock when its holder dies, so
a killed holder never leaves anything locked.

- `held_folder`: one writer per folder (a job's output folder, a sweep's storage folder, a local MLflow store: two
  servers migrating one SQLite file break it). The holder's pid, host, start time and command line are written into
  the lock file so that a refusal can name them (the command says which of the user's commands it is).
- `exclusive`: a short critical section (a spool's append or rewrite, a folder's replay), waited for.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import socket
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from capt.errors import CaptError


class FolderInUse(Exception):
    """Raised inside `held_folder` when another process holds the lock; `holder` describes it."""

    def __init__(self, holder: str) -> None:
        super().__init__(holder)
        self.holder = holder


@contextlib.contextmanager
def held_folder(lock_file: Path, wait_s: float = 0.0,
                refusal: Callable[[str], Exception] | None = None) -> Iterator[None]:
    """Hold an exclusive lock on `lock_file` (its folder is created) for the block.

    Waits up to `wait_s` for another holder to let go, then raises `refusal(holder)` (default `FolderInUse`),
    where `holder` reads like "pid 12 on host-a, since 2026-12-02 16:09:43".
    """
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + wait_s
        while not _try_lock(fd):
            if time.monotonic() >= deadline:
                raise (refusal or FolderInUse)(lock_holder(lock_file)) from None
            time.sleep(0.5)  # how often a waiting claim tries the lock again
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S"),
                  "command": own_command()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder).encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


@contextlib.contextmanager
def exclusive(path: Path) -> Iterator[None]:
    """Wait for and hold an exclusive lock on `path` for the block: a lock file (created with its folder), or a
    folder itself (nothing is written into it)."""
    if path.is_dir():
        fd = os.open(path, os.O_RDONLY)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def current_holder(lock_file: Path) -> str | None:
    """Who holds `lock_file` now, or None; creates nothing (a check before a run that may fail early, which must
    leave no file behind)."""
    try:
        fd = os.open(lock_file, os.O_RDWR)
    except OSError:  # no lock file (or none we may open): nobody holds it
        return None
    try:
        if _try_lock(fd):
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        return lock_holder(lock_file)
    finally:
        os.close(fd)


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def lock_holder(lock_file: Path) -> str:
    """Who holds `lock_file`, as its holder wrote it down: "pid 12 on host-a, since 2026-12-02 16:09:43, running
    `python pipelines/sweep.py --config ...`"."""
    try:
        holder = json.loads(lock_file.read_text())
        said = f"pid {holder['pid']} on {holder['host']}, since {holder['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "its holder did not say who it is"
    command = holder.get("command")
    return said + (f", running `{command}`" if isinstance(command, str) and command else "")


def own_command(limit: int = 240) -> str:
    """This process's command line as a user would type it (`python -m pipelines.serve ...`), cut to `limit`
    characters (a sweep's overrides can be many): a pid alone does not tell a user which of their commands holds a
    folder, nor whether to stop it."""
    import psutil

    try:
        words = psutil.Process().cmdline()
    except psutil.Error:
        words = [sys.executable, *sys.argv]
    if words:
        words[0] = Path(words[0]).name  # "python", not the virtualenv's path
    text = shlex.join(words)
    return text if len(text) <= limit else text[:limit - 3] + "..."


# Checks of a folder before anything is written to it. Each names the key, the path as resolved (relative paths
# are taken against the current directory), and why it cannot be used: a file where a folder should be, a folder
# that cannot be created or written, a virtual file system, or (for a job's folder) a non-empty folder that holds no
# job, which the job would write into.

VIRTUAL_ROOTS = (Path("/proc"), Path("/sys"))
"""Kernel file systems: writable-looking, but nothing written there is kept."""
JOB_MARKERS = ("job_config.json", "result.json", "checkpoints", "artifact", "mlflow_run.json")
"""Names that make a folder a job's folder (its claim record, or outputs of a job from before claims existed,
which `pipelines.training.outputs` then judges by their config)."""


class OutputFolderError(CaptError, RuntimeError):
    """A folder the pipeline would write into cannot be used; the message names the key, the path and why."""


def folder_problem(key: str, path: str | os.PathLike[str]) -> str | None:
    """Why the folder `path` (given as `key`) cannot be created and written, or None."""
    folder = Path(path).expanduser().absolute()
    shown = f"{key}={str(path)!r}" + ("" if Path(path).is_absolute() else f" (resolved: {folder})")
    if any(folder == root or root in folder.parents for root in VIRTUAL_ROOTS):
        return f"{shown} is on a kernel file system ({folder.parts[1]}): nothing written there is kept"
    if folder.exists() and not folder.is_dir():
        return f"{shown} is a file, not a folder"
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    if not existing.is_dir():
        return f"{shown} cannot be created: {existing} is a file"
    if not os.access(existing, os.W_OK | os.X_OK):
        verb = "is not writable" if existing == folder else f"cannot be created: {existing} is not writable"
        return f"{shown} {verb} by this user"
    return None


def job_folder_problem(key: str, path: str | os.PathLike[str]) -> str | None:
    """`folder_problem`, and a non-empty folder that holds no job (the user's own files)."""
    if problem := folder_problem(key, path):
        return problem
    folder = Path(path).expanduser().absolute()
    if not folder.is_dir() or any((folder / marker).exists() for marker in JOB_MARKERS):
        return None
    entries = sorted(p.name for p in folder.iterdir() if p.name != "job.lock")
    if entries:
        shown = ", ".join(entries[:5]) + (f" and {len(entries) - 5} more" if len(entries) > 5 else "")
        return (f"{key}={str(path)!r} is a folder that holds no job but other files ({shown}); a job writes only "
                "into a new or empty folder, or its own")
    return None


def check_job_folder(key: str, path: str | os.PathLike[str]) -> None:
    """Raise `OutputFolderError` when the job folder `path` cannot be used."""
    if problem := job_folder_problem(key, path):
        raise OutputFolderError(f"{problem}. Give {key} another folder.")
