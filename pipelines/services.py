"""Local MLflow and Ray services as subprocesses, and an early reachability probe for entry points.

Nothing here imports mlflow or ray: the services start through the command-line tools next to this
interpreter (``sys.executable -m mlflow``, the ``ray`` script), each in its own process group, so
that stopping one never touches another MLflow or Ray on the same machine.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self
from urllib.parse import urlsplit

logger = logging.getLogger(__name__)

LOCALHOST = "127.0.0.1"
_POLL_S = 0.25


class ServiceError(RuntimeError):
    """A local service could not be started or reached; the message says what to do."""


def free_port(host: str = LOCALHOST) -> int:
    """A TCP port free on ``host`` right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_is_free(host: str, port: int) -> bool:
    """True when nothing listens on ``host:port`` (a socket in TIME_WAIT does not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def _http_get(url: str, timeout: float) -> tuple[int | None, str]:
    """(HTTP status, "") of a GET on ``url``, or (None, why nothing answered)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 (http only)
            return int(response.status), ""
    except urllib.error.HTTPError as exc:
        return int(exc.code), ""
    except urllib.error.URLError as exc:
        return None, str(getattr(exc.reason, "strerror", None) or exc.reason)
    except OSError as exc:
        return None, str(exc.strerror or exc)


def http_status(url: str, timeout: float = 2.0) -> int | None:
    """HTTP status of a GET on ``url``, or None when nothing answers (refused, timeout, DNS)."""
    return _http_get(url, timeout)[0]


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
        status, why = _http_get(url, timeout)
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


def _group_alive(pgid: int) -> bool:
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
        while _group_alive(pgid) and time.monotonic() < deadline:
            if child is not None:
                child.poll()
            time.sleep(_POLL_S)
        if not _group_alive(pgid):
            break
    if child is not None:
        child.wait(timeout=10.0)


class _Service:
    """What both services share: ``start(wait=False)`` then ``wait_ready()`` lets several start at
    once; ``with Service(...) as s:`` starts, waits and stops."""

    def start(self, wait: bool = True) -> Self:
        """Launch the service; with ``wait``, also :meth:`wait_ready`."""
        raise NotImplementedError

    def wait_ready(self) -> Self:
        """Block until the launched service answers; stop it and raise ServiceError if it cannot."""
        raise NotImplementedError

    def stop(self) -> None:
        """Stop the service; a no-op when it is not running."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class LocalMlflowServer(_Service):
    """A lean MLflow tracking server on SQLite, bound to ``host`` (127.0.0.1 by default).

    Under ``root_dir``: ``mlflow.db`` (runs and Model Registry), ``artifacts/`` and
    ``mlflow-server.log`` (appended to across restarts). Artifacts are proxied by the server
    (``--serve-artifacts --artifacts-destination``): clients upload over HTTP and never need the
    server's filesystem, which Ray workers in other containers or nodes do not share. Lean mode
    (``MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false``, one worker) starts in seconds in about 0.5 GB.
    The port is fixed at construction: ``stop()`` then ``start()`` serves the same URI and data.
    """

    def __init__(
        self, root_dir: str | os.PathLike[str], host: str = LOCALHOST, port: int | None = None,
        startup_timeout: float = 120.0,
    ) -> None:  # fmt: skip
        self.root_dir = Path(root_dir).resolve()
        self.host = host
        self.port = port if port is not None else free_port(host)
        self.startup_timeout = startup_timeout
        self.db_path = self.root_dir / "mlflow.db"
        self.artifacts_dir = self.root_dir / "artifacts"
        self.log_path = self.root_dir / "mlflow-server.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._log_offset = 0
        self._ready = False

    @property
    def uri(self) -> str:
        """Tracking URI for ``MLFLOW_TRACKING_URI`` / ``mlflow.set_tracking_uri``."""
        return f"http://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        """True while the server process started by :meth:`start` is alive."""
        return self._proc is not None and self._proc.poll() is None

    def command(self) -> list[str]:
        """The ``mlflow server`` command line."""
        return [
            sys.executable, "-m", "mlflow", "server",
            "--backend-store-uri", f"sqlite:///{self.db_path}",
            "--serve-artifacts", "--artifacts-destination", str(self.artifacts_dir),
            "--host", self.host, "--port", str(self.port), "--workers", "1",
        ]  # fmt: skip

    def start(self, wait: bool = True) -> Self:
        """Launch the server; with ``wait``, block until ``GET /health`` answers 200."""
        if self.running:
            return self.wait_ready() if wait else self
        if not port_is_free(self.host, self.port):
            raise ServiceError(
                f"Cannot start the MLflow server on {self.host}:{self.port}: the port is in use. "
                "Stop whatever listens there or pick another port."
            )
        self.artifacts_dir.mkdir(parents=True, exist_ok=True)
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        self._log = self.log_path.open("ab")
        self._proc = subprocess.Popen(
            self.command(), stdout=self._log, stderr=subprocess.STDOUT, env=env,
            cwd=self.root_dir, start_new_session=True,
        )  # fmt: skip
        logger.info("starting MLflow server at %s (log %s)", self.uri, self.log_path)
        return self.wait_ready() if wait else self

    def wait_ready(self) -> Self:
        """Poll ``/health``; on the server's death or a timeout, stop it and raise with the log tail."""
        if self._ready:
            return self
        if self._proc is None:
            raise ServiceError(f"The MLflow server at {self.uri} was not started: call start() first.")
        deadline = time.monotonic() + self.startup_timeout
        problem = f"did not answer /health within {self.startup_timeout:.0f} s"
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                problem = f"exited with code {self._proc.returncode} during start-up"
                break
            if http_status(f"{self.uri}/health", timeout=1.0) == 200:
                self._ready = True
                logger.info("MLflow server ready at %s", self.uri)
                return self
            time.sleep(_POLL_S)
        self.stop()
        raise ServiceError(
            f"The MLflow server at {self.uri} {problem}. "
            f"Last lines of {self.log_path}:\n{log_tail(self.log_path, self._log_offset)}"
        )

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM the server's process group and wait for it (SIGKILL after ``timeout``)."""
        if self._proc is not None:
            stop_process_group(self._proc.pid, timeout, child=self._proc)
            logger.info("MLflow server at %s stopped", self.uri)
        self._proc, self._ready = None, False
        if self._log is not None:
            self._log.close()
            self._log = None


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


class LocalRayHead(_Service):
    """A single-node Ray head (``ray start --head``) with its dashboard and job API on 127.0.0.1.

    ``address`` is the GCS address (``RAY_ADDRESS``, ``ray.init(address=...)``); ``dashboard_url``
    the job API (``ray job submit --address``). Unset ports are picked free (pass ``dashboard_port=8265``
    for Ray's usual one), so heads can start side by side. ``python`` in job entrypoints is this venv's.
    :meth:`stop` stops only THIS head: its daemons share the process group of ``ray start`` (run in a
    new session), and its job drivers are found by ``RAY_ADDRESS``; ``ray stop --force`` would kill
    every Ray on the machine. Ray resolves ``--node-ip-address 127.0.0.1`` to the machine's address
    and its GCS listens on all interfaces: on a shared network, firewall it.

    ``auth_mode`` is always explicit, because Ray 2.60 silently turns token auth on when
    ``~/.ray/auth_token`` exists (any local ``ray.init()`` creates one) and clients then fail with 401.
    ``"token"`` writes a fresh token to a private file; give clients :meth:`client_env`.
    """

    def __init__(
        self, num_cpus: int | None = None, port: int | None = None, dashboard_port: int | None = None,
        temp_dir: str | os.PathLike[str] | None = None, startup_timeout: float = 120.0,
        auth_mode: str = "disabled",
    ) -> None:  # fmt: skip
        if auth_mode not in ("disabled", "token"):
            raise ValueError(f"auth_mode must be 'disabled' or 'token', got {auth_mode!r}")
        self.auth_mode = auth_mode
        self.token_path: Path | None = None
        self.num_cpus = num_cpus
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
        """Auth variables for this head's clients (``ray job submit``, ``ray.init``): merge into their env."""
        env = {"RAY_AUTH_MODE": self.auth_mode}
        return env | ({"RAY_AUTH_TOKEN_PATH": str(self.token_path)} if self.token_path is not None else {})

    def _write_token(self) -> None:
        """Create a random cluster token in a private directory (token mode only)."""
        self.token_path = Path(tempfile.mkdtemp(prefix="capt-ray-auth-")) / "auth_token"
        self.token_path.write_text(secrets.token_hex(32))
        self.token_path.chmod(0o600)

    @property
    def running(self) -> bool:
        """True after :meth:`start` while the head's daemons live."""
        return self._pgid is not None and _group_alive(self._pgid)

    def command(self) -> list[str]:
        """The ``ray start --head`` command line."""
        cmd = [
            _ray_executable(), "start", "--head", "--disable-usage-stats",
            "--node-ip-address", LOCALHOST, "--port", str(self.port),
            "--dashboard-host", LOCALHOST, "--dashboard-port", str(self.dashboard_port),
            "--include-dashboard", "true", "--ray-client-server-port", str(free_port()),
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
        env |= self.client_env()
        logger.info("starting Ray head at %s (dashboard %s)", self.address, self.dashboard_url)
        self._launcher = subprocess.Popen(
            self.command(), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
        )  # fmt: skip
        self._pgid = self._launcher.pid
        return self.wait_ready() if wait else self

    def wait_ready(self) -> Self:
        """Wait for ``ray start`` to succeed, then for ``/api/version`` to answer (401: token auth on)."""
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
            tail = "\n".join(output.splitlines()[-30:])
            raise ServiceError(f"`ray start --head` failed (exit code {launcher.returncode}):\n{tail}")
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if http_status(f"{self.dashboard_url}/api/version", timeout=1.0) in (200, 401, 403):
                self._ready = True
                logger.info("Ray head ready at %s", self.address)
                return self
            time.sleep(_POLL_S)
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
