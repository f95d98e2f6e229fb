"""Local MLflow and Ray services run as subprocesses, and an early reachability probe.

Nothing here imports mlflow or ray: both are started through the command-line tools installed next
to the running interpreter (``sys.executable -m mlflow`` and the ``ray`` script), so importing this
module is cheap and the services live in their own process groups.

- :class:`LocalMlflowServer`: a lean MLflow tracking server on SQLite with proxied artifacts, for a
  laptop and for tests; restartable on the same root and port (tests use this to simulate an outage).
- :class:`LocalRayHead`: a single-node Ray head bound to 127.0.0.1 with its dashboard (job API).
- :func:`check_reachable`: the one-paragraph error entry points raise when an address is wrong.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import IO, Self
from urllib.parse import urlsplit

logger = logging.getLogger(__name__)

LOCALHOST = "127.0.0.1"
_POLL_S = 0.25


class ServiceError(RuntimeError):
    """A local service could not be started, stopped or reached; the message says what to do."""


def free_port(host: str = LOCALHOST) -> int:
    """Return a TCP port that is free on ``host`` right now (the OS picks it)."""
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


def http_status(url: str, timeout: float = 2.0) -> int | None:
    """HTTP status of a GET on ``url``, or None when nothing answers (refused, timeout, DNS)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 (http only)
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, OSError):
        return None


def log_tail(path: Path, offset: int = 0, lines: int = 30) -> str:
    """The last ``lines`` lines of a log file from byte ``offset`` on ("" when it does not exist)."""
    if not path.is_file():
        return ""
    with path.open("rb") as handle:
        handle.seek(offset)
        text = handle.read().decode("utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:])


def _tcp_target(url: str) -> tuple[str, int] | None:
    """(host, port) of a non-HTTP network address (``host:port``, ``ray://host:port``), else None."""
    if "://" not in url:
        host, sep, port = url.rpartition(":")
        return (host, int(port)) if sep and host and port.isdigit() else None
    parts = urlsplit(url)
    return (parts.hostname, parts.port) if parts.hostname and parts.port else None


def _unreachable_message(url: str, what: str, reason: str, fix: str | None) -> str:
    """Compose the one-paragraph error of :func:`check_reachable`."""
    default_fix = (
        "Start it, or correct the address (scheme, host and port). If it runs on another machine, "
        "forward its port first (for example `ssh -N -L PORT:127.0.0.1:PORT user@head` or "
        "`kubectl port-forward`) and use the forwarded 127.0.0.1 address."
    )
    return f"Cannot reach the {what} at {url} ({reason}). {fix or default_fix}"


def check_reachable(url: str, what: str, fix: str | None = None, timeout: float = 3.0) -> None:
    """Probe ``url`` quickly and raise :class:`ServiceError` naming it, ``what`` it is and the fix.

    ``http(s)://`` URLs get a GET: any HTTP answer, including 401/403/404, counts as reachable.
    ``host:port`` and other ``scheme://host:port`` addresses get a TCP connect. Addresses with no
    network location (``sqlite:///...``, ``file:...``, ``auto``, ``local``) are not probed.
    ``what`` reads like "MLflow tracking server (MLFLOW_TRACKING_URI)".
    """
    if urlsplit(url).scheme in ("http", "https"):
        if http_status(url, timeout=timeout) is None:
            raise ServiceError(_unreachable_message(url, what, "no HTTP answer", fix))
        return
    target = _tcp_target(url)
    if target is None:
        logger.debug("%s address %s has no network location; not probed", what, url)
        return
    try:
        with socket.create_connection(target, timeout=timeout):
            return
    except OSError as exc:
        raise ServiceError(_unreachable_message(url, what, f"TCP connect failed: {exc}", fix)) from None


def _ray_executable() -> str:
    """The ``ray`` script of this interpreter's environment (falls back to PATH)."""
    beside = Path(sys.executable).with_name("ray")
    if beside.is_file():
        return str(beside)
    found = shutil.which("ray")
    if found is None:
        raise ServiceError("The `ray` command is not installed: pip install 'ray[default,train,tune]'.")
    return found


def _stop_process_group(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGTERM ``proc``'s process group, wait for every member, SIGKILL after ``timeout``."""
    pgid = proc.pid
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            proc.poll()
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                proc.wait()
                return
            time.sleep(_POLL_S)
        logger.warning("process group %d ignored %s; escalating", pgid, sig.name)
    proc.wait()


class LocalMlflowServer:
    """A lean MLflow tracking server on SQLite, bound to ``host`` (127.0.0.1 by default).

    Layout under ``root_dir``: ``mlflow.db`` (runs and Model Registry), ``artifacts/`` (artifact
    store) and ``mlflow-server.log`` (appended to across restarts). Artifacts are proxied by the
    server (``--serve-artifacts --artifacts-destination``), so clients upload over HTTP and never
    need the server's filesystem, as Ray workers on other nodes or containers do not have it.
    Lean mode (``MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false``, one worker) starts in seconds and
    uses about 0.5 GB. The port is fixed at construction, so ``stop()`` then ``start()`` serves
    the same URI and the same data.
    """

    def __init__(
        self,
        root_dir: str | os.PathLike[str],
        host: str = LOCALHOST,
        port: int | None = None,
        startup_timeout: float = 120.0,
    ) -> None:
        self.root_dir = Path(root_dir).resolve()
        self.host = host
        self.port = port if port is not None else free_port(host)
        self.startup_timeout = startup_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def uri(self) -> str:
        """Tracking URI for ``MLFLOW_TRACKING_URI`` / ``mlflow.set_tracking_uri``."""
        return f"http://{self.host}:{self.port}"

    @property
    def db_path(self) -> Path:
        """The SQLite file that holds runs and the Model Registry."""
        return self.root_dir / "mlflow.db"

    @property
    def artifacts_dir(self) -> Path:
        """Where the server stores proxied artifacts."""
        return self.root_dir / "artifacts"

    @property
    def log_path(self) -> Path:
        """The server's combined stdout and stderr."""
        return self.root_dir / "mlflow-server.log"

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

    def start(self) -> Self:
        """Start the server and wait until ``GET /health`` answers; raise ServiceError otherwise."""
        if self.running:
            return self
        if not port_is_free(self.host, self.port):
            raise ServiceError(
                f"Cannot start the MLflow server on {self.host}:{self.port}: the port is in use. "
                "Stop whatever listens there or pick another port."
            )
        self.artifacts_dir.mkdir(parents=True, exist_ok=True)
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        self._log = self.log_path.open("ab")
        self._proc = subprocess.Popen(
            self.command(), stdout=self._log, stderr=subprocess.STDOUT, env=env,
            cwd=self.root_dir, start_new_session=True,
        )  # fmt: skip
        logger.info("starting MLflow server at %s (log %s)", self.uri, self.log_path)
        self._wait_healthy(offset)
        logger.info("MLflow server ready at %s", self.uri)
        return self

    def _wait_healthy(self, log_offset: int) -> None:
        """Poll ``/health`` until it answers 200; on death or timeout stop and raise with the log."""
        assert self._proc is not None
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                code = self._proc.returncode
                self.stop()
                raise ServiceError(
                    f"The MLflow server at {self.uri} exited with code {code} during start-up. "
                    f"Last lines of {self.log_path}:\n{log_tail(self.log_path, log_offset)}"
                )
            if http_status(f"{self.uri}/health", timeout=1.0) == 200:
                return
            time.sleep(_POLL_S)
        self.stop()
        raise ServiceError(
            f"The MLflow server at {self.uri} did not answer /health within {self.startup_timeout:.0f} s. "
            f"Last lines of {self.log_path}:\n{log_tail(self.log_path, log_offset)}"
        )

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM the server's process group and wait for it (SIGKILL after ``timeout``)."""
        if self._proc is not None:
            _stop_process_group(self._proc, timeout)
            logger.info("MLflow server at %s stopped", self.uri)
        self._proc = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class LocalRayHead:
    """A single-node Ray head on 127.0.0.1, started with ``ray start --head``.

    ``address`` is the GCS address (``RAY_ADDRESS`` / ``ray.init(address=...)``); ``dashboard_url``
    is the job API for ``ray job submit --address``. Unset ports are picked free, so a head can
    start beside another Ray; the dashboard keeps 8265 when that port is free.

    Caution: :meth:`stop` runs ``ray stop --force``, which kills EVERY Ray process of this user on
    the machine (Ray has no per-cluster stop). Fine on a laptop and in tests; never on a shared host.
    """

    def __init__(
        self,
        num_cpus: int | None = None,
        port: int | None = None,
        dashboard_port: int | None = None,
        temp_dir: str | os.PathLike[str] | None = None,
        startup_timeout: float = 120.0,
    ) -> None:
        self.num_cpus = num_cpus
        self.port = port if port is not None else free_port()
        if dashboard_port is None:
            dashboard_port = 8265 if port_is_free(LOCALHOST, 8265) else free_port()
        self.dashboard_port = dashboard_port
        self.temp_dir = Path(temp_dir).resolve() if temp_dir is not None else None
        self.startup_timeout = startup_timeout
        self._started = False

    @property
    def address(self) -> str:
        """GCS address, e.g. ``127.0.0.1:6379``."""
        return f"{LOCALHOST}:{self.port}"

    @property
    def dashboard_url(self) -> str:
        """Dashboard and job API, e.g. ``http://127.0.0.1:8265``."""
        return f"http://{LOCALHOST}:{self.dashboard_port}"

    @property
    def started(self) -> bool:
        """True between a successful :meth:`start` and :meth:`stop`."""
        return self._started

    def command(self) -> list[str]:
        """The ``ray start --head`` command line."""
        cmd = [
            _ray_executable(), "start", "--head",
            "--node-ip-address", LOCALHOST, "--port", str(self.port),
            "--dashboard-host", LOCALHOST, "--dashboard-port", str(self.dashboard_port),
            "--include-dashboard", "true", "--disable-usage-stats",
            "--ray-client-server-port", str(free_port()),
            "--dashboard-agent-listen-port", str(free_port()),
        ]  # fmt: skip
        if self.num_cpus is not None:
            cmd += ["--num-cpus", str(self.num_cpus)]
        if self.temp_dir is not None:
            cmd += ["--temp-dir", str(self.temp_dir)]
        return cmd

    def start(self) -> Self:
        """Start the head and wait until the job API answers; raise ServiceError otherwise."""
        if self._started:
            return self
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        # Job entrypoints (`python ...`) must find this environment's interpreter first.
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        logger.info("starting Ray head at %s (dashboard %s)", self.address, self.dashboard_url)
        try:
            done = subprocess.run(
                self.command(), env=env, capture_output=True, text=True, timeout=self.startup_timeout
            )
        except subprocess.TimeoutExpired as exc:
            self._force_stop()
            raise ServiceError(f"`ray start --head` did not return within {exc.timeout:.0f} s.") from None
        if done.returncode != 0:
            self._force_stop()
            tail = "\n".join((done.stdout + done.stderr).splitlines()[-30:])
            raise ServiceError(f"`ray start --head` failed with code {done.returncode}:\n{tail}")
        self._started = True
        self._wait_job_api()
        logger.info("Ray head ready at %s", self.address)
        return self

    def _wait_job_api(self) -> None:
        """Poll the dashboard's ``/api/version`` until it answers (401 counts: token auth is on)."""
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if http_status(f"{self.dashboard_url}/api/version", timeout=1.0) in (200, 401, 403):
                return
            time.sleep(_POLL_S)
        self.stop()
        raise ServiceError(
            f"The Ray dashboard at {self.dashboard_url} did not answer within {self.startup_timeout:.0f} s; "
            "is ray[default] installed (the dashboard needs it)? See the logs under the Ray temp dir."
        )

    def stop(self) -> None:
        """Run ``ray stop --force`` (stops every Ray process on this machine, see the class doc)."""
        if not self._started:
            return
        self._force_stop()
        self._started = False
        logger.info("Ray head at %s stopped", self.address)

    @staticmethod
    def _force_stop() -> None:
        """``ray stop --force``; a failure is logged, never raised (it runs in clean-up paths)."""
        try:
            subprocess.run([_ray_executable(), "stop", "--force"], capture_output=True, timeout=120)
        except (subprocess.TimeoutExpired, OSError, ServiceError) as exc:
            logger.warning("`ray stop --force` failed: %s", exc)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
