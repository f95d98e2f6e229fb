"""The command line: ``python -m pipelines.tracking sync --root DIR [--tracking-uri URI]``."""

from __future__ import annotations

import argparse
import os

from pipelines.cli_errors import cli_main
from pipelines.services.mlflow_probe import check_mlflow_server
from pipelines.tracking.client import TrackingError
from pipelines.tracking.spool import FAILED_FILE, PENDING_FILE, RetryPolicy
from pipelines.tracking.sync import FolderSync, SyncSummary, sync_pending

DESCRIPTION = "MLflow tracking: runs, metrics, artifacts, the capsule pyfunc and the Model Registry."
EXIT_INCOMPLETE = 1
"""Exit status when some operation is still pending or dead-lettered."""


def main(argv: list[str] | None = None) -> int:
    """`python -m pipelines.tracking sync --root DIR [--tracking-uri URI]`."""
    parser = argparse.ArgumentParser(prog="python -m pipelines.tracking", description=DESCRIPTION)
    commands = parser.add_subparsers(dest="command", required=True)
    sync = commands.add_parser("sync", help="upload the operations spooled while the server was down")
    sync.add_argument("--root", required=True, help="a trial's state dir or any folder above several")
    sync.add_argument("--tracking-uri", default=None, help="override the URI recorded with each operation")
    sync.add_argument("--retry-s", type=float, default=30.0, help="retry budget per trial (seconds)")
    return cli_main(parser, argv, lambda args: sync_command(args.root, args.tracking_uri, args.retry_s),
                    expected=(TrackingError,), debug_on=sync)


def sync_command(root: str, tracking_uri: str | None, retry_s: float) -> int:
    """Run the sync, print its summary; 0 when everything reached the server, 1 when not.

    A bad root or a `--tracking-uri` that is down or not MLflow raises (the entry point prints it, exit 2).
    """
    if tracking_uri:  # checked before anything is replayed (otherwise each trial's recorded URI is used)
        check_mlflow_server(tracking_uri, "MLflow tracking server (--tracking-uri)")
    summary = sync_pending(root, tracking_uri, RetryPolicy(budget_s=retry_s))
    print(summary_text(summary))
    return 0 if summary.complete else EXIT_INCOMPLETE


def summary_text(summary: SyncSummary) -> str:
    """Totals, one line per folder with anything left or any error, and what to do about what is left."""
    if not summary.folders:
        return f"Nothing to sync under {summary.root}: no {PENDING_FILE} or {FAILED_FILE} there."
    lines = [f"Synced {summary.synced} operation(s) under {summary.root}; dead-lettered {summary.dead_lettered}; "
             f"{summary.pending} still pending."]
    lines += [_folder_line(summary, folder) for folder in summary.folders
              if folder.pending or folder.dead_letters or folder.error]
    if summary.pending:
        lines.append(f"Pending operations stay in each folder's {PENDING_FILE}: run this command again once "
                     "the server answers (or fix the error shown).")
    if summary.dead_letters:
        lines.append(f"{summary.dead_letters} dead-lettered operation(s) or line(s) are kept, with the reason, "
                     f"in {FAILED_FILE}: they are never replayed automatically. Fix the cause, move the "
                     f"operations back into {PENDING_FILE} (or log them by hand), then delete the entries.")
    return "\n".join(lines)


def _folder_line(summary: SyncSummary, folder: FolderSync) -> str:
    name = os.path.relpath(folder.state_dir, summary.root)
    text = (f"  {name}: {folder.synced} synced, {folder.dead_lettered} dead-lettered now "
            f"({folder.dead_letters} in {FAILED_FILE}), {folder.pending} still pending")
    return text + (f" ({folder.error})" if folder.error else "")
