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

from pipelines.services.ray_connect import environment_values

REPLICA_HEAP_ENV = {"MALLOC_ARENA_MAX": "1"}
"""glibc heap settings of a serving replica (Ray runtime_env variables; glibc reads them when the process starts).

Serve runs a replica's constructor, and so the reading of every capsule, in a thread of its own, which glibc gives
an arena of its own; `malloc_trim` returns the free pages inside a thread arena but never its top, where what
loading freed ends up. With one arena, every thread allocates from the main heap, whose top `malloc_trim` returns
too. Measured in process, 1,000 tiny-t5 capsules read in a thread: 1.38-1.56 MB once loaded with the default
arenas, 1.06-1.07 MB with one (as when read in the main thread)."""


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


def heap_in_force() -> dict[str, str]:
    """The `REPLICA_HEAP_ENV` settings this process started with (GET /tasks shows them)."""
    return environment_values(REPLICA_HEAP_ENV)


def resident_mb() -> float:
    """This process's resident memory (RSS), MiB."""
    import psutil

    return psutil.Process().memory_info().rss / 2**20
