"""The sweep as one MLflow run: opened before the first trial (every trial's run is nested under it) and closed
with the sweep's outcome, holding the resolved sweep config, `summary.md`, `summary.csv`, the folder's README and
the report (`pipelines.report`: tables and picture of the sweep's runs). Its description (what the MLflow UI shows
first on the run's page) is the results table of `summary.md` with links to the report's artifacts, so the results
are there without opening Artifacts. A close the server does not take is kept in the sweep folder, with the
champions and the report the outage left undone, for ``python -m pipelines.tracking sync``."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipelines.sweeps.config import SweepConfig
from pipelines.sweeps.summary import README, SUMMARY_CSV, SUMMARY_MD, summary_markdown

if TYPE_CHECKING:
    from pipelines.tracking.sweep_run import SweepClose

logger = logging.getLogger("pipelines.sweep")
REPORT_DIR = "report"
"""In the sweep folder: report.md and report.png of the finished sweep."""
DESCRIPTION_LIMIT = 7500
"""Characters of the run's description: MLflow keeps at most 8,000 in a tag, so a long table is cut (summary.md in
Artifacts has every row)."""
CUT_NOTE = "\n\n(Cut here to fit MLflow's description: `summary.md` in Artifacts has every row.)"


class SweepRun:
    """The sweep's parent run at `uri` (inactive, doing nothing, when tracking is off or the server did not answer
    when the sweep started)."""

    def __init__(self, sweep: SweepConfig, uri: str | None, experiment_id: str | None, tags: dict[str, str]):
        self.sweep, self.uri, self.experiment_id, self.run_id = sweep, uri, experiment_id, None
        self.folder = sweep.folder()
        if uri and experiment_id and "://" not in sweep.storage_path:  # the record lives in a local sweep folder
            from pipelines.tracking.run_content import DESCRIPTION_TAG
            from pipelines.tracking.sweep_run import open_sweep_run

            running = (f"Sweep `{sweep.name}` has not ended yet: its results table and report appear here when it "
                       "does; meanwhile its trials' runs are nested under this one (+ in the runs table).")
            self.run_id = open_sweep_run(uri, experiment_id, self.folder, sweep.name,
                                         {**tags, DESCRIPTION_TAG: running}, sweep.tracking.retry_s)

    def nest(self, run_context: dict[str, Any] | None) -> None:
        """Make every trial's run a child of this one (its tags travel in the trials' run context)."""
        if self.run_id is not None and run_context is not None:
            from pipelines.tracking.sweep_run import PARENT_TAG

            run_context["tags"] = {**run_context.get("tags", {}), PARENT_TAG: self.run_id}

    def finish(self, rows: list[dict], unpromoted: Iterable[tuple[str, str]] = ()) -> None:
        """Write the report, log it with the summary files and the config, end the run: FINISHED when every trial
        is done, FAILED otherwise. When the server does not take it, the close is kept for `sync` with what the
        outage left undone: the (model, task) champions in `unpromoted`, and the report if it could not be built."""
        if self.run_id is None:
            return
        done = sum(r["status"] == "done" for r in rows)
        report, why = self._report()
        files = [self.folder / name for name in (SUMMARY_MD, SUMMARY_CSV, README)] + report
        status = "FINISHED" if done == len(rows) else "FAILED"
        close = self._close_of(files, {"done": done, "failed": len(rows) - done}, status,
                               self.description(rows, [path.name for path in report], why))
        if self._closed(close):
            return
        close.promote = [[model, task] for model, task in unpromoted]
        if not report:  # the server did not answer: the report is built once the trials' runs are synced
            close.report = {"experiment": self.sweep.experiment_name(), "sweep": self.sweep.name,
                            "out": str(self.folder / REPORT_DIR)}
            close.description = self.description(rows, [], "the MLflow server did not answer when the sweep ended")
        self._keep_for_sync(close)

    def description(self, rows: list[dict], report: list[str], why: str = "") -> str:
        """The run's description: links to the report's files (or why there is none), then summary.md's text."""
        # links within the UI (its hash route selects the artifact): they hold wherever the store is served again
        run = f"#/experiments/{self.experiment_id}/runs/{self.run_id}/artifacts"
        links = ", ".join(f"[{name}]({run}/{name})" for name in [*report, SUMMARY_CSV])
        head = (f"**Report** of the sweep's runs (tables and picture, also in Artifacts): {links}." if report else
                f"**No report** ({why or 'nothing to report'}); every trial: {links}.")
        return fit_description(f"{head}\n\n{summary_markdown(self.sweep, rows)}")

    def stop(self) -> None:
        """End the run KILLED: the sweep was stopped (`--resume` reopens it; a `sync` before that closes it)."""
        if self.run_id is not None and not self._closed(close := self._close_of([], {}, "KILLED")):
            self._keep_for_sync(close)

    def _close_of(self, files: list[Path], counts: dict[str, int], status: str,
                  description: str | None = None) -> SweepClose:
        from pipelines.tracking.sweep_run import SweepClose

        return SweepClose(self.run_id, self.uri, status, asdict(self.sweep), counts, description,
                          [str(path.relative_to(self.folder)) for path in files])

    def _closed(self, close: SweepClose) -> bool:
        """Whether the server took `close` (`close_sweep_run`)."""
        from pipelines.tracking.sweep_run import close_sweep_run

        return close_sweep_run(self.folder, close, self.sweep.tracking.retry_s)

    def _keep_for_sync(self, close: SweepClose) -> None:
        from pipelines.tracking.sweep_run import keep_for_sync

        path = keep_for_sync(self.folder, close)
        logger.info("The close of the sweep's run %s waits in %s for `python -m pipelines.tracking sync`",
                    self.run_id, path)

    def _report(self) -> tuple[list[Path], str]:
        """report.md and report.png of the sweep's finished runs; none and why (logged) when there is nothing to
        report."""
        from pipelines.reporting import ReportError, build_report

        try:
            _, markdown, picture = build_report(self.sweep.experiment_name(), self.uri, self.folder / REPORT_DIR,
                                                sweep=self.sweep.name)
        except ReportError as err:
            logger.info("No report for the sweep's parent run: %s", err)
            return [], str(err)
        return [markdown, picture], ""


def fit_description(text: str, limit: int = DESCRIPTION_LIMIT) -> str:
    """`text`, or its first lines and `CUT_NOTE` when it is longer than `limit` characters."""
    if len(text) <= limit:
        return text
    lines = text.splitlines()
    while lines and len("\n".join(lines)) + len(CUT_NOTE) > limit:
        lines.pop()
    return "\n".join(lines) + CUT_NOTE
