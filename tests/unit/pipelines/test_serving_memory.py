"""A replica gives back the heap that loading its capsules freed (`pipelines.serving.memory`)."""

from __future__ import annotations

import sys

import psutil
import pytest

from pipelines.serving.memory import release_freed_heap


def _rss_mb() -> float:
    return psutil.Process().memory_info().rss / 2**20


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_freed_heap_below_a_live_block_goes_back_to_the_system() -> None:
    blocks = [bytes(2000) for _ in range(40_000)]  # 80 MB of 2 KB blocks: glibc's heap, not Python's arenas
    above = bytes(2000)  # allocated after them: free() alone cannot shrink the heap past it
    del blocks
    before = _rss_mb()
    assert release_freed_heap()
    assert before - _rss_mb() > 40, "the freed 80 MB stayed resident"
    assert len(above) == 2000
