"""The base of the local services: start (optionally without waiting), wait until ready, stop."""

from __future__ import annotations

from types import TracebackType
from typing import Self


class ManagedService:
    """What both services share: ``start(wait=False)`` then ``wait_ready()`` lets several start at
    once; ``with Service(...) as s:`` starts, waits and stops."""

    def start(self, wait: bool = True) -> Self:
        """Launch the service; with ``wait``, also :meth:`wait_ready`."""
        raise NotImplementedError

    def wait_ready(self) -> Self:
        """Block until the launched service answers; stop it and raise ServiceError if it cannot."""
        raise NotImplementedError

    def stop(self) -> None:
        """Stop the service; a no-op when it is not running."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

