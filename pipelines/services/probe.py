"""Probes and process helpers: free ports, HTTP status, reachability checks, log tails, process groups."""

from __future__ import annotations

import logging
import os
import random
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

logger = logging.getLogger(__name__)

LOCALHOST = "127.0.0.1"
POLL_INTERVAL_S = 0.25


class ServiceError(RuntimeError):
    """A local service could not be started or reached; the message says what to do."""


_PORT_DRAW = random.SystemRandom()  # not the global generator: training seeds it, so processes would agree


def listen_port_range() -> tuple[int, int]:
    """Ports :func:`free_port` draws from: clear of Ray's worker ports and of the OS's ephemeral range.

    A port the OS hands out for ``bind(0)`` is also what it hands to the next outgoing connection
    or to a Ray daemon asking for any port, so a port picked that way can be gone by the time a
    server binds it seconds later. Ports outside the ephemeral range are only taken by listeners.
    """
    low, high = 20000, 32767  # above Ray's worker ports (10002-19999), below Linux's ephemeral range
    try:
        ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 49152  # IANA's dynamic range (macOS, Windows)
    return low, max(low + 1000, min(high, ephemeral_low - 1))


def free_port(host: str = LOCALHOST, attempts: int = 200) -> int:
    """A random TCP port in :func:`listen_port_range` that nothing on ``host`` listens on right now."""
    low, high = listen_port_range()
    for _ in range(attempts):
        port = _PORT_DRAW.randint(low, high)
        if port_is_free(host, port):
            return port
    raise ServiceError(f"No free TCP port on {host} in {low}-{high} after {attempts} tries.")


def port_is_free(host: str, port: int) -> bool:
    """True when nothing listens on ``host:port`` (a socket in TIME_WAIT does not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def http_get(url: str, timeout: float = 2.0, body_bytes: int = 0) -> tuple[int | None, str, bytes, str]:
    """(HTTP status, content type, the first ``body_bytes`` of the body, "") of a GET on ``url``, or
    (None, "", b"", why nothing answered: refused, timeout, DNS)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 (http only)
            return int(response.status), response.headers.get_content_type(), response.read(body_bytes), ""
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.headers.get_content_type() if exc.headers else "", exc.read(body_bytes), ""
    except urllib.error.URLError as exc:
        return None, "", b"", str(getattr(exc.reason, "strerror", None) or exc.reason)
    except OSError as exc:
        return None, "", b"", str(exc.strerror or exc)


def http_status(url: str, timeout: float = 2.0) -> int | None:
    """HTTP status of a GET on ``url``, or None when nothing answers (refused, timeout, DNS)."""
    return http_get(url, timeout)[0]


def log_tail(path: Path, offset: int = 0, lines: int = 30) -> str:
    """The last ``lines`` lines of a log file from byte ``offset`` on ("" when there is none)."""
    if not path.is_file():
        return ""
    with path.open("rb") as handle:
        handle.seek(offset)
        return "\n".join(handle.read().decode("utf-8", errors="replace").splitlines()[-lines:])


def _tcp_target(url: str) -> tuple[str, int] | None:
    """(host, port) of a non-HTTP network address (``host:port``, ``ray://host:port``), else None."""
    if "://" not in url:
        host, sep, port = url.rpartition(":")
        return (host, int(port)) if sep and host and port.isdigit() else None
    parts = urlsplit(url)
    return (parts.hostname, parts.port) if parts.hostname and parts.port else None


def check_reachable(url: str, what: str, fix: str | None = None, timeout: float = 3.0) -> None:
    """Probe ``url`` quickly; raise :class:`ServiceError` naming it, ``what`` it is and how to fix it.

    ``http(s)://`` URLs get a GET (any HTTP answer, 401 and 404 included, counts as reachable);
    ``host:port`` and other ``scheme://host:port`` addresses a TCP connect. Addresses without a
    network location (``sqlite:///...``, ``file:...``, ``auto``) are not probed. ``what`` reads like
    "MLflow tracking server (MLFLOW_TRACKING_URI)". Credentials in ``url`` never reach the message.
    """
    parts = urlsplit(url)
    shown = parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl() if "://" in url else url
    if parts.scheme in ("http", "https"):
        status, _, _, why = http_get(url, timeout)
        reachable, reason = status is not None, f"no HTTP answer: {why}"
    elif (target := _tcp_target(url)) is not None:
        try:
            with socket.create_connection(target, timeout=timeout):
                reachable, reason = True, ""
        except OSError as exc:
            reachable, reason = False, f"TCP connect failed: {exc.strerror or exc}"
    else:
        logger.debug("%s address %s has no network location; not probed", what, shown)
        return
    if not reachable:
        fix = fix or (
            "Start it, or correct the address (scheme, host and port). If it runs on another machine, "
            "forward its port first (`ssh -N -L PORT:127.0.0.1:PORT user@head` or `kubectl port-forward`) "
            "and use the forwarded 127.0.0.1 address."
        )
        raise ServiceError(f"Cannot reach the {what} at {shown} ({reason}). {fix}")


def process_group_alive(pgid: int) -> bool:
    """True while any process of group ``pgid`` exists."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def stop_process_group(pgid: int, grace: float, child: subprocess.Popen[Any] | None = None) -> None:
    """SIGTERM process group ``pgid``, SIGKILL what is left after ``grace`` s, wait until it is gone.

    ``child``, the group leader when it is our child, is reaped meanwhile (a zombie keeps a group).
    """
    for sig, wait_s in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait_s
        while process_group_alive(pgid) and time.monotonic() < deadline:
            if child is not None:
                child.poll()
            time.sleep(POLL_INTERVAL_S)
        if not process_group_alive(pgid):
            break
    if child is not None:
        child.wait(timeout=10.0)

