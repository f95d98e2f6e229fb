"""The replica's FastAPI app (`pipelines.serving.routes.app`) answering one request in process, for a stand-in
replica: raw ASGI rather than a test client, so that a path reaches the routes as sent (a client normalises "//")
and a body arrives in the pieces given (none with a Content-Length: chunked)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from pipelines.serving import routes


def respond(served: Any, method: str, path: str, headers: dict[str, str], pieces: list[bytes],
            root_path: str = "") -> tuple[int, dict[str, Any], dict[str, str]]:
    """(status, JSON body, headers) of the app's answer, `served` standing for the replica; `root_path` is the
    application's route prefix, which Serve's proxy leaves in `path` and names in ``root_path``."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "path": path,
             "raw_path": path.encode(), "root_path": root_path, "query_string": b"", "scheme": "http",
             "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 50000),
             "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]}
    pieces, sent = list(pieces) or [b""], []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": pieces.pop(0), "more_body": bool(pieces)} if pieces \
            else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def stand_in() -> Any:
        return served

    routes.app.dependency_overrides[routes.replica] = stand_in
    try:
        asyncio.run(routes.app(scope, receive, send))
    finally:
        routes.app.dependency_overrides.pop(routes.replica, None)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], json.loads(body), {k.decode(): v.decode() for k, v in start["headers"]}
