"""A request body from bytes to checked JSON, every limit enforced before the step it protects.

Order: the declared ``Content-Length`` (413 before a byte is read), the bytes read with a cap (413 as soon as
the cap is passed, for bodies sent without a length), strict UTF-8, then one vectorised scan of the raw
bytes (`scan`) for the nesting depth, the rows and the longest string, all before `json.loads` builds an
object; then the parse itself refuses NaN/Infinity, a number too large for a float, an integer of more than
`MAX_INT_DIGITS` digits and a key given twice in one object, and one walk over the (now small) result refuses lone
surrogates and texts over the character limit. Each refusal is a `ClientError` naming the field and the rule.

Why our own code: a FastAPI body parameter reads the whole body with no cap (FastAPI's ``max_body_size`` is fixed
when the app is built, before a replica knows its settings) and Python's json module accepts NaN and recursion deep
enough to fail with RecursionError (a 500); neither FastAPI nor Ray Serve has a depth or string limit. The routes
run these checks as a dependency (`routes.checked_request`).
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from capt.tasks.loading import repeated_key

_ESCAPE = re.compile(rb"\\.", re.S)
_OPEN, _CLOSE = np.frombuffer(b"[{", np.uint8), np.frombuffer(b"]}", np.uint8)
_QUOTE, _COMMA = ord('"'), ord(",")
_MAX_ESCAPED_BYTES_PER_CHAR = 6  # "\uXXXX": no character takes more bytes than this inside a JSON string


class ClientError(ValueError):
    """A request the server refuses: HTTP `status`, the `field` at fault and the `rule` it broke."""

    def __init__(self, message: str, field: str, rule: str, status: int = 400) -> None:
        super().__init__(message)
        self.field, self.rule, self.status = field, rule, status

    def body(self) -> dict[str, str]:
        """The JSON body of the answer."""
        return {"error": str(self), "field": self.field, "rule": self.rule}


@dataclass(frozen=True)
class Limits:
    """What one request may hold."""

    max_body_bytes: int
    """Bytes of the body."""
    max_rows: int
    """Rows in ``inputs``."""
    max_depth: int
    """Nesting depth of objects and lists (the body itself is depth 1)."""
    max_chars: int
    """Characters of any one string (the largest task limit; each task's own is checked after the parse)."""


async def read_body(declared_length: str | None, chunks: AsyncIterator[bytes], cap: int) -> bytes:
    """The body, never holding more than `cap` bytes: 413 at once when declared or found larger."""
    too_big = (f"send at most {cap} bytes per request (split the rows over several requests), the limit the "
               "server was started with (`python -m pipelines.serve --max-body-bytes N`)")
    if declared_length is not None:
        if not declared_length.isdigit():
            raise ClientError(f"Content-Length {declared_length[:40]!r} is not a number.", "Content-Length",
                              "integer")
        if int(declared_length) > cap:
            raise ClientError(f"The body is {declared_length} bytes; {too_big}.", "body", "max_body_bytes", 413)
    parts, size = [], 0
    async for chunk in chunks:
        size += len(chunk)
        if size > cap:
            raise ClientError(f"The body is over {cap} bytes; {too_big}.", "body", "max_body_bytes", 413)
        parts.append(chunk)
    return b"".join(parts)


def scan(data: bytes, limits: Limits) -> None:
    """Depth, rows and string length from the raw bytes, before any JSON is built (vectorised: ~10 ms a MB)."""
    raw = np.frombuffer(_ESCAPE.sub(b"__", data), np.uint8)  # escapes -> neutral bytes, positions kept
    quotes = np.flatnonzero(raw == _QUOTE)
    if len(quotes) % 2:
        return  # an unterminated string: json.loads names the position
    lengths = quotes[1::2] - quotes[0::2] - 1
    if len(quotes) and int(lengths.max()) > _MAX_ESCAPED_BYTES_PER_CHAR * limits.max_chars:
        after = data[int(quotes[1::2][int(lengths.argmax())]) + 1:].lstrip()[:1]
        if after == b":":  # a key: no field of the request is to blame
            raise ClientError(f"A key of the body is longer than {limits.max_chars} characters; the fields are "
                              "'task' and 'inputs'.", "body", "max_chars")
        raise ClientError(f"A string of the body is longer than {limits.max_chars} characters; shorten it.",
                          "inputs", "max_chars")
    outside = (np.cumsum(raw == _QUOTE, dtype=np.int32) % 2 == 0) & (raw != _QUOTE)
    step = (np.isin(raw, _OPEN).astype(np.int32) - np.isin(raw, _CLOSE)) * outside
    depth = np.cumsum(step, dtype=np.int32)
    if len(depth) and int(depth.max()) > limits.max_depth:
        raise ClientError(f"The body nests objects and lists {int(depth.max())} deep; at most {limits.max_depth} "
                          "(the deepest task row needs 8).", "body", "max_depth")
    rows = int(np.count_nonzero((raw == _COMMA) & outside & (depth == 2))) + 1
    if rows > limits.max_rows:
        raise ClientError(f"'inputs' holds {rows} rows; at most {limits.max_rows} per request (split the "
                          "request), the limit the server was started with (`--max-rows N`).", "inputs", "max_rows",
                          413)


def parse(data: bytes, limits: Limits) -> Any:
    """The JSON value of a body within `limits` (checked by `scan` first); ClientError otherwise."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ClientError(f"The body is not UTF-8: byte {err.start} is invalid ({err.reason}).", "body",
                          "utf-8") from err
    scan(data, limits)
    try:
        return json.loads(text, parse_constant=_no_constant, parse_float=_finite_float, parse_int=_short_int,
                          object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as err:
        raise ClientError(f"The body is not JSON: {err}; send {{\"task\": ..., \"inputs\": [...]}}.", "body",
                          "json") from err


MAX_INT_DIGITS = 64
"""Digits of an integer literal: a row's numbers are ids and labels; Python's own int parsing refuses beyond 4,300
digits with a ValueError that is not a JSON error, and is quadratic in the digits below that."""


def _no_constant(name: str) -> None:
    raise ClientError(f"The body holds the literal {name}, which JSON does not allow; send a number or a string.",
                      "body", "finite_numbers")


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ClientError(f"The body holds the number {text[:40]}, too large for a float (it would be infinite); "
                          "send a finite number.", "body", "finite_numbers")
    return value


def _short_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ClientError(f"The body holds an integer of {len(text.lstrip('-'))} digits; at most {MAX_INT_DIGITS}.",
                          "body", "max_int_digits")
    return int(text)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object's dict; a key given twice is refused (parsers disagree on which one counts)."""
    found = dict(pairs)
    if len(found) < len(pairs):
        twice = repeated_key(pairs)
        raise ClientError(f"The body gives the key {twice[:80]!r} twice in one object; give each key once.", "body",
                          "unique_keys")
    return found


def check_strings(value: Any, max_chars: int, path: str = "") -> None:
    """Every string in `value` is valid Unicode (no lone surrogate) and at most `max_chars` long."""
    if isinstance(value, str):
        if len(value) > max_chars:
            where = _shown_field(path)
            raise ClientError(f"{where} holds {len(value)} characters; at most {max_chars} (the model reads no "
                              "further).", where, "max_chars")
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as err:
                where = _shown_field(path)
                raise ClientError(f"{where} holds a lone surrogate (\\u{ord(value[err.start]):04x}) at character "
                                  f"{err.start}: not a Unicode character.", where, "unicode") from err
    elif isinstance(value, dict):
        for key, item in value.items():
            check_strings(key, max_chars, f"{path}.{key}" if path else str(key))
            check_strings(item, max_chars, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            check_strings(item, max_chars, f"{path}[{i}]")


def _shown_field(path: str) -> str:
    """The field a refusal names: `path` with a key's lone surrogate escaped (a refusal's JSON must encode), computed
    only when refusing, not for every string a request holds."""
    return (path or "body").encode("utf-8", "backslashreplace").decode()
