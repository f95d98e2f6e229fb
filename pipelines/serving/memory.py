"""Give the heap that loading freed back to the operating system (glibc), so a replica's resident memory is what it
holds, not what it once held.

Loading 1,000 capsules reads each one into tensors and Python objects of its own (its module, its metadata, its
head, the base model's fingerprint with that head in place) that the bank then stacks and drops: many small
allocations, freed but kept by glibc's allocator for reuse, which the replica's resident memory still counts
(MiniLM: about 10 KB per capsule beyond its values, measured). `malloc_trim(0)` returns the free pages.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable


@functools.cache
def _trim() -> Callable[[int], int] | None:
    """glibc's `malloc_trim`, or None where the C library has none (macOS, musl)."""
    name = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    except OSError:
        return None


def release_freed_heap() -> bool:
    """Return the heap's free pages to the operating system; whether the C library could."""
    trim = _trim()
    if trim is None:
        return False
    trim(0)
    return True


def resident_mb() -> float:
    """This process's resident memory (RSS), MiB."""
    import psutil

    return psutil.Process().memory_info().rss / 2**20
