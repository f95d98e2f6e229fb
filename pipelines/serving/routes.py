"""The replica's HTTP surface: three routes, the bearer token, request limits, 4xx answers that name the field.

    POST /        {"task": "rte", "inputs": [raw rows]} -> labels, scores, version  (token)
    GET  /tasks   the capsules served: registry model, version, artifact digest      (token)
    GET  /health  {"status": "ok"}                                                   (no token)

Any other path is 404 and any other method on these paths 405 (with ``Allow``). Every refusal is a JSON
``{"error", "field", "rule"}``. No Ray here: `Front` drives an object with the `Served` methods (the Serve
deployment in `app`, a stand-in in the unit tests).

Why our own router: Serve's FastAPI ingress would give 404/405 too, but hides the class behind Serve (it
cannot be driven without a running Serve) and FastAPI's docs routes would need turning off; three routes are a
table here.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse

from capt.errors import CaptError
from pipelines.serving.auth import authorized
from pipelines.serving.limits import ClientError, Limits, check_strings, parse, read_body

ROUTES: dict[str, tuple[str, ...]] = {"/": ("POST",), "/tasks": ("GET",), "/health": ("GET",)}
"""Path -> allowed methods."""
OPEN_ROUTES = ("/health",)
"""Routes answered without the token."""
_ROW_FIELD = re.compile(r"row (\d+): field '([^']+)': (.*)", re.S)
SHOWN_NAMES = 20
"""Names a refusal lists; past that it says how many more there are and where all are listed (a replica may serve
1,000, and a refusal of 1,000 names helps nobody)."""


@dataclass(frozen=True)
class Catalog:
    """What a request's checks read of the served set, built once per change of it (load, hot add, swap, drop):
    at 1,000 names, taking the largest character limit and listing the names on every request cost ~2 ms."""

    names: Sequence[str]
    """The names served, in the order the refusals list them."""
    limits: Limits
    """The request limits (characters: the largest of the served capsules')."""
    members: frozenset[str] = field(init=False)
    """`names` as a set: a request's task is looked up, not searched for."""
    shape: str = field(init=False)
    """What a body must look like, as the refusals of a malformed body say it."""
    listing: str = field(init=False)
    """The names served, as the refusal of a task not served lists them."""

    def __post_init__(self) -> None:
        names = list(self.names)
        shown, more = names[:SHOWN_NAMES], _more(len(names))
        object.__setattr__(self, "names", tuple(names))
        object.__setattr__(self, "members", frozenset(names))
        object.__setattr__(self, "shape", f"send {{\"task\": one of {shown}{more}, \"inputs\": [task rows]}}")
        object.__setattr__(self, "listing", ", ".join(shown) + more)


def _more(count: int) -> str:
    """What a listing of `count` names says after the first `SHOWN_NAMES`: nothing when it showed them all."""
    extra = count - SHOWN_NAMES
    return f" ... and {extra} more (GET /tasks lists them all)" if extra > 0 else ""


class Served(Protocol):
    """What `Front` needs from the replica."""

    def catalog(self) -> Catalog: ...
    def max_chars(self, name: str) -> int: ...
    def examples(self, name: str, rows: list[dict[str, Any]]) -> list[Any]: ...
    def answer(self, name: str, examples: list[Any]) -> Awaitable[dict[str, Any]]: ...
    def describe(self) -> dict[str, Any]: ...


class Front:
    """Routes, authenticates and checks requests for `served`; `token_sha256` None turns authentication off."""

    def __init__(self, served: Served, token_sha256: str | None) -> None:
        self.served, self.token_sha256 = served, token_sha256
        self._handlers: dict[str, Callable[[Request], Awaitable[dict[str, Any]]]] = {
            "/": self._infer, "/tasks": self._tasks, "/health": self._health}

    async def respond(self, request: Request) -> JSONResponse:
        """The answer to any request: 200, or 4xx with a JSON body naming the field and the rule."""
        path = _relative_path(request)
        try:
            if path not in ROUTES:
                raise ClientError(f"No route {path[:80]!r}; routes: {_listing()}.", "path", "route", 404)
            if request.method not in ROUTES[path]:
                raise ClientError(f"{request.method} {path}: method not allowed; routes: {_listing()}.", "method",
                                  "method", 405)
            if path not in OPEN_ROUTES and self.token_sha256 is not None \
                    and not authorized(request.headers.get("authorization"), self.token_sha256):
                raise ClientError("Missing or wrong bearer token: send 'Authorization: Bearer <token>' (the token "
                                  "file the server's start-up line names).", "Authorization", "bearer_token", 401)
            return JSONResponse(await self._handlers[path](request))
        except ClientError as err:
            return JSONResponse(err.body(), status_code=err.status, headers=_headers(err, path))

    async def _health(self, request: Request) -> dict[str, Any]:
        return {"status": "ok"}

    async def _tasks(self, request: Request) -> dict[str, Any]:
        return self.served.describe()

    async def _infer(self, request: Request) -> dict[str, Any]:
        catalog = self.served.catalog()
        limits = catalog.limits
        data = await read_body(request.headers.get("content-length"), request.stream(), limits.max_body_bytes)
        body = parse(data, limits)
        check_strings(body, limits.max_chars)  # before any message echoes a string back
        name, rows = self._fields(body, catalog)
        check_strings(rows, self.served.max_chars(name), "inputs")
        try:
            examples = self.served.examples(name, rows)
        except CaptError as err:
            raise _row_error(err) from err
        return await self.served.answer(name, examples)

    def _fields(self, body: Any, catalog: Catalog) -> tuple[str, list[dict[str, Any]]]:
        """(task, rows) of a parsed body, each problem a ClientError naming the field."""
        shape, limits = catalog.shape, catalog.limits
        if not isinstance(body, dict):
            raise ClientError(f"The body must be a JSON object; {shape}.", "body", "type")
        for key in body:
            if key not in ("task", "inputs"):
                raise ClientError(f"Unknown field {key[:80]!r}; {shape}.", key[:80], "known_fields")
        for key in ("task", "inputs"):
            if key not in body:
                raise ClientError(f"The field {key!r} is missing; {shape}.", key, "required")
        name, rows = body["task"], body["inputs"]
        if not isinstance(name, str) or name not in catalog.members:
            shown = repr(name)[:80] if isinstance(name, str) else f"a {type(name).__name__}"
            raise ClientError(f"task={shown} is not served here; tasks served: {catalog.listing}.", "task",
                              "served_task")
        if not isinstance(rows, list) or not rows:
            raise ClientError("'inputs' must be a non-empty list of task rows (JSON objects).", "inputs",
                              "non_empty_list")
        if len(rows) > limits.max_rows:
            raise ClientError(f"'inputs' holds {len(rows)} rows; at most {limits.max_rows} per request (split the "
                              "request).", "inputs", "max_rows", 413)
        for i, row in enumerate(rows):
            if not isinstance(row, dict):
                raise ClientError(f"inputs[{i}] is a {type(row).__name__}; each row is a JSON object of the "
                                  "task's official fields.", f"inputs[{i}]", "type")
        return name, rows


def _row_error(err: CaptError) -> ClientError:
    """A task's row check ("row 2: field 'premise': empty string") as a ClientError on inputs[1].premise."""
    found = _ROW_FIELD.search(str(err))
    if not found:
        return ClientError(str(err), "inputs", "task_row")
    row, field, rule = found.groups()
    return ClientError(str(err), f"inputs[{int(row) - 1}].{field}", rule.strip().rstrip("."))


def _relative_path(request: Request) -> str:
    """The path below the application's route prefix (Serve puts the prefix in ``root_path``)."""
    path, root = request.scope.get("path", "/"), request.scope.get("root_path", "").rstrip("/")
    if root and path.startswith(root):
        path = path[len(root):]
    return path or "/"


def _listing() -> str:
    return ", ".join(f"{'/'.join(methods)} {path}" for path, methods in ROUTES.items())


def _headers(err: ClientError, path: str) -> dict[str, str]:
    if err.status == 401:
        return {"WWW-Authenticate": "Bearer"}
    if err.status == 405:
        return {"Allow": ", ".join(ROUTES[path])}
    return {}
