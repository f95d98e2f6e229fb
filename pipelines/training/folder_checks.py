"""Folders the pipeline writes into, checked before anything is written: a job's output folder, a sweep's storage
folder, a local MLflow store.

Each check names the key, the path as resolved (relative paths are taken against the current directory), and
why it cannot be used: a file where a folder should be, a folder that cannot be created or written, a virtual
file system, or (for a job's folder) a non-empty folder that holds no job, which the job would write into.
"""

from __future__ import annotations

import os
from pathlib import Path

from capt.errors import CaptError

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
