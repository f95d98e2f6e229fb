"""The command line: ``python -m pipelines.tracking sync --root DIR [--tracking-uri URI]``."""

from __future__ import annotations

import argparse
import logging
import sys

from pipelines.cli_errors import add_debug_flag, run_cli
from pipelines.services.mlflow_probe import check_mlflow_server
from pipelines.tracking.client import TrackingError
from pipelines.tracking.operations import sync_pending
from pipelines.tracking_spool import PENDING_FILE, RetryPolicy, Spool, TrackingUnavailable, find_state_dirs

DESCRIPTION = "MLflow tracking: runs, metrics, artifacts, the capsule pyfunc and the Model Registry."


def main(argv: list[str] | None = None) -> int:
    """`python -m pipelines.tracking sync --root DIR [--tracking-uri URI]`."""
    parser = argparse.ArgumentParser(prog="python -m pipelines.tracking", description=DESCRIPTION)
    commands = parser.add_subparsers(dest="command", required=True)
    sync = commands.add_parser("sync", help="upload the operations spooled while the server was down")
    sync.add_argument("--root", required=True, help="a trial's state dir or any folder above several")
    sync.add_argument("--tracking-uri", default=None, help="override the URI recorded with each operation")
    sync.add_argument("--retry-s", type=float, default=30.0, help="retry budget per trial (seconds)")
    add_debug_flag(sync)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return run_cli(lambda: _sync(args), args.debug, expected=(TrackingError,))


def _sync(args: argparse.Namespace) -> int:
    if args.tracking_uri:  # checked before anything is replayed (otherwise each trial's recorded URI is used)
        check_mlflow_server(args.tracking_uri, "MLflow tracking server (--tracking-uri)")
    try:
        count = sync_pending(args.root, args.tracking_uri, RetryPolicy(budget_s=args.retry_s))
    except TrackingUnavailable as err:  # nothing lost: the operations stay pending for the next sync
        print(f"error: {err}", file=sys.stderr)
        return 1
    left = sum(len(Spool(d / PENDING_FILE)) for d in find_state_dirs(args.root))
    print(f"Synced {count} operation(s) under {args.root}; {left} still pending.")
    return 0 if left == 0 else 1
