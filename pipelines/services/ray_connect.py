"""The sweep's Ray: a cluster named by RAY_ADDRESS, or a local Ray closed to the network.

Credentials (MLFLOW_TRACKING_PASSWORD and the like) never travel in a runtime_env: Ray shows runtime
envs in plain text in the dashboard's job, actor and task APIs and writes them into its session logs.
Workers read them from their own environment instead: the local Ray's daemons and workers are children
of the driver and inherit its environment; a cluster's nodes get them from a secret of their own
(see infra/README.md).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from pipelines.services.private import RAY_LOOPBACK_ENV
from pipelines.services.probe import LOCALHOST, ServiceError, check_reachable, free_port

logger = logging.getLogger("pipelines.sweep")

# Settings (never credentials) that a cluster's workers take from the driver's machine.
SETTINGS_FOR_WORKERS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HF_HOME", "CAPT_DATA_DIR", "OMP_NUM_THREADS")


def worker_settings() -> dict[str, str]:
    """The runtime_env variables a cluster's workers get from the driver: SETTINGS_FOR_WORKERS only."""
    return environment_values(SETTINGS_FOR_WORKERS)


def environment_values(names: Iterable[str]) -> dict[str, str]:
    """The value of each of `names` that this process's environment sets (runtime_env variables it was given)."""
    return {name: os.environ[name] for name in names if name in os.environ}


@contextlib.contextmanager
def ray_cluster(num_cpus: int | None, worker_env: Mapping[str, str] | None = None,
                node_env: Mapping[str, str] | None = None) -> Iterator[None]:
    """Connect to RAY_ADDRESS (a cluster or `ray job submit`), or start a local Ray on 127.0.0.1 only; every worker
    process of this driver's job starts with `worker_env` (settings, never credentials: see above), and with
    `node_env`, which a local Ray also gives every process of its own (its system actors too); on a cluster it
    reaches the actors this job creates (Serve's controller and proxies, when this job starts Serve)."""
    fix = "Check `ray status`, start a head with `ray start --head`, or unset RAY_ADDRESS to run on a local Ray."
    address = os.environ.get("RAY_ADDRESS")
    if address:  # ray.init waits minutes for an address where nothing listens
        check_reachable(address, "Ray cluster (RAY_ADDRESS)", fix)
    with contextlib.ExitStack() as stack:
        try:
            if address:
                import ray

                settings = {**worker_settings(), **(worker_env or {}), **(node_env or {})}
                ray.init(address=address, runtime_env={"env_vars": settings})
                logger.info("Ray cluster at %s: workers get %s from this driver and any credentials from their "
                            "own nodes' environment", address, ", ".join(settings) or "no variable")
            else:
                stack.enter_context(_local_ray(num_cpus, dict(worker_env or {}), dict(node_env or {})))
        except (ConnectionError, RuntimeError, ValueError) as err:
            where = f"the Ray cluster at RAY_ADDRESS={address!r}" if address else "a local Ray"
            raise ServiceError(f"Cannot start or reach {where} ({err}). {fix}") from err
        import ray

        try:
            yield
        finally:
            ray.shutdown()


@contextlib.contextmanager
def environ(**values: str) -> Iterator[None]:
    """Set environment variables for the block (the local Ray's processes inherit them); restore after."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def _local_ray(num_cpus: int | None, worker_env: dict[str, str], node_env: dict[str, str]) -> Iterator[None]:
    """A local Ray with token auth, its dashboard and every port it can bind on 127.0.0.1, and its session
    folder (logs, sockets) below a folder only this user can open.

    Ray Train's controller asks the state API (served by the dashboard) whether it is alive, and the state
    API finds its cluster from RAY_API_SERVER_ADDRESS, else RAY_ADDRESS, else the last `ray start` on the
    machine. Without a dashboard, or with a stale `ray_current_cluster` file, each call waits for its
    timeout and every trial's teardown stalls about 12 s.
    """
    from pipelines.services.private import private_ray_token_file, private_temp_dir

    token_file = private_ray_token_file()
    temp_dir = private_temp_dir("capt-ray") / "ray"  # Ray makes its own temp dir 777: the parent is private
    for attempt in range(1, PORT_ATTEMPTS + 1):
        port = free_port(LOCALHOST)
        with environ(RAY_AUTH_MODE="token", RAY_API_SERVER_ADDRESS=f"http://{LOCALHOST}:{port}", **RAY_LOOPBACK_ENV,
                     **node_env):
            constants = sys.modules.get("ray._private.ray_constants")  # Ray reads RAY_LOOPBACK_ENV when it is imported
            if constants is not None and getattr(constants, "ENABLE_RAY_CLUSTER", False):
                logger.warning("Ray was imported before the sweep set %s: its node address will not be 127.0.0.1 and "
                               "its daemons will listen on every interface (token-protected).", RAY_LOOPBACK_ENV)
            if not _init_local_ray(num_cpus, port, temp_dir, worker_env, last=attempt == PORT_ATTEMPTS):
                continue
            logger.info("%s", _what_is_in_force(port, token_file, temp_dir))
            if worker_env:
                logger.info("Local Ray: its workers start with %s",
                            " ".join(f"{k}={v}" for k, v in worker_env.items()))
            yield
            return


PORT_ATTEMPTS = 3
"""Dashboard ports the local Ray tries: one picked free can be taken by another process before Ray binds it."""


def _init_local_ray(num_cpus: int | None, port: int, temp_dir: Path, worker_env: Mapping[str, str],
                    last: bool) -> bool:
    """`ray.init` of the local Ray with its dashboard on `port`; False when another process took that port meanwhile
    (and this is not the `last` attempt), after stopping what the attempt had started."""
    import psutil
    import ray

    before = {child.pid for child in psutil.Process().children(recursive=True)}
    try:
        ray.init(address="local", num_cpus=num_cpus, logging_level=logging.WARNING, include_dashboard=True,
                 dashboard_host=LOCALHOST, dashboard_port=port, _node_ip_address=LOCALHOST, _temp_dir=str(temp_dir),
                 runtime_env={"env_vars": dict(worker_env)} if worker_env else None)
        return True
    except ValueError as err:
        if "already occupied" not in str(err) or last:
            raise
        logger.warning("Port %d was taken while the local Ray started; starting it again on another port", port)
        ray.shutdown()
        started = []  # Ray's processes (its GCS server, its Python daemons), not another service's
        for child in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):  # it ended meanwhile
                if child.pid not in before and (child.name() == "gcs_server" or "/ray/" in " ".join(child.cmdline())):
                    started.append(child)
        for child in started:  # a failed ray.init leaves its GCS server running
            child.kill()
        psutil.wait_procs(started, timeout=10)
        return False


def _what_is_in_force(port: int, token_file: Path | None, temp_dir: Path) -> str:
    """One line for the log: auth, where the dashboard listens, which ports (if any) are open beyond 127.0.0.1 once Ray
    has started (what starts later, such as a Serve replica's gRPC server, is listed by the command that starts it)."""
    from pipelines.services.private import is_loopback, listening_sockets

    token = f"the token is in {token_file} (mode 600)" if token_file else "the token comes from RAY_AUTH_TOKEN"
    listening = listening_sockets(os.getpid())
    exposed = [entry for entry in listening if not is_loopback(entry[0])]
    reach = ("no port listens beyond 127.0.0.1" if not exposed else "listening on all interfaces: "
             + ", ".join(f"{name} {ip}:{p}" for ip, p, name in exposed))
    return (f"Local Ray: token auth on ({token}; `ray get-auth-token` prints it); dashboard and job API on "
            f"http://127.0.0.1:{port}; {len(listening)} ports open as it starts (Ray, MLflow), {reach} at this point; "
            f"logs in {temp_dir}/session_latest/logs")
