"""The replica's HTTP surface: a FastAPI app that Serve's ingress runs (`app.server_deployment`).

    POST /        {"task": "rte", "inputs": [raw rows]} -> labels, scores, version  (token)
    GET  /tasks   the capsules served: registry model, version, artifact digest      (token)
    GET  /health  {"status": "ok"}                                                   (no token)

Any other path is 404 and any other method 405 (with ``Allow``); FastAPI's docs routes are off. Every refusal is a
JSON ``{"error", "field", "rule"}``: the handlers below give FastAPI's own 404 and 405 that body too. The replica
comes in as a dependency (`replica`: Serve's servable object; a stand-in through ``app.dependency_overrides`` in the
unit tests). A body is not a FastAPI body parameter, which FastAPI would read whole and parse with no limit:
`checked_request` reads it under the byte cap and scans it (`limits`) before any JSON is built, then `InferRequest`
validates the parsed value.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Awaitable, Sequence
from typing import Annotated, Any, Protocol

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError
from starlette.exceptions import HTTPException

from capt.errors import CaptError
from pipelines.serving.auth import digest
from pipelines.serving.limits import ClientError, Limits, check_strings, parse, read_body

app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None, redirect_slashes=False)
ROUTES = "POST /, GET /tasks, GET /health"
"""The routes, as a refusal lists them."""
_ROW_FIELD = re.compile(r"row (\d+): field '([^']+)': (.*)", re.S)
_RANK = {"model_type": 0, "extra_forbidden": 1, "missing": 2}
"""Which of several validation errors a refusal names: the body's type, an unknown field, a missing one, then the
fields in order."""
SHOWN_NAMES = 20
"""Names a refusal lists; past that it says how many more there are and where all are listed (a replica may serve
1,000, and a refusal of 1,000 names helps nobody)."""


class Catalog:
    """What a request's checks read of the served set, built once per change of it (load, hot add, swap, drop):
    at 1,000 names, taking the largest character limit and listing the names on every request cost ~2 ms. `limits`:
    the request limits (characters: the largest of the served capsules'); `members`: the names, looked up rather
    than searched; `shape` and `listing`: what a malformed body's and an unserved task's refusals say."""

    def __init__(self, names: Sequence[str], limits: Limits) -> None:
        self.names, self.limits, self.members = tuple(names), limits, frozenset(names)
        extra = len(self.names) - SHOWN_NAMES
        more = f" ... and {extra} more (GET /tasks lists them all)" if extra > 0 else ""
        shown = list(self.names[:SHOWN_NAMES])
        self.shape = f"send {{\"task\": one of {shown}{more}, \"inputs\": [task rows]}}"
        self.listing = ", ".join(shown) + more


class Served(Protocol):
    """What the routes need from the replica; `token_sha256` None turns authentication off."""

    token_sha256: str | None

    def catalog(self) -> Catalog: ...
    def max_chars(self, name: str) -> int: ...
    def examples(self, name: str, rows: list[dict[str, Any]]) -> list[Any]: ...
    def answer(self, name: str, examples: list[Any]) -> Awaitable[dict[str, Any]]: ...
    def describe(self) -> dict[str, Any]: ...


class InferRequest(BaseModel):
    """A POST / body, once parsed (validated with the `Catalog` as context): strict, so a number is not taken for a
    task name nor a string for rows."""

    model_config = ConfigDict(extra="forbid", strict=True)
    task: str
    inputs: list[dict[str, Any]] = Field(min_length=1)

    @field_validator("task")
    @classmethod
    def _served(cls, task: str, info: ValidationInfo) -> str:
        if task not in info.context.members:
            raise PydanticCustomError("served_task", "not served here")
        return task


async def replica() -> Served:
    """The replica answering this request: the deployment's instance Serve runs the app in."""
    from ray import serve

    return serve.get_replica_context().servable_object


Replica = Annotated[Served, Depends(replica)]
Bearer = Annotated[HTTPAuthorizationCredentials | None, Depends(HTTPBearer(auto_error=False))]


async def authorized(served: Replica, given: Bearer) -> None:
    """401 unless the request's bearer token has the SHA-256 the replica holds (compared in constant time)."""
    if served.token_sha256 is not None and (
            given is None or not hmac.compare_digest(digest(given.credentials), served.token_sha256)):
        raise ClientError("Missing or wrong bearer token: send 'Authorization: Bearer <token>' (the token file the "
                          "server's start-up line names).", "Authorization", "bearer_token", 401)


async def checked_request(request: Request, served: Replica) -> InferRequest:
    """The body read under the byte cap, scanned, parsed and validated; every problem a ClientError naming the field."""
    catalog = served.catalog()
    limits = catalog.limits
    data = await read_body(request.headers.get("content-length"), request.stream(), limits.max_body_bytes)
    body = parse(data, limits)
    check_strings(body, limits.max_chars)  # before any message echoes a string back
    try:
        checked = InferRequest.model_validate(body, context=catalog)
    except ValidationError as err:
        raise _refusal(min(err.errors(), key=lambda e: _RANK.get(e["type"], 3)), catalog) from err
    check_strings(checked.inputs, served.max_chars(checked.task), "inputs")
    return checked


@app.post("", dependencies=[Depends(authorized)], include_in_schema=False)  # the bare prefix, "/capt" for "/capt/"
@app.post("/", dependencies=[Depends(authorized)])
async def infer(checked: Annotated[InferRequest, Depends(checked_request)], served: Replica) -> JSONResponse:
    try:
        examples = served.examples(checked.task, checked.inputs)
    except CaptError as err:
        raise _row_error(err) from err
    return JSONResponse(await served.answer(checked.task, examples))


@app.get("/tasks", dependencies=[Depends(authorized)])
async def tasks(served: Replica) -> JSONResponse:
    return JSONResponse(served.describe())


@app.get("/health")
async def health() -> JSONResponse:
    return JSONResponse({"status": "ok"})


@app.exception_handler(ClientError)
async def refused(request: Request, err: ClientError) -> JSONResponse:
    """A refusal: its status and ``{"error", "field", "rule"}``; a 401 says which scheme to use."""
    return JSONResponse(err.body(), err.status, headers={"WWW-Authenticate": "Bearer"} if err.status == 401 else None)


@app.exception_handler(HTTPException)
async def no_route(request: Request, err: HTTPException) -> JSONResponse:
    """FastAPI's 404 (no such path) and 405 (its ``Allow`` kept) as refusals that list the routes."""
    path, root = request.scope["path"], request.scope.get("root_path", "").rstrip("/")
    path = (path[len(root):] if root and path.startswith(root) else path) or "/"
    if err.status_code == 405:
        refusal = ClientError(f"{request.method} {path}: method not allowed; routes: {ROUTES}.", "method", "method")
    elif err.status_code == 404:
        refusal = ClientError(f"No route {path[:80]!r}; routes: {ROUTES}.", "path", "route")
    else:
        refusal = ClientError(str(err.detail), "request", "http")
    return JSONResponse(refusal.body(), err.status_code, headers=err.headers)


def _refusal(error: dict[str, Any], catalog: Catalog) -> ClientError:
    """One validation error of a body as the ClientError that names its field and rule."""
    kind, loc, given, shape = error["type"], error["loc"], error.get("input"), catalog.shape
    if kind == "model_type":
        return ClientError(f"The body must be a JSON object; {shape}.", "body", "type")
    if kind == "extra_forbidden":
        return ClientError(f"Unknown field {loc[0][:80]!r}; {shape}.", loc[0][:80], "known_fields")
    if kind == "missing":
        return ClientError(f"The field {loc[0]!r} is missing; {shape}.", loc[0], "required")
    if loc[0] == "task":
        shown = repr(given)[:80] if isinstance(given, str) else f"a {type(given).__name__}"
        return ClientError(f"task={shown} is not served here; tasks served: {catalog.listing}.", "task", "served_task")
    if len(loc) == 1:
        return ClientError("'inputs' must be a non-empty list of task rows (JSON objects).", "inputs", "non_empty_list")
    return ClientError(f"inputs[{loc[1]}] is a {type(given).__name__}; each row is a JSON object of the task's "
                       "official fields.", f"inputs[{loc[1]}]", "type")


def _row_error(err: CaptError) -> ClientError:
    """A task's row check ("row 2: field 'premise': empty string") as a ClientError on inputs[1].premise."""
    found = _ROW_FIELD.search(str(err))
    if not found:
        return ClientError(str(err), "inputs", "task_row")
    row, name, rule = found.groups()
    return ClientError(str(err), f"inputs[{int(row) - 1}].{name}", rule.strip().rstrip("."))
