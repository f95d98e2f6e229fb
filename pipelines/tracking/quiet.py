"""What MLflow prints from a sweep's trial processes, whose output all lands in the driver's console.

Off: the "View run ... at" links printed when a run ends (for a sweep's local server they point to an address that
is gone once the sweep ends; the sweep prints where its runs are at the end), the artifact download bars, and the
INFO lines of the system-metrics monitor (four per run), of the input-example check and of the wait for a
registered version. Kept: every warning and error, and the registry's "Created version" lines. Needs no mlflow.
"""

from __future__ import annotations

import logging
import os

QUIET_ENV = {"MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true", "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}
"""MLflow's own switches, read when it would print."""
QUIET_LOGGERS = ("mlflow.system_metrics", "mlflow.pyfunc", "mlflow.store.model_registry.abstract_store")
"""Loggers whose INFO lines are routine in every trial: they log from WARNING up."""


def quiet_mlflow() -> None:
    """Apply `QUIET_ENV` (unless set already: a user's explicit choice wins) and `QUIET_LOGGERS` in this process."""
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    for name in QUIET_LOGGERS:
        logger = logging.getLogger(name)
        if logger.level < logging.WARNING:
            logger.setLevel(logging.WARNING)
