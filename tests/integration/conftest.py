"""Session-wide real services for integration tests: an MLflow server and Ray heads.

As soon as collection ends, every service that some selected test needs is launched in the
background, so they boot while earlier tests run; a fixture then only waits for its own service. Each
pytest-xdist worker has services of its own (free ports, folders of their own).
All of them stop at the end of the session, also when tests fail. A test that stops a service (to
simulate an outage) must start it again before it returns, in a ``finally``.

Fixtures: ``mlflow_server`` (``LocalMlflowServer`` on a temporary SQLite store), ``ray_head``
(``LocalRayHead``, 2 CPUs, no auth) and ``smoke_sweep`` (the demo's sweep, run once on them for the MLflow UI
tests and the README's demo table). A token-auth head is started by the one test that needs it
(tests/integration/test_security.py, which also checks what `LocalRayHead(auth_mode="token")` gives its clients).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers.ray_head import LocalRayHead, ray_cluster_stragglers

from pipelines.services import LocalMlflowServer, ServiceError

logger = logging.getLogger(__name__)

Service = LocalMlflowServer | LocalRayHead


def _new_mlflow_server() -> LocalMlflowServer:
    return LocalMlflowServer(tempfile.mkdtemp(prefix="capt-it-mlflow-"))


FACTORIES: dict[str, Callable[[], Service]] = {
    "mlflow_server": _new_mlflow_server,
    # The smoke sweep registers and promotes capt-<model>-<task> champions: a store of its own keeps them out of the
    # registry names other tests create and count versions of.
    "smoke_mlflow_server": _new_mlflow_server,
    "ray_head": lambda: LocalRayHead(num_cpus=2),
}


class _ServicePool:
    """The session's services: created and launched (not waited for) on first use, stopped at the end."""

    def __init__(self) -> None:
        self.services: dict[str, Service] = {}

    def get(self, name: str) -> Service:
        """The service behind fixture ``name``, launched in the background on first use."""
        if name not in self.services:
            self.services[name] = FACTORIES[name]().start(wait=False)
        return self.services[name]

    def stop_all(self, remove_data: bool) -> dict[str, str]:
        """Stop every service at once; return what any Ray head left behind (empty when clean)."""
        with ThreadPoolExecutor(max_workers=max(1, len(self.services))) as executor:
            list(executor.map(lambda service: service.stop(), self.services.values()))
        problems = {}
        for name, service in self.services.items():
            if isinstance(service, LocalRayHead):
                pids = ray_cluster_stragglers(service.port)
                if pids or service.running:
                    problems[name] = f"daemons still running: {service.running}; other processes: {pids}"
            elif remove_data:
                shutil.rmtree(service.root_dir, ignore_errors=True)
        return problems


POOL = pytest.StashKey[_ServicePool]()

SERVED_TO_MANY = frozenset({"mlflow_server", "ray_head"})
"""Under pytest-xdist a worker cannot know which tests it will get: it launches early only the services that
many tests use (so most workers need them); the others start when a test of this worker first asks."""


def _launched_early(session: pytest.Session) -> set[str]:
    needed = {name for item in session.items for name in getattr(item, "fixturenames", ())}
    return needed & SERVED_TO_MANY if os.environ.get("PYTEST_XDIST_WORKER") else needed


def pytest_collection_finish(session: pytest.Session) -> None:
    """Launch the services the selected tests need, so that they boot while other tests run."""
    pool = _ServicePool()
    session.config.stash[POOL] = pool
    if session.config.option.collectonly:
        return
    needed = _launched_early(session)
    for name in FACTORIES:
        if name in needed:
            try:
                pool.get(name)
            except ServiceError as exc:  # the fixture retries and reports it as a test error
                logger.warning("could not launch %s early: %s", name, exc)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Safety net: stop whatever is still running (the pool fixture normally did it already)."""
    pool = session.config.stash.get(POOL, None)
    if pool is not None:
        leftovers = pool.stop_all(remove_data=exitstatus == 0)
        if leftovers:
            logger.error("Ray heads not fully stopped: %s", leftovers)
        server = pool.services.get("mlflow_server")
        if exitstatus != 0 and isinstance(server, LocalMlflowServer):
            logger.warning("MLflow server data and log kept in %s", server.root_dir)


@pytest.fixture(scope="session")
def _service_pool(pytestconfig: pytest.Config) -> Iterator[_ServicePool]:
    pool = pytestconfig.stash.get(POOL, None) or _ServicePool()
    yield pool
    leftovers = pool.stop_all(remove_data=False)
    assert not leftovers, f"Ray heads not fully stopped: {leftovers}"


def _ready(pool: _ServicePool, name: str) -> Service:
    """The service, ready; one that failed to start leaves the pool, so the next test asking for it tries anew (a
    start can time out on a busy machine: without this, every later test would fail on the dead one)."""
    try:
        return pool.get(name).wait_ready()
    except ServiceError:
        pool.services.pop(name, None)
        raise


@pytest.fixture(scope="session")
def mlflow_server(_service_pool: _ServicePool) -> LocalMlflowServer:
    """A lean MLflow server on a temporary SQLite store; ``.uri`` is its tracking URI."""
    server = _ready(_service_pool, "mlflow_server")
    assert isinstance(server, LocalMlflowServer)
    return server


@pytest.fixture(scope="session")
def ray_head(_service_pool: _ServicePool) -> LocalRayHead:
    """A local Ray head, 2 CPUs, no auth: ``.address`` for ray.init, ``.dashboard_url`` for job submit."""
    head = _ready(_service_pool, "ray_head")
    assert isinstance(head, LocalRayHead)
    return head


SMOKE_SWEEP_ARGS = ["--config", "pipelines/configs/smoke.yaml", "name=it-ui"]
"""The demo's sweep as `make demo` runs it on a fresh machine (no CAPT_DATA_DIR: generated data), under another name:
four trials, whose table the README quotes (tests/integration/test_readme_demo.py)."""


@pytest.fixture(scope="session")
def smoke_sweep(ray_head: LocalRayHead, _service_pool: _ServicePool,
                tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The demo's sweep run once on ``ray_head``, tracked on an MLflow server of its own: ``stdout``, ``uri``, ``url``
    (the runs-view URL the sweep printed), ``experiment_id`` (read from that URL) and ``sweep_run_url`` (the printed
    URL of the sweep's own run)."""
    mlflow_server = _ready(_service_pool, "smoke_mlflow_server")
    assert isinstance(mlflow_server, LocalMlflowServer)
    env = {**os.environ, **ray_head.client_env(), "OMP_NUM_THREADS": "1", "RAY_ADDRESS": ray_head.address}
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("CAPT_DATA_DIR", None)  # a fresh machine has no task files: the demo runs on generated data
    command = [sys.executable, "pipelines/sweep.py", *SMOKE_SWEEP_ARGS,
               f"storage_path={tmp_path_factory.mktemp('ui-sweep')}", f"tracking.uri={mlflow_server.uri}"]
    done = subprocess.run(command, cwd=Path(__file__).resolve().parents[2], env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-4000:]
    found = re.search(r"its runs: (\S+/#/experiments/(\d+)/runs\S*)", done.stdout)
    assert found, f"the sweep printed no runs URL:\n{done.stdout[-3000:]}"
    sweep_run = re.search(r"side by side: (\S+/runs/\w+/artifacts\S*)", done.stdout)
    assert sweep_run, f"the sweep printed no URL of its own run:\n{done.stdout[-3000:]}"
    return {"stdout": done.stdout, "uri": mlflow_server.uri, "url": found.group(1), "experiment_id": found.group(2),
            "sweep_run_url": sweep_run.group(1)}
