"""What the entry points print is what a user needs, once: a short job's console has no Accelerate checkpoint
chatter; CAPT_DATA_DIR set for a job or a sweep that will not read it is said once, with how to use it; serve's
start-up line is one short line (tasks, URL, where the token is), its ports at debug level only."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from helpers.bad_inputs import ROOT, call_entry, entry_env, run_entry

from pipelines.cli_errors import QUIET_LOGGERS, configure_logging
from pipelines.config.load import ignored_data_dir_note

SMOKE_JOB = str(ROOT / "pipelines" / "configs" / "job" / "smoke.yaml")
IGNORED = "CAPT_DATA_DIR={} is ignored: "


@pytest.fixture(scope="module")
def job_run(tmp_path_factory: pytest.TempPathFactory):
    """The README's smoke job, as the real command, with CAPT_DATA_DIR set (its config says task.source=generated)."""
    folder = tmp_path_factory.mktemp("quiet-job")
    data = folder / "my-data"
    data.mkdir()
    done = run_entry("train", ["--config", SMOKE_JOB, f"output_dir={folder / 'job'}", "train.max_epochs=1"],
                     env=entry_env(CAPT_DATA_DIR=str(data)))
    assert done.returncode == 0, done.stderr[-3000:]
    return done, folder, data


@pytest.mark.slow
def test_a_short_job_prints_no_accelerate_checkpoint_lines(job_run) -> None:
    done, folder, _ = job_run
    assert (folder / "job" / "checkpoints" / "latest").is_dir(), "the job saved checkpoints (the chatter's cause)"
    output = done.stdout + done.stderr
    assert output.count("accelerate.checkpointing") == 0, output[-3000:]
    assert output.count("accelerate.accelerator") == 0, output[-3000:]


@pytest.mark.slow
def test_a_job_says_once_that_it_ignores_capt_data_dir(job_run) -> None:
    done, _, data = job_run
    notes = [line for line in done.stderr.splitlines() if IGNORED.format(data) in line]
    assert len(notes) == 1 and " WARNING " in notes[0], done.stderr[-3000:]
    assert "this job reads generated data (task.source=generated)" in notes[0], notes[0]
    assert notes[0].endswith(f"to train on the files in {data}, run it with task.source=local."), notes[0]


def test_accelerate_keeps_its_checkpoint_lines_at_warning_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ACCELERATE_LOG_LEVEL", raising=False)
    levels = {name: logging.getLogger(name).level for name in QUIET_LOGGERS}
    try:
        configure_logging()
        assert all(logging.getLogger(name).level == logging.WARNING for name in QUIET_LOGGERS)
        for name in QUIET_LOGGERS:
            logging.getLogger(name).setLevel(logging.NOTSET)
        monkeypatch.setenv("ACCELERATE_LOG_LEVEL", "INFO")  # Accelerate's own switch: the user wants the lines
        configure_logging()
        assert all(logging.getLogger(name).level == logging.NOTSET for name in QUIET_LOGGERS)
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


def test_the_note_is_said_only_where_capt_data_dir_is_set_and_unread(monkeypatch: pytest.MonkeyPatch,
                                                                     tmp_path: Path) -> None:
    monkeypatch.delenv("CAPT_DATA_DIR", raising=False)
    assert ignored_data_dir_note("generated", None, "this job reads", "fix") is None
    monkeypatch.setenv("CAPT_DATA_DIR", str(tmp_path))
    assert ignored_data_dir_note("local", None, "this job reads", "fix") is None
    assert ignored_data_dir_note("local", str(tmp_path / "." / ""), "this job reads", "fix") is None
    assert "reads hub data (task.source=hub)" in ignored_data_dir_note("hub", None, "this job reads", "fix")
    other = ignored_data_dir_note("local", "/elsewhere", "this job reads", "leave task.data_dir unset")
    assert other == (f"CAPT_DATA_DIR={tmp_path} is ignored: this job reads task.data_dir=/elsewhere; to train on the "
                     f"files in {tmp_path}, leave task.data_dir unset.")


@pytest.mark.slow
def test_a_sweep_on_generated_data_says_once_that_it_ignores_capt_data_dir(tmp_path: Path, closed_uri: str,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """The sweep's driver says it before any service starts (here Ray is unreachable, so the sweep stops there)."""
    data = tmp_path / "my-data"
    data.mkdir()
    args = ["--config", str(ROOT / "pipelines" / "configs" / "smoke.yaml"), "data_source=generated",
            "tracking.enabled=false", f"storage_path={tmp_path / 'sweeps'}"]
    env = entry_env(CAPT_DATA_DIR=str(data), RAY_ADDRESS=closed_uri.removeprefix("http://"))
    done = call_entry("sweep", args, env, tmp_path, capsys)
    assert done.returncode == 2 and "Cannot reach the Ray cluster" in done.stderr, done.stderr[-3000:]
    notes = [line for line in done.stderr.splitlines() if IGNORED.format(data) in line]
    assert len(notes) == 1 and " WARNING pipelines.sweep: " in notes[0], done.stderr[-3000:]
    assert "every trial reads generated data (task.source=generated)" in notes[0], notes[0]
    assert notes[0].endswith("set data_source=local (or leave it at auto)."), notes[0]


def test_the_serve_start_up_line_is_short_and_names_the_url_tasks_and_token() -> None:
    from pipelines.serve import startup_line
    from pipelines.serving.auth import Token
    from pipelines.serving.settings import ServeSettings

    settings = ServeSettings.from_args({"model": "minilm", "tasks": ["cb", "rte"], "tracking_uri": "http://x:1",
                                        "auth": True, "token_sha256": "0" * 64})
    token = Token("0" * 64, "in /tmp/capt-serve-1000/serve-8000.token (mode 600, generated now)")
    line = startup_line(settings, "127.0.0.1", 8000, token)
    assert line == ("Serving cb, rte of minilm (alias champion, re-read every 30 s) at http://127.0.0.1:8000/ ; "
                    "bearer token required on POST / and GET /tasks, token in /tmp/capt-serve-1000/serve-8000.token "
                    "(mode 600, generated now); Ctrl-C stops.")
    assert len(line) < 250 and "\n" not in line
