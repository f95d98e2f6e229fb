"""A 413 names the serve flag that sets the limit it enforces, so whoever runs the server knows what to raise."""

from __future__ import annotations

import asyncio
import json

import pytest

from pipelines.serving.limits import ClientError, Limits, read_body, scan

LIMITS = Limits(max_body_bytes=1024, max_rows=2, max_depth=16, max_chars=100)


async def _chunks(data: bytes):
    yield data


@pytest.mark.parametrize("declared", ["2048", None])
def test_a_body_over_the_cap_names_max_body_bytes(declared: str | None) -> None:
    with pytest.raises(ClientError) as refused:
        asyncio.run(read_body(declared, _chunks(b"x" * 2048), LIMITS.max_body_bytes))
    assert refused.value.status == 413 and refused.value.rule == "max_body_bytes"
    assert "--max-body-bytes" in str(refused.value) and "1024 bytes" in str(refused.value)


def test_too_many_rows_names_max_rows() -> None:
    with pytest.raises(ClientError) as refused:
        scan(json.dumps({"task": "rte", "inputs": [{"a": 1}] * 3}).encode(), LIMITS)
    assert refused.value.status == 413 and "--max-rows" in str(refused.value)
