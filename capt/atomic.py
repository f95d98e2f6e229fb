"""`write_atomically`: the one way the project replaces a file that a crash must never leave half-written."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


def write_atomically(target: str | os.PathLike[str], content: str | bytes | Callable[[str], None]) -> Path:
    """Write `target` through `<target>.tmp` and a rename, so a crash leaves the old file or the whole new one.

    `content` is the text (UTF-8) or bytes, flushed and fsynced before the rename, or a function that
    writes the file at the path it is given (e.g. safetensors' `save_file`). Returns `target` as a Path.
    """
    target = Path(target)
    tmp = target.with_name(target.name + ".tmp")
    try:
        if callable(content):
            content(str(tmp))
        else:
            with tmp.open("wb") as handle:
                handle.write(content.encode("utf-8") if isinstance(content, str) else content)
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target
