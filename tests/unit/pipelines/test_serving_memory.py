"""A replica gives back the heap that loading its capsules freed (`pipelines.serving.memory`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from pipelines.serving.memory import REPLICA_HEAP_ENV, release_freed_heap

ROOT = Path(__file__).resolve().parents[3]


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


_IN_A_THREAD = """
import ctypes, threading
from pipelines.serving.memory import release_freed_heap, resident_mb
libc = ctypes.CDLL(None)
libc.open_memstream.restype = ctypes.c_void_p
def heaps():  # glibc's arenas, from malloc_info's XML
    text, size = ctypes.c_char_p(), ctypes.c_size_t()
    stream = ctypes.c_void_p(libc.open_memstream(ctypes.byref(text), ctypes.byref(size)))
    libc.malloc_info(0, stream)
    libc.fclose(stream)
    return ctypes.string_at(text, size.value).decode().count("<heap nr=")
freed = bytearray(8 << 20)
del freed  # a large block freed (a model's load frees many): glibc raises its trim threshold
def load():
    blocks = [bytearray(1024) for _ in range(8_000)]  # 8 MB in small blocks, freed again, as a capsule load does
    del blocks
release_freed_heap()
before = resident_mb()
thread = threading.Thread(target=load)  # Serve runs a replica's constructor in a thread of its own
thread.start()
thread.join()
release_freed_heap()
print(resident_mb() - before, heaps())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's arenas and malloc_trim")
def test_with_the_replicas_heap_settings_what_a_thread_freed_goes_back_too() -> None:
    """With `REPLICA_HEAP_ENV`, the settings a replica starts with, a thread gets no arena of its own (malloc_info
    shows one heap) and what it freed goes back through malloc_trim. Without it, glibc gives a new thread an arena
    of its own, and what the thread freed may stay resident (8.5 MB of 8 here in most runs, 0.5 MB in others: glibc
    trims a thread's arena now and then by itself)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    done = subprocess.run([sys.executable, "-c", _IN_A_THREAD], env={**clean, **REPLICA_HEAP_ENV}, cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=True)
    kept, heaps = done.stdout.split()
    assert int(heaps) == 1 and float(kept) < 2, done.stdout
    default = subprocess.run([sys.executable, "-c", _IN_A_THREAD], env=clean, cwd=ROOT, capture_output=True,
                             text=True, timeout=60, check=True)
    assert int(default.stdout.split()[1]) == 2, "without the setting the thread has an arena of its own"
