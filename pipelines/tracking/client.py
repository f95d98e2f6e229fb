"""MLflow client helpers: transient-error classification, HTTP retry settings, clients and the replay lock."""

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

from pipelines.services.folder_lock import exclusive

TRIAL_KEY_TAG = "capt.trial_key"
_TRANSIENT_STATUS = (429, 500, 502, 503, 504)
_TRANSIENT_ERRORS = (requests.ConnectionError, requests.Timeout, requests.exceptions.RetryError, ConnectionError,
                     TimeoutError)


class TrackingError(RuntimeError):
    """A tracking or registry request failed for a reason the user must fix; the message says which."""


def is_transient(exc: BaseException) -> bool:
    """True for errors worth retrying: no connection, timeouts, 429 and 5xx answers. MLflow raises a failed
    connection or a timeout as an `MlflowException` chained to the requests error, which decides."""
    if isinstance(exc, RestException):
        return exc.get_http_status_code() in _TRANSIENT_STATUS
    if isinstance(exc, requests.HTTPError) and exc.response is not None:
        return exc.response.status_code in _TRANSIENT_STATUS
    if isinstance(exc, _TRANSIENT_ERRORS):
        return True
    cause = exc.__cause__ or exc.__context__
    return isinstance(exc, MlflowException) and cause is not None and is_transient(cause)


def own_http_retries() -> None:
    """Cut MLflow's own HTTP retries to one immediate re-send (7 with growing pauses by default, minutes when the
    server is down): every operation has its own time budget instead (`spool.call_with_retry` says why). The one
    re-send covers a request sent on a kept-alive connection the server closed meanwhile (`RemoteDisconnected`
    without an answer), which no outage explains; urllib3 waits nothing before the first retry, and a server's
    `Retry-After` is not obeyed, so nothing sleeps for it."""
    os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "1"
    os.environ["MLFLOW_HTTP_RESPECT_RETRY_AFTER_HEADER"] = "false"
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


def dir_lock(directory: Path) -> contextlib.AbstractContextManager[None]:
    """An exclusive lock on a directory (a tracker and a `sync` never replay one spool at once); creates it."""
    directory.mkdir(parents=True, exist_ok=True)
    return exclusive(directory)


def ensure_experiment(client: MlflowClient, name: str) -> str:
    """The id of the experiment `name`: created if missing (another process may create it meanwhile), restored if
    deleted."""
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        try:
            return client.create_experiment(name)
        except RestException as err:  # another trial created it meanwhile
            if err.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
            experiment = client.get_experiment_by_name(name)
    if experiment.lifecycle_stage == "deleted":
        client.restore_experiment(experiment.experiment_id)
    return experiment.experiment_id
