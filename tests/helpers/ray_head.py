"""`LocalRayHead`: a single-node Ray head started with the ``ray`` script, and its stragglers' finder."""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Self

from pipelines.services.mlflow_server import ManagedService
from pipelines.services.private import RAY_LOOPBACK_ENV
from pipelines.services.probe import (
    LOCALHOST,
    POLL_INTERVAL_S,
    ServiceError,
    free_port,
    http_status,
    log_tail,
    port_is_free,
    process_group_alive,
    stop_process_group,
)
from pipelines.serving.exposure import node_env

logger = logging.getLogger(__name__)

_PORT_TAKEN = ("address already in use", "already occupied")
"""How `ray start` says another process bound a port first (the socket's error; Ray's own check of the dashboard's)."""


def ray_cluster_stragglers(gcs_port: int) -> list[int]:
    """Pids outside the head's group that use the Ray cluster on ``gcs_port`` (Linux; [] elsewhere).

    Ray starts job drivers in sessions of their own; they carry ``RAY_ADDRESS=<ip>:<gcs_port>``.
    Daemons name the GCS in ``--gcs-address=``/``--address=``. This process and its parent are skipped.
    """
    if not Path("/proc").is_dir():
        return []
    suffix, skip, found = f":{gcs_port}".encode(), {os.getpid(), os.getppid()}, []
    keys = (b"RAY_ADDRESS=", b"--gcs-address=", b"--address=")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in skip:
            continue
        try:
            items = [
                *(entry / "environ").read_bytes().split(b"\0"),
                *(entry / "cmdline").read_bytes().split(b"\0"),
            ]
        except OSError:
            continue
        if any(item.startswith(keys) and item.endswith(suffix) for item in items):
            found.append(int(entry.name))
    return found


def _ray_executable() -> str:
    """The ``ray`` script of this interpreter's environment (else the one on PATH)."""
    beside = Path(sys.executable).with_name("ray")
    found = str(beside) if beside.is_file() else shutil.which("ray")
    if found is None:
        raise ServiceError("The `ray` command is not installed: pip install 'ray[default,train,tune]'.")
    return found


class LocalRayHead(ManagedService):
    """A single-node Ray head (``ray start --head``) with its dashboard and job API on 127.0.0.1.

    ``address`` is the GCS address (``RAY_ADDRESS``, ``ray.init(address=...)``); ``dashboard_url``
    the job API (``ray job submit --address``). Unset ports are picked free (pass ``dashboard_port=8265``
    for Ray's usual one), so heads can start side by side. ``python`` in job entrypoints is this venv's.
    :meth:`stop` stops only THIS head: its daemons share the process group of ``ray start`` (run in a
    new session), and its job drivers are found by ``RAY_ADDRESS``; ``ray stop --force`` would kill
    every Ray on the machine. Every port of the head (GCS, raylet, dashboard, agents, workers) listens
    on 127.0.0.1 only (``RAY_LOOPBACK_ENV``): nothing on another machine can reach it.

    ``auth_mode`` is always explicit, because Ray 2.60 silently turns token auth on when
    ``~/.ray/auth_token`` exists (any local ``ray.init()`` creates one) and clients then fail with 401.
    ``"token"`` writes a fresh token to a private file; give clients :meth:`client_env`.

    ``include_dashboard=False`` starts no dashboard (no job API, no state API: Ray Train's controller and
    ``ray job submit`` need it): for a head that only Tune trials of one worker use, it saves the dashboard's start
    and its steady polling; the head is ready once ``ray start`` succeeded.
    """

    def __init__(
        self, num_cpus: int | None = None, port: int | None = None, dashboard_port: int | None = None,
        temp_dir: str | os.PathLike[str] | None = None, startup_timeout: float = 120.0,
        auth_mode: str = "disabled", include_dashboard: bool = True,
    ) -> None:  # fmt: skip
        if auth_mode not in ("disabled", "token"):
            raise ValueError(f"auth_mode must be 'disabled' or 'token', got {auth_mode!r}")
        self.auth_mode = auth_mode
        self.include_dashboard = include_dashboard
        self.token_path: Path | None = None
        self.num_cpus = num_cpus
        self._picks_ports = port is None and dashboard_port is None
        self.port = port if port is not None else free_port()
        self.dashboard_port = dashboard_port if dashboard_port is not None else free_port()
        self.temp_dir = Path(temp_dir).resolve() if temp_dir is not None else None
        self._own_temp_dir = temp_dir is None
        self.startup_timeout = startup_timeout
        self._pgid: int | None = None
        self._launcher: subprocess.Popen[str] | None = None
        self._ready = False

    @property
    def address(self) -> str:
        """GCS address, e.g. ``127.0.0.1:6379``."""
        return f"{LOCALHOST}:{self.port}"

    @property
    def dashboard_url(self) -> str:
        """Dashboard and job API, e.g. ``http://127.0.0.1:8265``."""
        return f"http://{LOCALHOST}:{self.dashboard_port}"

    def client_env(self) -> dict[str, str]:
        """Variables for this head's clients (``ray job submit``, ``ray.init``): merge into their env.

        Auth, and ``RAY_LOOPBACK_ENV``: without it ``ray.init`` turns the address 127.0.0.1 into the
        machine's address, where this head does not listen.
        """
        env = {"RAY_AUTH_MODE": self.auth_mode, **RAY_LOOPBACK_ENV}
        return env | ({"RAY_AUTH_TOKEN_PATH": str(self.token_path)} if self.token_path is not None else {})

    def _write_token(self) -> None:
        """Create a random cluster token in a private directory (token mode only)."""
        self.token_path = Path(tempfile.mkdtemp(prefix="capt-ray-auth-")) / "auth_token"
        self.token_path.write_text(secrets.token_hex(32))
        self.token_path.chmod(0o600)

    @property
    def running(self) -> bool:
        """True after :meth:`start` while the head's daemons live."""
        return self._pgid is not None and process_group_alive(self._pgid)

    def command(self) -> list[str]:
        """The ``ray start --head`` command line."""
        cmd = [
            _ray_executable(), "start", "--head", "--disable-usage-stats",
            "--node-ip-address", LOCALHOST, "--port", str(self.port),
            "--dashboard-host", LOCALHOST, "--dashboard-port", str(self.dashboard_port),
            "--include-dashboard", str(self.include_dashboard).lower(), "--ray-client-server-port", str(free_port()),
            "--dashboard-agent-listen-port", str(free_port()),
        ]  # fmt: skip
        if self.num_cpus is not None:
            cmd += ["--num-cpus", str(self.num_cpus)]
        return cmd + (["--temp-dir", str(self.temp_dir)] if self.temp_dir is not None else [])

    def _make_temp_dir(self) -> None:
        """A temp dir of this head's own: Ray's job supervisor resolves the driver's RAY_ADDRESS from
        ``<temp dir>/ray_current_cluster``, so heads sharing /tmp/ray would send drivers to the wrong one.
        Kept short: Ray's unix sockets live below it (107-byte path limit)."""
        base = "/tmp" if Path("/tmp").is_dir() else None
        self.temp_dir = Path(tempfile.mkdtemp(prefix="capt-ray-", dir=base))

    def start(self, wait: bool = True) -> Self:
        """Launch ``ray start --head``; with ``wait``, block until the job API answers."""
        if self._pgid is not None:
            return self.wait_ready() if wait else self
        for port in (self.port, self.dashboard_port):
            if not port_is_free(LOCALHOST, port):
                raise ServiceError(f"Cannot start a Ray head: port {port} is in use; pick another one.")
        if self.auth_mode == "token" and self.token_path is None:
            self._write_token()
        if self._own_temp_dir and self.temp_dir is None:
            self._make_temp_dir()
        env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN")}
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        env |= self.client_env() | node_env()  # as infra/README.md starts a node that serves: h11 in Serve's proxy
        logger.info("starting Ray head at %s (dashboard %s)", self.address, self.dashboard_url)
        self._launcher = subprocess.Popen(
            self.command(), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
        )  # fmt: skip
        self._pgid = self._launcher.pid
        return self.wait_ready() if wait else self

    def wait_ready(self, retries: int = 2) -> Self:
        """Wait for ``ray start`` to succeed, then for ``/api/version`` to answer (401: token auth on).

        Ports this head picked itself are picked again, up to ``retries`` times, when another
        process binds one of them first (the pick and Ray's bind are seconds apart).
        """
        if self._ready:
            return self
        if self._launcher is None:
            raise ServiceError(f"The Ray head at {self.address} was not started: call start() first.")
        launcher, self._launcher = self._launcher, None
        try:
            output, _ = launcher.communicate(timeout=self.startup_timeout)
        except subprocess.TimeoutExpired:
            output = f"(no answer within {self.startup_timeout:.0f} s)"
        if launcher.returncode != 0:
            self.stop()
            if self._picks_ports and any(taken in output.lower() for taken in _PORT_TAKEN) and retries > 0:
                logger.warning("a port of the Ray head was taken while it started; retrying on other ports")
                self.port, self.dashboard_port = free_port(), free_port()
                return self.start(wait=False).wait_ready(retries - 1)
            tail = "\n".join(output.splitlines()[-30:])
            raise ServiceError(f"`ray start --head` failed (exit code {launcher.returncode}):\n{tail}")
        if not self.include_dashboard:  # `ray start` returned once the GCS and the raylet were up
            self._ready = True
            return self
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if http_status(f"{self.dashboard_url}/api/version", timeout=1.0) in (200, 401, 403):
                self._ready = True
                logger.info("Ray head ready at %s", self.address)
                return self
            time.sleep(POLL_INTERVAL_S)
        logs = log_tail(self.temp_dir / "session_latest" / "logs" / "dashboard.log") if self.temp_dir else ""
        self.stop()
        raise ServiceError(
            f"The Ray dashboard at {self.dashboard_url} did not answer within {self.startup_timeout:.0f} s. "
            f"Is ray[default] installed (the dashboard and job API need it)? Dashboard log:\n{logs}"
        )

    def stop(self, grace: float = 2.0) -> None:
        """Stop this head's daemons (SIGTERM, SIGKILL after ``grace`` s), then its job drivers."""
        if self._pgid is not None:
            stop_process_group(self._pgid, grace, child=self._launcher)
            for pid in ray_cluster_stragglers(self.port):
                try:
                    pgid = os.getpgid(pid)
                    os.killpg(pgid, signal.SIGKILL) if pgid != os.getpgrp() else os.kill(pid, signal.SIGKILL)
                    logger.info("killed process %d left over from the Ray head on port %d", pid, self.port)
                except ProcessLookupError:
                    continue
            logger.info("Ray head at %s stopped", self.address)
        self._pgid, self._launcher, self._ready = None, None, False
        self._remove_private_files()

    def _remove_private_files(self) -> None:
        """Delete the token and the temp dir this head created (not a temp dir the caller gave)."""
        if self.token_path is not None:
            shutil.rmtree(self.token_path.parent, ignore_errors=True)
            self.token_path = None
        if self._own_temp_dir and self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
            self.temp_dir = None
