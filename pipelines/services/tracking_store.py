"""One rule for where promote, report and serve find the tracking store: the flag, then MLFLOW_TRACKING_URI, then
the local store that `make demo` and every local sweep write (`tracking.local_dir`, default outputs/mlflow, taken
against the current directory), served for the length of the command by a local MLflow server, or by the one already
serving it (a running sweep's, or another such command's)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pipelines.config.schema import TrackingSection
from pipelines.services.mlflow_probe import check_mlflow_server
from pipelines.services.mlflow_server import LocalMlflowServer, serving_address
from pipelines.services.probe import ServiceError

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
    running = serving_address(store)
    if running is not None:  # a sweep serves it now: its server holds the store, and a second one would be refused
        check_mlflow_server(running, f"the local MLflow server already running on {store}")
        yield TrackingStore(running, f"the local store {store} (served at {running} by the local MLflow server "
                                     "already running on it)")
        return
    server = LocalMlflowServer(store).start()
    try:
        yield TrackingStore(server.uri, f"the local store {store} (served at {server.uri} for this command)")
    finally:
        server.stop()
