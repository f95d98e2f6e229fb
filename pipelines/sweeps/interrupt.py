"""Ctrl-C and SIGTERM stop a sweep cleanly; a second one stops it at once.

Tune stops a run gracefully on SIGINT (or SIGUSR1): the running trials are stopped, the experiment state is
saved, `Tuner.fit` returns. SIGTERM, what `kill`, schedulers and container runtimes send, is left to the
process's default, and Ray's core installs a handler that dumps a C++ stack and aborts. Here both signals take
one path: the first asks Tune to stop through the handler it installs for SIGUSR1 while it runs (or, before and
after Tune runs, unwinds at once), the second raises `SweepInterrupted` wherever the driver is, and the
`with` blocks around it stop the local MLflow server and Ray. Tune's own SIGINT handler is switched off
(`TUNE_DISABLE_SIGINT_HANDLER`) so that the two signals count alike.
"""

from __future__ import annotations

import contextlib
import logging
import signal
from collections.abc import Iterator
from dataclasses import dataclass

from pipelines.services.ray_connect import environ

logger = logging.getLogger("pipelines.sweep")

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
"""The signals that stop a sweep."""


class SweepInterrupted(BaseException):  # a BaseException, so that no `except Exception` on the way eats it
    """A stop signal ended the sweep; `signum` is the first one received."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_status(self) -> int:
        """128 + the signal's number, as a shell reports a process that a signal stopped (130, 143)."""
        return 128 + self.signum


@dataclass
class StopRequest:
    """What the handler saw: the first stop signal (None until one arrives) and how many arrived."""

    signum: int | None = None
    """The first stop signal received."""
    count: int = 0
    """Stop signals received so far."""

    def handle(self, signum: int, frame) -> None:
        """First signal: ask Tune to stop when it runs, else unwind now; second: unwind now."""
        self.count += 1
        self.signum = self.signum or signum
        tune_stop = signal.getsignal(signal.SIGUSR1)  # installed by Tune while `Tuner.fit` runs
        if self.count == 1 and callable(tune_stop):
            logger.warning("%s: stopping the running trials (each keeps its last checkpoint); send it again to stop "
                           "at once", signal.Signals(signum).name)
            tune_stop(signum, frame)
            return
        raise SweepInterrupted(self.signum)

    def install(self) -> None:
        """(Re)install the handler: after `ray.init`, whose core replaces the SIGTERM handler."""
        for signum in STOP_SIGNALS:
            signal.signal(signum, self.handle)

    def raise_if_stopped(self) -> None:
        """After Tune returned: a stop that it honoured ends the sweep like one that arrived outside it."""
        if self.signum is not None:
            raise SweepInterrupted(self.signum)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[StopRequest]:
    """Route SIGINT and SIGTERM through one `StopRequest` for the block (main thread only)."""
    request, previous = StopRequest(), {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    with environ(TUNE_DISABLE_SIGINT_HANDLER="1"):
        request.install()
        try:
            yield request
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
