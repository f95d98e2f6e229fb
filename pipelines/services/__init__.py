"""Local MLflow and Ray services as subprocesses, and an early reachability probe for entry points.

Nothing here imports mlflow or ray: the services start through the command-line tools next to this
interpreter (``sys.executable -m mlflow``, the ``ray`` script), each in its own process group, so
that stopping one never touches another MLflow or Ray on the same machine.

Modules: `probe` (ports, HTTP, `check_reachable`, log tails, process groups), `mlflow_server`
(`LocalMlflowServer`, and `ManagedService`, what both services share; `check_mlflow_server`, whether a URI serves
MLflow; `tracking_store`, the store promote, report and serve use), `private` (owner-only token files and folders,
loopback-only listeners), `ray_connect` (the Ray address a command connects to, checked before it does).
"""

from __future__ import annotations

from pipelines.services.mlflow_server import LocalMlflowServer
from pipelines.services.probe import (
    LOCALHOST,
    ServiceError,
    check_reachable,
    free_port,
    http_status,
    log_tail,
    port_is_free,
    stop_process_group,
)

__all__ = ["LOCALHOST", "LocalMlflowServer", "ServiceError", "check_reachable", "free_port",
           "http_status", "log_tail", "port_is_free", "stop_process_group"]
