"""Waiting for resources on Ray: `PendingWatch` reports a sweep's trials while their placement groups wait,
and stops the sweep after `resources.pending_timeout_s` (see `pipelines.sweeps.resources` for where a trial
waits and why a PENDING placement group is its only trace).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Any

from pipelines.sweeps.resources import ResourcesError, fmt, runs_in_trial_process, worker_bundle

logger = logging.getLogger(__name__)

LOCAL_PENDING_TIMEOUT_S = 300.0  # resolved default of resources.pending_timeout_s on a local Ray
_STATES = {"INFEASIBLE": "no node of the cluster has these resources (an autoscaler, if any, is asked to add one)",
           "NO_RESOURCES": "nodes with these resources exist but are busy"}


def pending_timeout(resources, local: bool) -> float | None:
    """`resources.pending_timeout_s` resolved: its default for where the sweep runs; None waits forever."""
    value = resources.pending_timeout_s
    if value is None:
        return LOCAL_PENDING_TIMEOUT_S if local else None
    return value or None  # 0: no timeout


class PendingWatch:
    """A driver-side thread that reports the sweep's worker placement groups while they wait and, after
    `timeout_s` with no worker group of the sweep starting, stops Tune gracefully (its state saved for
    --resume, as on Ctrl+C) and keeps the reason in `verdict`.

    The placement groups it watches have the shape [worker bundle] * num_workers: Ray Train's worker groups,
    and for one-worker trials the Tune trial's own placement group (Tune reserves exactly that shape,
    `trial_resources`). A reused trial process keeps its placement group, so its next trial is no new start;
    a wait still ends after two polls in a row with none of these placement groups pending.
    """

    def __init__(self, resources, timeout_s: float | None, poll_s: float = 2.0) -> None:
        self.resources = resources
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self.report_every_s = min(60.0, max(5.0, timeout_s / 3)) if timeout_s else 60.0
        self.verdict: str | None = None
        self._bundle = worker_bundle(resources)
        self._since: float | None = None
        self._reports = 0
        self._clear_polls = 0
        self._started: set[str] = set()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="capt-pending-watch", daemon=True)

    def __enter__(self) -> PendingWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join(timeout=10)

    def raise_if_gave_up(self) -> None:
        """Raise `ResourcesError` with the reason when the watch stopped the sweep."""
        if self.verdict:
            raise ResourcesError(self.verdict)

    def _run(self) -> None:
        while not self._done.wait(self.poll_s):
            try:
                self.check(time.monotonic())
            except Exception:  # a GCS hiccup must not end the sweep: the next poll tries again
                logger.debug("Placement group poll failed", exc_info=True)

    def check(self, now: float, table: dict[str, dict[str, Any]] | None = None) -> None:
        """One poll of the placement group table (`ray.util.placement_group_table()` unless given): track how
        long the sweep's worker groups have waited; report; give up after the timeout."""
        import ray

        table = ray.util.placement_group_table() if table is None else table
        ours = [pg for pg in table.values() if self._is_worker_group(pg)]
        started = {pg["placement_group_id"] for pg in ours if pg["state"] == "CREATED"}
        pending = [pg for pg in ours if pg["state"] in ("PENDING", "RESCHEDULING")]
        if started - self._started:  # a worker group started: the sweep progresses
            self._since = None
        self._started |= started
        # Train replaces a waiting placement group every 60 s: only two clear polls in a row end a wait.
        self._clear_polls = 0 if pending else self._clear_polls + 1
        if self._clear_polls >= 2:
            self._since = None
        if not pending:
            return
        if self._since is None:
            self._since, self._reports = now, 0
        waited = now - self._since
        if self.timeout_s and waited >= self.timeout_s:
            self._give_up(pending, waited)
        elif waited >= (self._reports + 1) * self.report_every_s:
            self._reports += 1
            limit = (f"Giving up at {self.timeout_s:g} s (resources.pending_timeout_s)." if self.timeout_s
                     else "Waiting without limit (resources.pending_timeout_s gives one).")
            text = self._describe(pending, waited)
            logger.warning("%s %s", text[0].upper() + text[1:], limit)

    def _is_worker_group(self, pg: dict[str, Any]) -> bool:
        bundles = list(pg["bundles"].values())
        return len(bundles) == self.resources.num_workers and all(
            set(b) == set(self._bundle) and all(abs(b[k] - v) < 1e-6 for k, v in self._bundle.items())
            for b in bundles)

    def _describe(self, pending: list[dict[str, Any]], waited: float) -> str:
        import ray

        pg = pending[0]
        state = pg["stats"]["scheduling_state"]
        who = "the trial processes" if runs_in_trial_process(self.resources) else "the Ray Train workers"
        text = (f"{who} of {len(pending)} trial(s) have waited {waited:.0f} s for a placement group "
                f"{fmt(self._bundle)} * {self.resources.num_workers} ({pg['strategy']}), the shape an autoscaler is "
                f"asked for; scheduling state {state}: {_STATES.get(state, 'waiting for the scheduler')}.")
        if ray.is_initialized():
            cluster = ray.cluster_resources()
            text += f" The cluster has {fmt({k: cluster.get(k, 0.0) for k in self._bundle})}."
        return text

    def _give_up(self, pending: list[dict[str, Any]], waited: float) -> None:
        self.verdict = (f"resources: gave up after resources.pending_timeout_s={self.timeout_s:g}: "
                        f"{self._describe(pending, waited)} Lower resources.num_workers, cpus_per_worker, "
                        "gpus_per_worker or custom_per_worker, add nodes that have these resources, or raise "
                        "resources.pending_timeout_s (0 waits forever); the sweep's state is saved, so then run the "
                        "same command with --resume.")
        logger.info("Stopping the sweep: its worker resources have been pending for %.0f s", waited)
        self._done.set()
        if callable(signal.getsignal(signal.SIGUSR1)):  # Tune's graceful stop, as on Ctrl+C
            signal.raise_signal(signal.SIGUSR1)
        else:
            logger.error("Tune's stop handler is not installed (Tuner.fit outside the main thread): stop the sweep "
                         "by hand.")
