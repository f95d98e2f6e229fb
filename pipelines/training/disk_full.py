"""A full disk ends a job with one paragraph, its last complete checkpoint kept and no partial one left.

Writes fail in several shapes when the device is full: an `OSError` (ENOSPC, EDQUOT, or EFBIG under a file
size limit), safetensors' `SafetensorError`, and torch's serialiser's RuntimeError ("file write failed",
`inline_container.cc`), the last two carrying no errno. `is_no_space` recognises all of them, so that the job
can report the one cause the user can act on.
"""

from __future__ import annotations

import contextlib
import errno
import shutil
from collections.abc import Iterator
from pathlib import Path

from capt.errors import CaptError
from pipelines.training.checkpoint import LATEST_CHECKPOINT, LOOP_FILE

NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
"""The errnos of a write that found no room."""
NO_SPACE_TEXTS = ("No space left on device", "Disk quota exceeded", "File too large", "file write failed")
"""What the libraries that raise without an errno say instead."""
SERIALISER_TEXTS = ("basic_ios::clear", "enforce fail at inline_container.cc")
"""What torch's serialiser says when a write fails for any cause: a full disk only where the device is nearly full."""
NEARLY_FULL_BYTES = 1 << 20
"""Free bytes under which a failed serialiser write is taken for a full disk (the failures seen: 16-56 KB free)."""


class NoSpaceError(CaptError, OSError):
    """The output folder's device is full; the message says what was kept and how to go on."""


def is_no_space(err: BaseException | None, folder: Path | None = None) -> bool:
    """Whether `err`, or an error it was raised from, is a write that found no room; with `folder`, also a failed
    serialiser write (a C++ stream error naming no cause) while the folder's device is nearly full."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in NO_SPACE_ERRNOS:
            return True
        if any(text in str(err) for text in NO_SPACE_TEXTS):
            return True
        if folder is not None and any(text in str(err) for text in SERIALISER_TEXTS) and _nearly_full(folder):
            return True
        err = err.__cause__ or err.__context__
    return False


def _nearly_full(folder: Path) -> bool:
    """Whether the device holding `folder` (or its nearest existing parent) has under `NEARLY_FULL_BYTES` free."""
    existing = next((p for p in (folder, *folder.parents) if p.exists()), None)
    try:
        return existing is not None and shutil.disk_usage(existing).free < NEARLY_FULL_BYTES
    except OSError:
        return False


@contextlib.contextmanager
def no_space_reported(folder: Path) -> Iterator[None]:
    """Turn a full disk while the job in `folder` runs into one `NoSpaceError` paragraph."""
    try:
        yield
    except Exception as err:
        if isinstance(err, NoSpaceError) or not is_no_space(err, folder):
            raise
        latest = folder / LATEST_CHECKPOINT
        kept = (f"the last complete checkpoint, {latest}, is kept" if (latest / LOOP_FILE).is_file()
                else "no checkpoint was complete yet")
        raise NoSpaceError(
            f"No space left on the device of output_dir={folder} (the job stopped writing: "
            f"{' '.join(str(err).split())[:200]}); {kept} and no partial file is left. Free space (`df -h "
            f"{folder}`) or give output_dir another device, then run the job again with train.resume=true."
        ) from err
