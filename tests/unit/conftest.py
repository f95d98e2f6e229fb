"""Fixtures shared by the bad-input matrices: a closed port and a web server that is not MLflow."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from helpers.bad_inputs import plain_http_server

from pipelines.services import LOCALHOST, free_port


@pytest.fixture(scope="module")
def closed_uri() -> str:
    """An http URI on 127.0.0.1 where nothing listens."""
    return f"http://{LOCALHOST}:{free_port(LOCALHOST)}"


@pytest.fixture(scope="module")
def http_uri(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A plain http.server on 127.0.0.1: it answers HTTP but is not MLflow."""
    for server in plain_http_server(tmp_path_factory.mktemp("www")):
        yield server.uri
