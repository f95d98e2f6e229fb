"""Local MLflow and Ray services as subprocesses, and an early reachability probe for entry points.

Nothing here imports mlflow or ray: the services start through the command-line tools next to this
interpreter (``sys.executable -m mlflow``, the ``ray`` script), each in its own process group, so
that stopping one never touches another MLflow or Ray on the same machine."""

from __future__ import annotations

from pipelines.services.mlflow_server import LocalMlflowServer
from pipelines.services.probe import LOCALHOST, ServiceError, check_reachable, free_port, http_status, port_is_free

__all__ = ["LOCALHOST", "LocalMlflowServer", "ServiceError", "check_reachable", "free_port", "http_status",
           "port_is_free"]
