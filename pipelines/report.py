"""The paper's results table of an experiment's MLflow runs (`pipelines.reporting`), printed and written.

    python -m pipelines.report --experiment capt-t5-base [--tracking-uri URI] [--out reports]
                               [--metric test_score] [--sweep NAME]

Writes ``DIR/report.md`` (also printed) and ``DIR/report.png``; exit 2 with one paragraph when no report can be built
(no server, no finished run, a folder it cannot write).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipelines.cli_errors import cli_main
from pipelines.reporting import build_report, check_writable_folder


def main(argv: list[str] | None = None) -> int:
    """CLI: print the Markdown tables; exit 2 with a clear message when no report can be built."""
    parser = argparse.ArgumentParser(prog="python -m pipelines.report", description=__doc__.split("\n")[0])
    parser.add_argument("--experiment", required=True, help="MLflow experiment name")
    parser.add_argument("--tracking-uri", default=None,
                        help="default: MLFLOW_TRACKING_URI, else the local store outputs/mlflow that `make demo` wrote")
    parser.add_argument("--out", default="reports", help="output directory (default: reports)")
    parser.add_argument("--metric", default="test_score", help="run metric to tabulate (default: test_score)")
    parser.add_argument("--sweep", default=None, help="only runs tagged with this sweep")
    return cli_main(parser, argv, _report_from_cli)


def _report_from_cli(args: argparse.Namespace) -> int:
    from pipelines.services.mlflow_server import tracking_store

    check_writable_folder(Path(args.out))  # before a local MLflow server is started for the command
    with tracking_store(args.tracking_uri) as store:
        print(f"Tracking store: {store.origin}", file=sys.stderr)
        text, md_path, png_path = build_report(args.experiment, store.uri, args.out, args.metric, args.sweep)
    print(text)
    print(f"Wrote {md_path} and {png_path}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
