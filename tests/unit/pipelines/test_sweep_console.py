"""The sweep's console: a line per trial state change with its best scores, and no TensorBoard logger from Tune."""

from __future__ import annotations

import logging
import os
import sys
from types import SimpleNamespace

import pytest

from pipelines.sweeps.console import (
    MLFLOW_QUIET_ENV,
    MLFLOW_QUIET_LOGGERS,
    no_default_loggers,
    quiet_trial_process,
    trial_lines,
    tune_loggers,
)


class _Named(SimpleNamespace):
    def __str__(self) -> str:
        return self.trial_id


def test_each_trial_state_change_is_one_line_with_the_best_scores(caplog: pytest.LogCaptureFixture) -> None:
    lines = trial_lines()
    first = _Named(trial_id="cb-minilm-capt-s0", last_result={})
    second = _Named(trial_id="rte-minilm-capt-s0", last_result={})
    trials = [first, second]
    lines.setup(total_num_samples=3)  # Tune has created two of the sweep's three trials so far
    with caplog.at_level(logging.INFO, logger="pipelines.sweep"):
        lines.on_trial_start(iteration=0, trials=trials, trial=first)
        first.last_result = {"validation_score": 50.0, "best_validation_score": 96.875, "test_score": 87.9,
                             "reused": 0.0}
        lines.on_trial_complete(iteration=1, trials=trials, trial=first)
        second.last_result = {"best_validation_score": 84.4, "test_score": 86.0, "reused": 1.0}
        lines.on_trial_complete(iteration=2, trials=trials, trial=second)
        third = _Named(trial_id="cb-tiny-t5-capt-s0", last_result={"validation_score": 30.0,
                                                                    "best_validation_score": 31.0})
        lines.on_trial_complete(iteration=3, trials=[*trials, third], trial=third)
    assert [r.getMessage() for r in caplog.records] == [
        "Trial cb-minilm-capt-s0 started (0 of 3 ended)",
        "Trial cb-minilm-capt-s0 finished: best validation 96.9, test 87.9 (1 of 3 ended)",
        "Trial rte-minilm-capt-s0 reused its finished job: best validation 84.4, test 86.0 (2 of 3 ended)",
        "Trial cb-tiny-t5-capt-s0 stopped by the scheduler: best validation 31.0 (3 of 3 ended)"]


def test_tune_gets_its_csv_and_json_loggers_and_no_tensorboard_logger() -> None:
    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback, TBXLoggerCallback
    from ray.tune.utils.callback import _create_default_callbacks

    given = [*tune_loggers(), trial_lines()]
    before = os.environ.get("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS")
    with no_default_loggers():
        callbacks = _create_default_callbacks(list(given), air_verbosity=0)
    assert os.environ.get("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS") == before, "the variable is set for the fit only"
    kinds = {type(c) for c in callbacks}
    assert {CSVLoggerCallback, JsonLoggerCallback} <= kinds and TBXLoggerCallback not in kinds
    assert any(isinstance(c, TBXLoggerCallback) for c in _create_default_callbacks([], air_verbosity=0)), (
        "without it Tune adds its TensorBoard logger (tensorboardX is installed here)")


def test_a_trial_process_loads_models_without_the_load_report(tmp_path, caplog: pytest.LogCaptureFixture,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import BertConfig, BertForSequenceClassification, BertModel
    from transformers.utils import logging as hf_logging

    BertModel(BertConfig(vocab_size=32, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=8)).save_pretrained(tmp_path)
    loading = logging.getLogger("transformers.modeling_utils")
    filters = list(loading.filters)
    levels = {name: logging.getLogger(name).level for name in MLFLOW_QUIET_LOGGERS}
    for key in MLFLOW_QUIET_ENV:
        monkeypatch.delenv(key, raising=False)  # restored after the test
    caplog.set_level(logging.WARNING)
    library = logging.getLogger("transformers")
    propagates = library.propagate
    library.propagate = True  # caplog sees only what reaches the root logger, whatever earlier tests configured
    try:
        BertForSequenceClassification.from_pretrained(tmp_path, num_labels=2)  # a new head: the report lists it
        assert any("LOAD REPORT" in r.getMessage() for r in caplog.records), "transformers reports the new head"
        caplog.clear()
        quiet_trial_process()
        quiet_trial_process()
        BertForSequenceClassification.from_pretrained(tmp_path, num_labels=2)
        assert [r.getMessage()[:80] for r in caplog.records if r.levelno >= logging.WARNING] == []
        assert not hf_logging.is_progress_bar_enabled() and loading.level == logging.NOTSET
        assert len(loading.filters) == len(filters) + 1
        assert all(os.environ[key] == value for key, value in MLFLOW_QUIET_ENV.items())
        assert not logging.getLogger("mlflow.system_metrics.system_metrics_monitor").isEnabledFor(logging.INFO)
    finally:
        library.propagate = propagates
        loading.filters[:] = filters
        hf_logging.enable_progress_bar()
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


def test_the_registry_line_is_a_command_with_a_row_of_the_tasks_fields():
    import ast
    import shlex

    from pipelines.sweep import registry_line

    line = registry_line("capt-minilm-cb", "http://127.0.0.1:5000", stopped=True)
    assert "with `make mlflow-ui` running" in line
    assert "make mlflow-ui" not in registry_line("capt-minilm-cb", "http://mlflow:5000", stopped=False)
    words = shlex.split(line.split("rows are the task's fields: ", 1)[1].rstrip(")"))
    assert words[:5] == ["MLFLOW_TRACKING_URI=http://127.0.0.1:5000", "MLFLOW_HTTP_REQUEST_MAX_RETRIES=0",
                         "MLFLOW_HTTP_REQUEST_TIMEOUT=10", "python", "-c"]
    code = ast.parse(words[5])  # the Python the shell hands over is valid, and its row has CB's fields
    [row] = ast.literal_eval(code.body[1].value.args[0].args[0])
    assert set(row) == {"premise", "hypothesis"}


def test_the_serve_line_names_each_base_models_champion_tasks_and_where_their_store_is(tmp_path):
    from pydantic import TypeAdapter

    from pipelines.sweep import serve_lines
    from pipelines.sweeps.config import SweepConfig

    sweep = TypeAdapter(SweepConfig).validate_python({"tasks": ["cb", "copa", "rte"],
                                                      "models": ["smollm2-135m", "tiny-t5"]})
    champions = ["capt-smollm2-135m-copa", "capt-smollm2-135m-cb", "capt-tiny-t5-rte"]
    assert serve_lines(sweep, champions, "http://127.0.0.1:5000", stopped=True) == [
        "Serve: python -m pipelines.serve --model smollm2-135m --tasks cb,copa",
        "Serve: python -m pipelines.serve --model tiny-t5 --tasks rte"]
    assert serve_lines(sweep, champions[2:], "http://mlflow:5000", stopped=False) == [
        "Serve: python -m pipelines.serve --model tiny-t5 --tasks rte --tracking-uri http://mlflow:5000"]
    elsewhere = TypeAdapter(SweepConfig).validate_python({"tasks": ["rte"], "models": ["tiny-t5"],
                                            "tracking": {"local_dir": str(tmp_path / "mlflow")}})
    [line] = serve_lines(elsewhere, champions, "http://127.0.0.1:5000", stopped=True)
    assert line.startswith("Serve: python -m pipelines.serve --model tiny-t5 --tasks rte --tracking-uri "
                           "http://127.0.0.1:5000") and "mlflow server" in line
    assert serve_lines(sweep, [], "http://127.0.0.1:5000", stopped=True) == []


@pytest.mark.slow
def test_the_registry_line_fails_within_seconds_when_no_server_answers():
    """Run as printed with nothing listening at its URI: it ends in seconds (MLflow's retries would take minutes)."""
    import shlex
    import subprocess
    import time

    from pipelines.services import LOCALHOST, free_port
    from pipelines.sweep import registry_line

    line = registry_line("capt-minilm-cb", f"http://{LOCALHOST}:{free_port(LOCALHOST)}", stopped=True)
    words = shlex.split(line.split("rows are the task's fields: ", 1)[1].rstrip(")"))
    env = {**os.environ, **dict(word.split("=", 1) for word in words[:3])}
    started = time.monotonic()
    done = subprocess.run([sys.executable, *words[4:]], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and time.monotonic() - started < 60, done.stderr[-2000:]
    assert "Connection refused" in done.stderr or "Max retries exceeded" in done.stderr, done.stderr[-2000:]
