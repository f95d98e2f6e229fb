"""How every entry point reports an expected failure: one paragraph on stderr, exit status 2.

An expected failure is bad input or an unusable environment the user can fix: a config or data file
that cannot be read, an unknown model, a bad capsule, a server that is down or is not MLflow, an
output folder that cannot be written. Its message already names the key or file and the fix, so a
traceback only hides it; ``--debug`` shows the traceback too. Anything else is a bug and keeps its
traceback (and Python's exit status 1).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from collections.abc import Callable

from capt.errors import CaptError
from pipelines.services.probe import ServiceError

EXIT_BAD_INPUT = 2
"""Exit status of an expected failure (argparse uses 2 for a bad command line too)."""
EXPECTED_ERRORS: tuple[type[BaseException], ...] = (CaptError, ServiceError, ValueError)
"""Failures of every entry point: the project's input errors (`CaptError`, which `PipelineConfigError` and
the task, capsule and artifact errors derive from), services that cannot be reached, and `ValueError`,
which the pre-flight checks raise for an impossible combination of settings."""


QUIET_LOGGERS = ("accelerate.checkpointing", "accelerate.accelerator")
"""Loggers kept at WARNING: Accelerate says at INFO where each file of every checkpoint goes (five lines per save,
dozens in a short job); its warnings and errors still show."""


def configure_logging() -> None:
    """The logging of every entry point: INFO on stderr, one format, `QUIET_LOGGERS` at WARNING."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    quiet_accelerate()


def quiet_accelerate() -> None:
    """`QUIET_LOGGERS` at WARNING, unless the user asked for Accelerate's level with ACCELERATE_LOG_LEVEL."""
    if os.environ.get("ACCELERATE_LOG_LEVEL"):  # accelerate's own switch: the user wants its lines
        return
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def cli_main(parser: argparse.ArgumentParser, argv: list[str] | None, body: Callable[[argparse.Namespace], int],
             expected: tuple[type[BaseException], ...] = (),
             debug_on: argparse.ArgumentParser | None = None) -> int:
    """The one skeleton of every entry point's ``main``: parse `argv` (argparse exits 2 on a bad command
    line), log at INFO, run ``body(args)`` and return its exit status; an expected failure (see `run_cli`)
    is printed as one paragraph and gives `EXIT_BAD_INPUT`. ``--debug`` goes on `debug_on` (a subcommand's
    parser), else on `parser`.
    """
    add_debug_flag(debug_on or parser)
    args = parser.parse_args(argv)
    configure_logging()
    return run_cli(lambda: body(args), args.debug, expected)


def add_debug_flag(parser: argparse.ArgumentParser) -> None:
    """The ``--debug`` option every entry point has."""
    parser.add_argument("--debug", action="store_true",
                        help="on an expected error, also print the traceback (for bug reports)")


def run_cli(body: Callable[[], int], debug: bool, expected: tuple[type[BaseException], ...] = ()) -> int:
    """``body()``'s exit status; an expected failure is printed as one paragraph and gives `EXIT_BAD_INPUT`.

    `expected` adds an entry point's own error types (e.g. a tracking error where a server is used).
    """
    try:
        return body()
    except (*EXPECTED_ERRORS, *expected) as err:
        if debug:
            traceback.print_exc()
        known = isinstance(err, (CaptError, ServiceError, *expected))
        print(error_paragraph(err, known), file=sys.stderr)
        return EXIT_BAD_INPUT


def error_paragraph(err: BaseException, known: bool = True) -> str:
    """``error: <message>`` with blank lines dropped, so that it stays one paragraph.

    An error that is not `known` (a plain ValueError, perhaps from a library) also gets the hint to
    run again with ``--debug``, since its message may not say where it came from.
    """
    lines = [line.rstrip() for line in str(err).strip().splitlines() if line.strip()]
    text = "\n".join(lines) or type(err).__name__
    if not known:
        text += " (run again with --debug for the traceback)"
    return f"error: {text}"
