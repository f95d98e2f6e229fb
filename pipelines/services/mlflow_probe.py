"""Is the server at a tracking URI an MLflow tracking server? One read-only REST call, before any work.

Any web server on the wrong port answers HTTP, and MLflow's client then fails deep inside a call
with the other server's HTML page in its message. An MLflow server answers
``GET <uri>/api/2.0/mlflow/experiments/get-by-name`` with a JSON object (the experiment, or an
``error_code``), or refuses it with 401/403 when authentication is on.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from urllib.parse import urlsplit

from pipelines.services.probe import ServiceError, check_reachable

API_PROBE = "/api/2.0/mlflow/experiments/get-by-name?experiment_name=Default"
_AUTH_REQUIRED = (401, 403)


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
    status, content_type, body = _get(base + API_PROBE, timeout)
    if status in _AUTH_REQUIRED or _is_mlflow_answer(body):
        return
    answer = f"HTTP {status}" + (f" ({content_type})" if content_type else "") if status else "no answer"
    raise ServiceError(
        f"The {what} at {base} is not an MLflow server: GET {API_PROBE.split('?')[0]} gave {answer} where "
        "MLflow answers with JSON. Check the port (another service listens there?) and, if MLflow is served "
        "under a path prefix, include the prefix in the URI.")


def _get(url: str, timeout: float) -> tuple[int | None, str, bytes]:
    """(status, content type, first 64 KiB of the body) of a GET; (None, "", b"") when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 (http(s) only)
            return int(response.status), response.headers.get_content_type(), response.read(65536)
    except urllib.error.HTTPError as err:
        return int(err.code), err.headers.get_content_type() if err.headers else "", err.read(65536)
    except (urllib.error.URLError, OSError):
        return None, "", b""


def _is_mlflow_answer(body: bytes) -> bool:
    try:
        data = json.loads(body)
    except ValueError:
        return False
    return isinstance(data, dict) and ("experiment" in data or "error_code" in data)


def credentials_in_uri(uri: str) -> str | None:
    """`uri` as it may be shown (without its user name and password) when it holds `user:password@`, else None:
    such a URI would travel into Ray's job metadata and the run records written in job folders."""
    parts = urlsplit(uri)
    if not (parts.username or parts.password):
        return None
    return parts._replace(netloc=(parts.hostname or "") + (f":{parts.port}" if parts.port else "")).geturl()
