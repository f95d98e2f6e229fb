"""The sweep's console: one line per trial state change instead of Tune's tables, no TensorBoard logger, and trial
processes that load models without transformers' per-load report and track runs without MLflow's routine output.

Tune's default reporter (verbosity 2) prints every report as a table and, in its status table, a "Current best
trial" that quotes each trial's last validation score rather than its best; at verbosity 1 it still prints a
config table at every start and a result table at every end. `trial_lines` replaces it with a line per start,
end and retry; the results table at the end of the sweep (`pipelines.sweeps.summary`) has the scores.
"""

from __future__ import annotations

import contextlib
import logging
import os

from pipelines.services.ray_connect import environ

logger = logging.getLogger("pipelines.sweep")


def tune_loggers() -> list:
    """Tune's per-trial progress.csv and result.json. Not its TensorBoard logger, which Tune adds by default: events
    nothing here reads, and a hint to run a TensorBoard the project does not install."""
    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback

    return [CSVLoggerCallback(), JsonLoggerCallback()]


def no_default_loggers() -> contextlib.AbstractContextManager[None]:
    """Tune adds its default loggers (TensorBoard's among them) to the given callbacks unless this variable is set
    when the Tuner runs (`ray.tune.utils.callback._create_default_callbacks`)."""
    return environ(TUNE_DISABLE_AUTO_CALLBACK_LOGGERS="1")


def trial_lines():
    """One log line per trial state change, in place of Tune's own console reporter (this module's docstring: why)."""
    from ray import tune

    class _TrialLines(tune.Callback):
        def __init__(self) -> None:
            self.ended: set[str] = set()
            self.total: int | None = None

        def setup(self, stop=None, num_samples=None, total_num_samples=None, **info):
            self.total = total_num_samples  # Tune creates the trials as it goes: `trials` may not hold them all yet

        def _ended(self, trials) -> str:
            return f"{len(self.ended)} of {self.total or len(trials)} ended"

        def on_trial_start(self, iteration, trials, trial, **info):
            logger.info("Trial %s started (%s)", trial, self._ended(trials))

        def on_trial_complete(self, iteration, trials, trial, **info):
            self.ended.add(trial.trial_id)
            logger.info("Trial %s %s (%s)", trial, _outcome(trial.last_result or {}), self._ended(trials))

        def on_trial_recover(self, iteration, trials, trial, **info):
            logger.warning("Trial %s failed and is retried", trial)

        def on_trial_error(self, iteration, trials, trial, **info):
            self.ended.add(trial.trial_id)
            logger.error("Trial %s failed (%s); its error: %s", trial, self._ended(trials), trial.error_file)

    return _TrialLines()


def _outcome(result: dict) -> str:
    """An ended trial in words: its best validation and test scores, and whether it trained, reused its job, or was
    stopped by the scheduler (ASHA) before its final report."""
    if "members" in result:  # a pack trial (pipelines.sweeps.trial.run_pack_trial)
        return (f"trained {result.get('members_trained', 0):.0f} of {result['members']:.0f} pack members, reused "
                f"{result.get('members_reused', 0):.0f}: best validation {result.get('validation_score', 0):.1f}")
    scores = ", ".join(f"{label} {result[key]:.1f}" for label, key in
                       (("best validation", "best_validation_score"), ("test", "test_score")) if key in result)
    how = ("reused its finished job" if result.get("reused") else "finished" if "test_score" in result
           else "stopped by the scheduler")
    return f"{how}: {scores}" if scores else how


MLFLOW_QUIET_ENV = {"MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true", "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}
"""MLflow's own switches, read when it would print: off the "View run ... at" links printed when a run ends (for a
sweep's local server they point to an address that is gone once the sweep ends; the sweep prints where its runs are
at the end) and the artifact download bars."""
MLFLOW_QUIET_LOGGERS = ("mlflow.system_metrics", "mlflow.pyfunc", "mlflow.store.model_registry.abstract_store")
"""MLflow loggers whose INFO lines are routine in every trial (the system-metrics monitor's four per run, the
input-example check, the wait for a registered version): they log from WARNING up; every warning and error, and the
registry's "Created version" lines, stay."""


def _no_load_report(record: logging.LogRecord) -> bool:
    return "LOAD REPORT" not in str(record.msg)


def quiet_trial_process() -> None:
    """In a trial process: no "LOAD REPORT" table per model load (for MiniLM it lists the classifier head that every
    classification job adds, a known and expected difference; a load that is wrong still raises), no
    weight-loading progress bar (transformers' other warnings stay), MLflow's routine output off (`MLFLOW_QUIET_ENV`
    unless set already: a user's explicit choice wins; `MLFLOW_QUIET_LOGGERS`), Accelerate's checkpoint chatter at
    WARNING (`pipelines.cli_errors.quiet_accelerate`).

    A filter, not a level: transformers checks the level of its loading logger itself, and at WARNING or above
    it verifies a tensor-parallel plan no job here uses, and warns about every layer it did not shard."""
    from transformers.utils import logging as hf_logging

    from pipelines.cli_errors import quiet_accelerate

    for key, value in MLFLOW_QUIET_ENV.items():
        os.environ.setdefault(key, value)
    for name in MLFLOW_QUIET_LOGGERS:
        routine = logging.getLogger(name)
        if routine.level < logging.WARNING:
            routine.setLevel(logging.WARNING)
    quiet_accelerate()
    loading = logging.getLogger("transformers.modeling_utils")
    loading.addFilter(_no_load_report)  # logging adds a filter once
    hf_logging.disable_progress_bar()
