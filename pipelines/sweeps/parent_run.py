"""The sweep as one MLflow run: opened before the first trial (every trial's run is nested under it) and closed
with the sweep's outcome, holding the resolved sweep config, `summary.md`, `summary.csv`, the folder's README and
the report (`pipelines.report`: tables and picture of the sweep's runs)."""

from __future__ import annotations

import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pipelines.sweeps.config import SweepConfig
from pipelines.sweeps.summary import README, SUMMARY_CSV, SUMMARY_MD

logger = logging.getLogger("pipelines.sweep")
REPORT_DIR = "report"
"""In the sweep folder: report.md and report.png of the finished sweep."""


class SweepRun:
    """The sweep's parent run at `uri` (inactive, doing nothing, when tracking is off or the server did not answer
    when the sweep started)."""

    def __init__(self, sweep: SweepConfig, uri: str | None, experiment_id: str | None, tags: dict[str, str]):
        self.sweep, self.uri, self.run_id = sweep, uri, None
        if uri and experiment_id and "://" not in sweep.storage_path:  # the record lives in a local sweep folder
            from pipelines.tracking.sweep_run import open_sweep_run

            self.run_id = open_sweep_run(uri, experiment_id, self.folder, sweep.name, tags, sweep.tracking.retry_s)

    @property
    def folder(self) -> Path:
        return self.sweep.storage_root() / self.sweep.name

    def nest(self, run_context: dict[str, Any] | None) -> None:
        """Make every trial's run a child of this one (its tags travel in the trials' run context)."""
        if self.run_id is not None and run_context is not None:
            from pipelines.tracking.sweep_run import PARENT_TAG

            run_context["tags"] = {**run_context.get("tags", {}), PARENT_TAG: self.run_id}

    def finish(self, rows: list[dict]) -> None:
        """Write the report, log it with the summary files and the config, end the run: FINISHED when every trial
        is done, FAILED otherwise."""
        if self.run_id is None:
            return
        done = sum(r["status"] == "done" for r in rows)
        files = [self.folder / name for name in (SUMMARY_MD, SUMMARY_CSV, README)] + self._report()
        self._close(files, {"done": done, "failed": len(rows) - done}, "FINISHED" if done == len(rows) else "FAILED")

    def stop(self) -> None:
        """End the run KILLED: the sweep was stopped (`--resume` reopens it)."""
        if self.run_id is not None:
            self._close([], {}, "KILLED")

    def _close(self, files: list[Path], counts: dict[str, int], status: str) -> None:
        from pipelines.tracking.sweep_run import close_sweep_run

        close_sweep_run(self.uri, self.run_id, files, asdict(self.sweep), counts, status, self.sweep.tracking.retry_s)

    def _report(self) -> list[Path]:
        """report.md and report.png of the sweep's finished runs; none (logged) when there is nothing to report."""
        from pipelines.report import ReportError, build_report

        try:
            _, markdown, picture = build_report(self.sweep.experiment_name(), self.uri, self.folder / REPORT_DIR,
                                                sweep=self.sweep.name)
        except ReportError as err:
            logger.info("No report for the sweep's parent run: %s", err)
            return []
        return [markdown, picture]
