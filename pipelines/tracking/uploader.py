"""`BackgroundUploader`: a thread that uploads a trial's spooled metric points while training goes on.

The training thread only appends each metric operation to the spool (a durable, fsynced line); this
thread then replays the spool against the server. A crash at any moment therefore loses nothing the
spool would not have kept anyway: a point either reached the server or is still in the spool (the
restarted trial, or ``python -m pipelines.tracking sync``, uploads it), and a replay drops a line only
once it was applied or dead-lettered.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

logger = logging.getLogger(__name__)


class BackgroundUploader:
    """Runs `upload` on a daemon thread each time `wake` is called (wakes coalesce); `close` flushes.

    `upload` must never raise for tracking problems (the tracker spools or dead-letters them); anything
    it still raises is a bug, kept in `errors` for the tracker to report at finish, and the thread goes on.
    """

    def __init__(self, upload: Callable[[], None], name: str) -> None:
        self._upload = upload
        self._name = name
        self._wake = threading.Event()
        self._closing = False
        self._thread: threading.Thread | None = None
        self.errors: list[str] = []
        """Unexpected exceptions of `upload`, as ``Type: message``."""

    def wake(self) -> None:
        """Ask for an upload soon (starts the thread on first use)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
            self._thread.start()
        self._wake.set()

    def close(self) -> None:
        """Let the thread finish the upload it may be doing, then stop it (the caller replays the rest)."""
        if self._thread is None:
            return
        self._closing = True
        self._wake.set()
        self._thread.join()
        self._thread = None

    def _loop(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._closing:
                return
            try:
                self._upload()
            except Exception as exc:  # noqa: BLE001 - reported at finish; the points stay spooled
                logger.error("Background MLflow upload (%s) failed: %s", self._name, exc, exc_info=exc)
                self.errors.append(f"{type(exc).__name__}: {exc}")
