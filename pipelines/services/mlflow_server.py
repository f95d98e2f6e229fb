"""The MLflow tracking server a command works with: `LocalMlflowServer`, a lean server on SQLite run as
``sys.executable -m mlflow``, and `ManagedService`, the base of the local services (start, optionally without
waiting; wait until ready; stop); `check_mlflow_server`, whether the server at a URI is an MLflow server; and
`tracking_store`, the one rule for where promote, report and serve find the tracking store."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Self
from urllib.parse import urlsplit

import psutil

from pipelines.config.schema import TrackingSection
from pipelines.services.folder_lock import current_holder, held_folder
from pipelines.services.probe import (
    LOCALHOST,
    POLL_INTERVAL_S,
    ServiceError,
    check_reachable,
    free_port,
    http_get,
    http_status,
    log_tail,
    port_is_free,
    stop_process_group,
)

logger = logging.getLogger(__name__)


class ManagedService:
    """What both services share: ``start(wait=False)`` then ``wait_ready()`` lets several start at
    once; ``with Service(...) as s:`` starts, waits and stops (a subclass defines ``start(wait=True)``,
    ``wait_ready()`` and ``stop()``, a no-op when the service is not running)."""

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


STORE_LOCK_FILE = "mlflow-server.lock"
"""In the store folder: held while a `LocalMlflowServer` runs on it."""
ADDRESSES_FILE = "mlflow-server.addresses"
"""In the store folder: every address a `LocalMlflowServer` served it at, one a line (the last: the running one's)."""


class LocalMlflowServer(ManagedService):
    """A lean MLflow tracking server on SQLite, bound to ``host`` (127.0.0.1 by default).

    Under ``root_dir``: ``mlflow.db`` (runs and Model Registry), ``artifacts/`` and
    ``mlflow-server.log`` (appended to across restarts). Artifacts are proxied by the server
    (``--serve-artifacts --artifacts-destination``): clients upload over HTTP and never need the
    server's filesystem, which Ray workers in other containers or nodes do not share. Lean mode
    (``MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false``, one worker) starts in seconds in about 0.5 GB.
    The port is fixed at construction: ``stop()`` then ``start()`` serves the same URI and data.

    ``basic_auth=(admin, password)`` serves MLflow's basic-auth app (password of 12+ characters): users
    and grants in ``basic_auth.db``, ``default_permission = NO_PERMISSIONS`` (a user sees only what it
    created or was granted); clients set ``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD``.
    """

    def __init__(
        self, root_dir: str | os.PathLike[str], host: str = LOCALHOST, port: int | None = None,
        startup_timeout: float = 120.0, basic_auth: tuple[str, str] | None = None,
    ) -> None:  # fmt: skip
        self.root_dir = Path(root_dir).resolve()
        self.host = host
        self.port = port if port is not None else free_port(host)
        self.startup_timeout = startup_timeout
        self.basic_auth = basic_auth
        self.db_path = self.root_dir / "mlflow.db"
        self.artifacts_dir = self.root_dir / "artifacts"
        self.log_path = self.root_dir / "mlflow-server.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._log_offset = 0
        self._ready = False
        self._store_lock = contextlib.ExitStack()

    @property
    def uri(self) -> str:
        """Tracking URI for ``MLFLOW_TRACKING_URI`` / ``mlflow.set_tracking_uri``."""
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        """The server's main process (the leader of its process group) while it runs."""
        return self._proc.pid if self.running else None

    def former_uris(self) -> tuple[str, ...]:
        """The other addresses this store was served at by earlier servers: operations that trials spooled for
        those are for this store, and go to this server (`pipelines.tracking.scope.ServerScope.moved_from`)."""
        return tuple(dict.fromkeys(uri for uri in recorded_addresses(self.root_dir) if uri != self.uri))

    @property
    def running(self) -> bool:
        """True while the server process started by :meth:`start` is alive."""
        return self._proc is not None and self._proc.poll() is None

    def command(self) -> list[str]:
        """The ``mlflow server`` command line (the tests start a failing one in its place)."""
        return [
            sys.executable, "-m", "mlflow", "server",
            "--backend-store-uri", f"sqlite:///{self.db_path}",
            "--serve-artifacts", "--artifacts-destination", str(self.artifacts_dir),
            "--host", self.host, "--port", str(self.port), "--workers", "1",
        ] + (["--app-name", "basic-auth"] if self.basic_auth else [])  # fmt: skip

    def _auth_env(self) -> dict[str, str]:
        """Environment of the basic-auth app: its config (no access without a grant) and its admin."""
        if self.basic_auth is None:
            return {}
        config = self.root_dir / "basic_auth.ini"
        config.write_text(
            f"[mlflow]\ndefault_permission = NO_PERMISSIONS\ndatabase_uri = sqlite:///{self.root_dir}/basic_auth.db\n"
            "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
        )
        config.chmod(0o600)
        admin, password = self.basic_auth
        return {"MLFLOW_AUTH_CONFIG_PATH": str(config), "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_hex(32),
                "MLFLOW_AUTH_ADMIN_USERNAME": admin, "MLFLOW_AUTH_ADMIN_PASSWORD": password}

    def start(self, wait: bool = True) -> Self:
        """Launch the server; with ``wait``, block until ``GET /health`` answers 200."""
        if self.running:
            return self.wait_ready() if wait else self
        if not port_is_free(self.host, self.port):
            raise ServiceError(
                f"Cannot start the MLflow server on {self.host}:{self.port}: the port is in use. "
                "Stop whatever listens there or pick another port."
            )
        self._store_lock.enter_context(held_folder(self.root_dir / STORE_LOCK_FILE, refusal=self._store_in_use))
        self.artifacts_dir.mkdir(parents=True, exist_ok=True)
        with (self.root_dir / ADDRESSES_FILE).open("a", encoding="utf-8") as addresses:
            addresses.write(self.uri + "\n")
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **self._auth_env()}
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
            if mlflow_answers(self.uri, timeout=1.0):
                self._ready = True
                logger.info("MLflow server ready at %s", self.uri)
                return self
            time.sleep(POLL_INTERVAL_S)
        self.stop()
        raise ServiceError(
            f"The MLflow server at {self.uri} {problem}. "
            f"Last lines of {self.log_path}:\n{log_tail(self.log_path, self._log_offset)}"
        )

    def terminate(self) -> None:
        """Ask the server to shut down (SIGTERM to its group) without waiting; `stop` then waits for it.

        Its shutdown takes about 1.5 s: a caller with other things to stop sends this first.
        """
        if self.running:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, signal.SIGTERM)

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM the server's process group and wait for it (SIGKILL after ``timeout``)."""
        if self._proc is not None:
            deadline = time.monotonic() + timeout  # one budget for both steps: a hung server is killed at `timeout`
            self._end_launcher_after_its_server(timeout)
            stop_process_group(self._proc.pid, max(0.0, deadline - time.monotonic()), child=self._proc)
            logger.info("MLflow server at %s stopped", self.uri)
        self._proc, self._ready = None, False
        if self._log is not None:
            self._log.close()
            self._log = None
        self._store_lock.close()

    def _end_launcher_after_its_server(self, timeout: float) -> None:
        """SIGTERM the group, wait for the processes that serve (the launcher's children), then SIGKILL the launcher.

        The ``mlflow server`` launcher only forwards signals to its uvicorn child and waits for it; once that child
        has shut down gracefully, the launcher spends seconds tearing down its interpreter (garbage collection of
        all of MLflow), which delays every stop and restart for nothing it still has to do. A server that never
        answered may still be starting (no child yet): the group's SIGTERM alone ends it.
        """
        if not self._ready:
            return
        try:
            servers = psutil.Process(self._proc.pid).children(recursive=True)  # none left after `terminate`
        except psutil.Error:
            return
        self.terminate()
        psutil.wait_procs(servers, timeout=timeout)
        if not any(server.is_running() for server in servers):
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()

    def _store_in_use(self, holder: str) -> ServiceError:
        at = (recorded_addresses(self.root_dir) or ["http://127.0.0.1:PORT"])[-1]  # the holder's, recorded last
        # `holder` is the process that started that server and holds the store (a sweep driver, a serve), not the
        # server itself: naming it as the server would invite killing a pid that is a running sweep
        return ServiceError(
            f"The MLflow store {self.root_dir} is in use: another command serves it with its own local MLflow server "
            f"(at {at}) and holds it ({holder}); stopping that command stops its server. Two servers on one SQLite "
            f"file corrupt its migrations. Wait for that command to end, point this one at the running server "
            f"(tracking.uri={at}), or give it another folder (tracking.local_dir)."
        )


def recorded_addresses(store: str | os.PathLike[str]) -> list[str]:
    """Every address a `LocalMlflowServer` served `store` at, oldest first ([] when none was recorded)."""
    try:
        return (Path(store) / ADDRESSES_FILE).read_text(encoding="utf-8").split()
    except OSError:
        return []


def mlflow_answers(uri: str, timeout: float = 2.0) -> bool:
    """Whether the MLflow server at the HTTP(S) address `uri` answers its health check (``GET /health``) now."""
    return http_status(f"{uri.rstrip('/')}/health", timeout=timeout) == 200


# Is the server at a tracking URI an MLflow tracking server? One read-only REST call, before any work.
#
# Any web server on the wrong port answers HTTP, and MLflow's client then fails deep inside a call
# with the other server's HTML page in its message. An MLflow server answers
# ``GET <uri>/api/2.0/mlflow/experiments/get-by-name`` with a JSON object (the experiment, or an
# ``error_code``), or refuses it with 401/403 when authentication is on.

API_PROBE = "/api/2.0/mlflow/experiments/get-by-name?experiment_name=Default"


def check_mlflow_server(uri: str, what: str, timeout: float = 5.0) -> None:
    """Raise `ServiceError` unless ``uri`` is reachable and answers like an MLflow tracking server.

    Addresses that are not http(s) (``sqlite:///...``, ``databricks``) are only passed to
    :func:`check_reachable`. Credentials in ``uri`` never reach the message.
    """
    check_reachable(uri, what)
    parts = urlsplit(uri)
    if parts.scheme not in ("http", "https"):
        return
    base = parts._replace(netloc=parts.netloc.rpartition("@")[2], query="", fragment="").geturl().rstrip("/")
    status, content_type, body, _ = http_get(base + API_PROBE, timeout, body_bytes=65536)
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if status in (401, 403) or (isinstance(data, dict) and ("experiment" in data or "error_code" in data)):
        return
    answer = f"HTTP {status}" + (f" ({content_type})" if content_type else "") if status else "no answer"
    raise ServiceError(
        f"The {what} at {base} is not an MLflow server: GET {API_PROBE.split('?')[0]} gave {answer} where "
        "MLflow answers with JSON. Check the port (another service listens there?) and, if MLflow is served "
        "under a path prefix, include the prefix in the URI.")



def credentials_in_uri(uri: str) -> str | None:
    """`uri` as it may be shown (without its user name and password) when it holds `user:password@`, else None:
    such a URI would travel into Ray's job metadata and the run records written in job folders."""
    parts = urlsplit(uri)
    if not (parts.username or parts.password):
        return None
    return parts._replace(netloc=(parts.hostname or "") + (f":{parts.port}" if parts.port else "")).geturl()


# One rule for where promote, report and serve find the tracking store: the flag, then MLFLOW_TRACKING_URI, then
# the local store that `make demo` and every local sweep write (`tracking.local_dir`, default outputs/mlflow, taken
# against the current directory), served for the length of the command by a local MLflow server, or by the one already
# serving it (a running sweep's, or another such command's).

LOCAL_STORE = Path(TrackingSection().local_dir)
"""The local MLflow store `make demo` writes (a sweep's default tracking.local_dir)."""


@dataclass(frozen=True)
class TrackingStore:
    """Where a command reads and writes: its URI, and a line saying where it came from."""

    uri: str
    """The tracking URI."""
    origin: str
    """E.g. "the local store /home/me/capt/outputs/mlflow (served at http://127.0.0.1:23456 for this command)"."""


@contextlib.contextmanager
def tracking_store(given: str | None, flag: str = "--tracking-uri", check: bool = False) -> Iterator[TrackingStore]:
    """The store for `given` (the flag's value), MLFLOW_TRACKING_URI or the local store; with `check`, a given
    server is probed now (otherwise the command's own calls report it)."""
    uri = given or os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        if check:
            check_mlflow_server(uri, f"MLflow tracking server ({flag} or MLFLOW_TRACKING_URI)")
        yield TrackingStore(uri, f"{uri} (from {flag if given else 'MLFLOW_TRACKING_URI'})")
        return
    store = LOCAL_STORE.absolute()
    if not (store / "mlflow.db").is_file():
        raise ServiceError(
            f"No tracking store found: no {flag}, no MLFLOW_TRACKING_URI, and no local store at {store}/mlflow.db "
            "(where `make demo` and local sweeps write, taken against the current directory). Run `make demo` first "
            f"or run this from the folder it ran in, or pass {flag} http://HOST:PORT (or set MLFLOW_TRACKING_URI).")
    # a local MLflow server that serves it now holds its lock, and the last address recorded is its own: a sweep's
    # server, say (a second one would be refused)
    recorded = recorded_addresses(store) if current_holder(store / STORE_LOCK_FILE) is not None else []
    if recorded:
        running = recorded[-1]
        check_mlflow_server(running, f"the local MLflow server already running on {store}")
        yield TrackingStore(running, f"the local store {store} (served at {running} by the local MLflow server "
                                     "already running on it)")
        return
    server = LocalMlflowServer(store).start()
    try:
        yield TrackingStore(server.uri, f"the local store {store} (served at {server.uri} for this command)")
    finally:
        server.stop()
