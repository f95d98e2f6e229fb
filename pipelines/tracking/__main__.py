"""The command line: ``python -m pipelines.tracking sync --root DIR [--tracking-uri URI] [--moved-from URI]
[--accept-unrecorded]``: replay what the trials spooled under DIR (`pipelines.tracking.sync`), print its summary."""

from __future__ import annotations

import argparse
import math
import os
import sys

from pipelines.cli_errors import cli_main
from pipelines.services.mlflow_server import check_mlflow_server
from pipelines.tracking.client import TrackingError
from pipelines.tracking.spool import FAILED_FILE, PENDING_FILE, RetryPolicy
from pipelines.tracking.sweep_run import SWEEP_CLOSE_FILE, lines_left
from pipelines.tracking.sync import SweepRunSync, SyncSummary, checked_root, sync_pending


def main(argv: list[str] | None = None) -> int:
    """`python -m pipelines.tracking sync --root DIR [--tracking-uri URI] [--moved-from URI] [--accept-unrecorded]`."""
    parser = argparse.ArgumentParser(prog="python -m pipelines.tracking", description="MLflow tracking: runs, "
                                     "metrics, artifacts, the capsule pyfunc and the Model Registry.")
    commands = parser.add_subparsers(dest="command", required=True)
    sync = commands.add_parser("sync", help="upload the operations spooled while the server was down, "
                                                "then close the sweeps' runs it left open")
    sync.add_argument("--root", required=True,
                      help="a job folder, a sweep folder, or a folder at most two levels above them")
    sync.add_argument("--tracking-uri", default=None,
                      help="sync to this server only: operations recorded for another server are skipped "
                           "(default: each operation goes to the server recorded with it)")
    sync.add_argument("--moved-from", action="append", default=[], metavar="URI",
                      help="with --tracking-uri: also replay operations recorded for URI, the same server at its "
                           "former address (repeatable)")
    sync.add_argument("--accept-unrecorded", action="store_true",
                      help="also replay operations recorded for no server, into --tracking-uri "
                           "(else MLFLOW_TRACKING_URI)")
    sync.add_argument("--retry-s", type=float, default=30.0, help="retry budget per trial (seconds)")
    return cli_main(parser, argv, sync_command, expected=(TrackingError,), debug_on=sync)


def sync_command(args: argparse.Namespace) -> int:
    """Run the sync, print its summary; 0 when everything reached the server, 1 when not.

    A bad root, a bad option or a `--tracking-uri` that is down or not MLflow raises (the entry point prints it,
    exit 2); the root is checked first, the server before anything is replayed.
    """
    problems = []  # every bad option at once, before the root's folders or a server are read
    if not math.isfinite(args.retry_s):
        problems.append(f"--retry-s {args.retry_s}: not a finite number of seconds (e.g. --retry-s 30).")
    if args.moved_from and not args.tracking_uri:
        problems.append("--moved-from needs --tracking-uri: the server those operations now go to.")
    try:
        checked_root(args.root)
    except TrackingError as err:
        problems.append(str(err))
    if problems:
        raise TrackingError(" ".join(problems))
    if args.tracking_uri:
        check_mlflow_server(args.tracking_uri, "MLflow tracking server (--tracking-uri)")
    summary = sync_pending(args.root, args.tracking_uri, RetryPolicy(budget_s=args.retry_s),
                           moved_from=tuple(args.moved_from), accept_unrecorded=args.accept_unrecorded)
    print(summary_text(summary))
    return 0 if summary.complete else 1  # 1: some operation is still pending or dead-lettered


def summary_text(summary: SyncSummary) -> str:
    """Totals, one line per folder with anything left, skipped or failed, what to do about it, the sweeps' runs
    (closed, and what is left to do then; or why not) and the links that were not followed."""
    if not summary.folders and not summary.sweeps:
        lines = [f"Nothing to sync under {summary.root}: no {PENDING_FILE}, {FAILED_FILE} or {SWEEP_CLOSE_FILE} there."]
    else:
        lines = _spool_lines(summary) if summary.folders else []
        for sweep in summary.sweeps:
            lines += _sweep_lines(sweep)
    if summary.links:
        names = [os.path.relpath(link, summary.root) for link in summary.links]
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        lines.append(f"{len(names)} symbolic link(s) under {summary.root} were not followed (sync never leaves "
                     f"--root): {shown}. Sync their targets with a --root of their own.")
    return "\n".join(lines)


def _spool_lines(summary: SyncSummary) -> list[str]:
    """The totals of the trials' spools, one line per folder with anything left, and what to do about it."""
    target = summary.server.target or "the server recorded with each operation"
    skipped = f" ({summary.skipped} of them skipped, not for this server)" if summary.skipped else ""
    lines = [f"Synced {summary.synced} operation(s) under {summary.root} to {target}; dead-lettered "
             f"{summary.dead_lettered}; {summary.pending} still pending{skipped}."]
    for folder in summary.folders:
        if folder.pending or folder.dead_letters or folder.error or folder.skipped:
            why = f" (skipped: {folder.skipped})" if folder.skipped else f" ({folder.error})" if folder.error else ""
            lines.append(f"  {os.path.relpath(folder.state_dir, summary.root)}: {folder.synced} synced, "
                         f"{folder.dead_lettered} dead-lettered now ({folder.dead_letters} in {FAILED_FILE}), "
                         f"{folder.pending} still pending{why}")
    if summary.skipped:
        lines.append("Skipped folders were left untouched: an operation goes only to the server it was recorded "
                     "for (each folder's reason says how to sync it).")
    if summary.pending > summary.skipped:
        lines.append(f"Pending operations stay in each folder's {PENDING_FILE}: run this command again once "
                     "the server answers (or fix the error shown).")
    if summary.dead_letters:
        lines.append(f"{summary.dead_letters} dead-lettered operation(s) or line(s) are kept, with the reason, "
                     f"in {FAILED_FILE}: they are never replayed automatically. Fix the cause, move the "
                     f"operations back into {PENDING_FILE} (or log them by hand), then delete the entries.")
    return lines


def _sweep_lines(sweep: SweepRunSync) -> list[str]:
    """Whether the sweep's run was closed, and what is left to do then; or why it was not, and what to do."""
    run = f"The sweep's run{f' {sweep.close.run_id}' if sweep.close else ''} in {sweep.sweep_dir}"
    if sweep.uri is not None:
        return [f"{run} is closed: {sweep.close.status} at {sweep.uri}, with its summary and description.",
                *lines_left(sweep.close, sweep.uri)]
    if sweep.skipped:
        return [f"{run} was not closed (skipped: {sweep.skipped})."]
    if sweep.error:
        return [f"{run} was not closed: {sweep.error}. Its close stays in {SWEEP_CLOSE_FILE}: run this command "
                "again once that is fixed."]
    return [f"{run} is closed once its trials' {sweep.waiting} pending operation(s) are synced: run this command "
            "again then."]


if __name__ == "__main__":
    sys.exit(main())
