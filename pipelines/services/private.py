"""What keeps a local service private to its user: owner-only files and folders, and loopback listeners."""

from __future__ import annotations

import ipaddress
import os
import secrets
import tempfile
from pathlib import Path

import psutil

_OTHERS = 0o077  # group and world permission bits

# Ray resolves a node IP of 127.0.0.1 to the machine's address unless this is off (the switch is meant for
# single-node Ray on Windows and macOS). With it off in the environment of `ray start` or of the driver
# that starts a local Ray, every daemon, agent and worker of that single-node Ray listens on 127.0.0.1.
RAY_LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def _owner_only(path: Path, mode: int) -> None:
    """chmod ``path`` to ``mode`` when group or others have any access; one clear error when that fails."""
    if path.stat().st_mode & _OTHERS == 0:
        return
    try:
        path.chmod(mode)
    except OSError as err:
        raise RuntimeError(
            f"{path} is open to other users and cannot be made private ({err.strerror}). Run "
            f"`chmod {mode:o} {path}` as its owner, or point RAY_AUTH_TOKEN_PATH / TMPDIR elsewhere."
        ) from err


def private_ray_token_file() -> Path | None:
    """The token file a local Ray reads, created (random, mode 600) when missing or empty and made
    owner-only when it is not; None when ``RAY_AUTH_TOKEN`` holds the token itself.

    Ray reads ``RAY_AUTH_TOKEN``, else the file ``RAY_AUTH_TOKEN_PATH``, else ``~/.ray/auth_token``.
    Ray writes that last file itself with the default umask (world-readable, 644), and generates it
    only at the default path, so a ``RAY_AUTH_TOKEN_PATH`` that does not exist yet is created here.
    """
    if os.environ.get("RAY_AUTH_TOKEN"):
        return None
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token").expanduser()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        _owner_only(path, 0o600)
        if path.stat().st_size > 0:
            return path
        handle = os.open(path, os.O_WRONLY | os.O_TRUNC)
    with os.fdopen(handle, "w") as token_file:
        token_file.write(secrets.token_hex(32))
    return path


def private_temp_dir(name: str) -> Path:
    """``<system temp>/<name>-<uid>``, created mode 700 (or made so): the parent that keeps other users
    out of the folders a program makes below it open to all (Ray makes its temp dir and sessions 777)."""
    path = Path(tempfile.gettempdir()) / f"{name}-{os.getuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    if path.is_symlink() or path.stat().st_uid != os.getuid():
        raise RuntimeError(
            f"{path} belongs to another user (or is a link); it cannot hold private files. "
            "Remove it, or set TMPDIR to a folder of your own."
        )
    _owner_only(path, 0o700)
    return path


def is_loopback(ip: str) -> bool:
    """True for 127.0.0.0/8, ::1 and IPv4-mapped loopback (``::ffff:127.0.0.1``)."""
    address = ipaddress.ip_address(ip.split("%")[0])
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def process_tree(root_pid: int) -> list[psutil.Process]:
    """``root_pid`` and every descendant still alive ([] when ``root_pid`` is gone)."""
    try:
        root = psutil.Process(root_pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def listening_sockets(root_pid: int) -> list[tuple[str, int, str]]:
    """(ip, port, process name) of every TCP socket listening in ``root_pid`` and its descendants."""
    found = []
    for process in process_tree(root_pid):
        try:
            name = process.name()
            connections = process.net_connections(kind="tcp")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        found += [(c.laddr.ip, c.laddr.port, name) for c in connections if c.status == psutil.CONN_LISTEN]
    return sorted(set(found), key=lambda entry: (entry[2], entry[1]))


def open_to_the_network(root_pid: int) -> list[tuple[str, int, str]]:
    """The sockets of :func:`listening_sockets` that are not on a loopback address."""
    return [entry for entry in listening_sockets(root_pid) if not is_loopback(entry[0])]
