"""A full disk ends a job with one paragraph, its last complete checkpoint kept and no partial one left.

Writes fail in several shapes when the device is full: an `OSError` (ENOSPC, EDQUOT, or EFBIG under a file
size limit), safetensors' `SafetensorError`, and torch's serialiser's RuntimeError ("file write failed",
`inline_container.cc`), the last two carrying no errno. `is_no_space` recognises all of them, so that the job
can report the one cause the user can act on.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator
from pathlib import Path

from capt.errors import CaptError

NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
"""The errnos of a write that found no room."""
NO_SPACE_TEXTS = ("No space left on device", "Disk quota exceeded", "File too large", "file write failed")
"""What the libraries that raise without an errno say instead."""


class NoSpaceError(CaptError, OSError):
    """The output folder's device is full; the message says what was kept and how to go on."""


def is_no_space(err: BaseException | None) -> bool:
    """Whether `err`, or an error it was raised from, is a write that found no room."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in NO_SPACE_ERRNOS:
            return True
        if any(text in str(err) for text in NO_SPACE_TEXTS):
            return True
        err = err.__cause__ or err.__context__
    return False


@contextlib.contextmanager
def no_space_reported(folder: Path) -> Iterator[None]:
    """Turn a full disk while the job in `folder` runs into one `NoSpaceError` paragraph."""
    try:
        yield
    except Exception as err:
        if isinstance(err, NoSpaceError) or not is_no_space(err):
            raise
        latest = folder / "checkpoints" / "latest"
        kept = (f"the last complete checkpoint, {latest}, is kept" if (latest / "loop_state.json").is_file()
                else "no checkpoint was complete yet")
        raise NoSpaceError(
            f"No space left on the device of output_dir={folder} (the job stopped writing: "
            f"{' '.join(str(err).split())[:200]}); {kept} and no partial file is left. Free space (`df -h "
            f"{folder}`) or give output_dir another device, then run the job again with train.resume=true."
        ) from err
