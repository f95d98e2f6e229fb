"""MLflow client helpers: transient-error classification, HTTP retry settings, clients and locks."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import mlflow
import requests
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException, RestException

TRIAL_KEY_TAG = "capt.trial_key"
_TRANSIENT_STATUS = (429, 500, 502, 503, 504)


class TrackingError(RuntimeError):
    """A tracking or registry request failed for a reason the user must fix; the message says which."""


def is_transient(exc: BaseException) -> bool:
    """True for errors worth retrying: no connection, timeouts, 429 and 5xx answers."""
    if isinstance(exc, RestException):
        return exc.get_http_status_code() in _TRANSIENT_STATUS
    if isinstance(exc, MlflowException):  # how MLflow wraps connection errors and timeouts
        return str(exc.message).startswith("API request to") and " failed with " in str(exc.message)
    if isinstance(exc, requests.HTTPError) and exc.response is not None:
        return exc.response.status_code in _TRANSIENT_STATUS
    return isinstance(exc, requests.ConnectionError | requests.Timeout | ConnectionError | TimeoutError)


def own_http_retries() -> None:
    """Turn off MLflow's own HTTP retries (7 by default, minutes when the server is down): ours bound them."""
    os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "0"
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")


def now_ms() -> int:
    return int(time.time() * 1000)


def mlflow_client(uri: str) -> MlflowClient:
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


@contextlib.contextmanager
def fluent_uri(uri: str) -> Iterator[None]:
    """Point MLflow's fluent API (needed by log_model / register_model) at `uri`, then restore it.

    The registry URI is left unset so it follows the tracking URI; the previous state, "unset"
    included, comes back afterwards (`mlflow.set_tracking_uri` also writes MLFLOW_TRACKING_URI).
    """
    from mlflow.tracking._tracking_service import utils as tracking_utils

    saved, saved_env = tracking_utils._tracking_uri, os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(saved)
        if saved_env is not None:
            os.environ["MLFLOW_TRACKING_URI"] = saved_env


@contextlib.contextmanager
def dir_lock(directory: Path) -> Iterator[None]:
    """An exclusive advisory lock on a directory (a tracker and a `sync` never replay one spool at once)."""
    import fcntl

    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
