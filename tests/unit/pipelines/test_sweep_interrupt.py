"""SIGINT and SIGTERM take one path through a sweep: the first asks Tune to stop (or unwinds when Tune is not
running), the second unwinds at once; the exit status is 128 + the first signal's number."""

from __future__ import annotations

import os
import signal

import pytest

from pipelines.sweeps.interrupt import STOP_SIGNALS, SweepInterrupted, stop_on_signals


@pytest.fixture
def no_tune_handler():
    previous = signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    yield
    signal.signal(signal.SIGUSR1, previous)


def test_the_first_signal_asks_tune_to_stop_and_the_second_unwinds(no_tune_handler):
    asked = []
    with stop_on_signals() as stop:
        assert os.environ["TUNE_DISABLE_SIGINT_HANDLER"] == "1", "Tune's own SIGINT handler would count apart"
        signal.signal(signal.SIGUSR1, lambda signum, frame: asked.append(signum))  # as Tune does while it runs
        os.kill(os.getpid(), signal.SIGTERM)
        assert asked == [signal.SIGTERM] and stop.signum == signal.SIGTERM
        with pytest.raises(SweepInterrupted) as second:
            os.kill(os.getpid(), signal.SIGINT)
        with pytest.raises(SweepInterrupted):
            stop.raise_if_stopped()
    assert second.value.signum == signal.SIGTERM and second.value.exit_status == 143
    assert str(second.value) == "SIGTERM"


def test_outside_tune_the_first_signal_unwinds_and_the_old_handlers_come_back(no_tune_handler):
    before = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    with pytest.raises(SweepInterrupted) as stopped, stop_on_signals():
        os.kill(os.getpid(), signal.SIGINT)
    assert stopped.value.exit_status == 130
    assert {signum: signal.getsignal(signum) for signum in STOP_SIGNALS} == before
    assert "TUNE_DISABLE_SIGINT_HANDLER" not in os.environ


def test_no_signal_no_stop(no_tune_handler):
    with stop_on_signals() as stop:
        stop.raise_if_stopped()
    assert stop.signum is None
