"""What ``python -m pipelines.tracking sync`` may touch: which folders, and which servers' operations.

Folders: the root must be a job or sweep folder tree. A job folder holds one of `JOB_MARKERS` (the job's
``job_config.json`` or ``result.json``, see `pipelines.training.outputs`, or a tracking file of this package); a
sweep folder (``<storage_path>/<name>``) holds Tune's ``tuner.pkl``, and its jobs are in ``jobs/<trial>/``. A root
is accepted when it, or a folder at most `MARKER_DEPTH` levels below it, is one of these: a job folder, a sweep
folder, its ``jobs/``, ``outputs/sweeps`` or ``outputs``. A filesystem root, the home folder and any folder above
it are refused outright, before anything is read. The walk never follows a symbolic link (the links it met are
reported), so it never leaves the root.

Servers: each spooled operation records the tracking URI it was written for (``tracking_uri``). `ServerScope`
says where an operation goes, or that it is left alone: a sync given ``--tracking-uri`` replays only operations
recorded for that server (URIs compared by `normalised_uri`), plus those of servers named with ``--moved-from``;
an operation recorded for no server (a hand-written or foreign spool) is replayed only when the user accepted
it. Needs no mlflow.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pipelines.tracking.spool import FAILED_FILE, PENDING_FILE, RUN_FILE

JOB_MARKERS = frozenset({"job_config.json", "result.json", RUN_FILE, PENDING_FILE, FAILED_FILE})
"""Files of a job's output folder (`pipelines.training.outputs`: CLAIM_FILE, RESULT_FILE) and its tracking files."""
SWEEP_MARKERS = frozenset({"tuner.pkl"})
"""Files of a sweep folder: Tune's state, written when the sweep starts."""
MARKER_DEPTH = 2
"""How far below the root a job or sweep folder may be for the root to be accepted."""
_DEFAULT_PORTS = {"http": 80, "https": 443}


def normalised_uri(uri: str) -> str:
    """`uri` as compared between a spool and a sync: scheme and host in lower case, no default port, no user
    info, no trailing slash. Other schemes (``sqlite:``, ``file:``, ``databricks``) only lose the slash."""
    text = uri.strip()
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS:
        return text.rstrip("/")
    try:
        port = parts.port
    except ValueError:
        return text.rstrip("/")
    host = (parts.hostname or "").lower()
    host = f"[{host}]" if ":" in host else host
    netloc = host if port in (None, _DEFAULT_PORTS[scheme]) else f"{host}:{port}"
    return urlunsplit((scheme, netloc, parts.path.rstrip("/"), parts.query, ""))


def same_server(a: str, b: str) -> bool:
    return normalised_uri(a) == normalised_uri(b)


@dataclass(frozen=True)
class ServerScope:
    """Where a replay sends each operation, by the server recorded with it; None: it is left pending."""

    target: str | None = None
    """The server every accepted operation goes to; None: each goes to the server recorded with it."""
    moved_from: tuple[str, ...] = ()
    """Servers whose operations are also accepted and sent to `target` (the same server at a new address)."""
    unrecorded: str | None = None
    """Where an operation recorded for no server goes; None: it is not replayed."""

    def destination(self, op: Mapping[str, Any]) -> str | None:
        """The server `op` goes to, or None when this scope leaves it alone."""
        recorded = op.get("tracking_uri")
        if not recorded:
            return self.unrecorded
        if self.target is None:
            return str(recorded)
        accepted = (self.target, *self.moved_from)
        return self.target if any(same_server(str(recorded), uri) for uri in accepted) else None

    def refusal(self, ops: Iterable[Mapping[str, Any]]) -> str | None:
        """Why a folder's spool is left whole (some operation of it is not for this scope); None: replay it.

        A spool is an ordered log: it is replayed entirely or not at all.
        """
        left = [op for op in ops if self.destination(op) is None]
        unrecorded = sum(1 for op in left if not op.get("tracking_uri"))
        foreign = sorted({str(op["tracking_uri"]) for op in left if op.get("tracking_uri")})
        reasons = []
        if foreign:
            reasons.append(f"{len(left) - unrecorded} operation(s) recorded for {', '.join(foreign)}, not "
                           f"{self.target} (sync them with --tracking-uri {foreign[0]}, or add --moved-from "
                           f"{foreign[0]} if that server now answers at {self.target})")
        if unrecorded:
            reasons.append(f"{unrecorded} operation(s) recorded for no server (replay them with --accept-unrecorded "
                           "and --tracking-uri, once sure they belong there)")
        return "; ".join(reasons) or None


def has_marker(root: Path) -> bool:
    """Whether `root` or a folder at most `MARKER_DEPTH` levels below it holds a job or sweep marker as a regular
    file (links are neither followed nor counted)."""
    for folder, dirs, files in os.walk(root):
        if any((Path(folder) / name).is_file() and not (Path(folder) / name).is_symlink()
               for name in files if name in JOB_MARKERS | SWEEP_MARKERS):
            return True
        if len(Path(folder).relative_to(root).parts) >= MARKER_DEPTH:
            dirs.clear()
    return False


def state_dirs(root: Path, names: Iterable[str] = (PENDING_FILE, FAILED_FILE)) -> tuple[list[Path], list[Path]]:
    """(folders under `root`, itself included, holding one of `names` as a regular file; the symbolic links met
    that could lead to one: links to folders and links named like one of `names`), both sorted. No link is
    followed."""
    wanted, found, links = set(names), set(), set()
    for folder, dirs, files in os.walk(root, followlinks=False):
        here = Path(folder)
        for name in dirs + [f for f in files if f in wanted]:
            if (here / name).is_symlink():
                links.add(here / name)
            elif name in wanted:
                found.add(here)
    return sorted(found), sorted(links)
