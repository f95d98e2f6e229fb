"""One training job: train -> validate -> early stop -> test at the best checkpoint -> artifact.

    python -m pipelines.train --config pipelines/configs/job/smoke.yaml [key.sub=value ...]
    torchrun --standalone --nproc_per_node 2 -m pipelines.train --config FILE      # 2 processes (gloo on CPU)

The command line around `pipelines.training.loop.run` (the same job as a function; the sweep calls it inside Ray
Train workers). With `--tracking-uri URI` (or MLFLOW_TRACKING_URI) the job logs one MLflow run as a sweep's trial does
(`pipelines.tracking.jobs`, `pipelines.tracking.job_cli`).
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from pipelines.cli_errors import cli_main
from pipelines.config.load import ignored_data_dir_note
from pipelines.config.schema import JobConfig
from pipelines.tracking.job_cli import TRACKING_HELP, add_tracking_flags, train_from_cli
from pipelines.training.loop import Log, Report, TrainingDivergedError, run
from pipelines.training.outputs import is_main_process

logger = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> int:
    """CLI: validate the config (every problem at once) and the tracking server, then run the job; exit 2 on bad
    input."""
    parser = argparse.ArgumentParser(prog="python -m pipelines.train", description=__doc__.split("\n")[0],
                                     epilog=TRACKING_HELP)
    parser.add_argument("--config", help="job YAML (see pipelines/configs/job/)")
    parser.add_argument("overrides", nargs="*", help="key.sub=value overrides, e.g. train.max_steps=20")
    add_tracking_flags(parser)
    return cli_main(parser, argv, lambda args: train_from_cli(args, _run_once_noted),
                    expected=(TrainingDivergedError,))


def _run_once_noted(config: JobConfig, report: Report | None = None, log: Log | None = None) -> dict[str, Any]:
    """`run` for the command line: first says (once, main process) that CAPT_DATA_DIR is ignored when the job does
    not read it; not in `run`, which every trial of a sweep calls too."""
    note = ignored_data_dir_note(config.task.source, config.task.data_dir, "this job reads",
                                 "run it with task.source=local" if config.task.source != "local"
                                 else "leave task.data_dir unset")
    if note and is_main_process():
        logger.warning(note)
    return run(config, report, log=log)


if __name__ == "__main__":
    sys.exit(main())
