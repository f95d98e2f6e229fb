"""The bad-input matrix, part 2: `pipelines.promote`, `pipelines.report` and `pipelines.tracking` against a
closed port and a plain web server that is not MLflow (both on 127.0.0.1), plus `--debug` on all five entry
points: each case through the entry point's `main(argv)` in this process, and one case of each entry point
also as the real command. Every case leaves the earlier outputs (a finished job, an earlier report)
byte-for-byte as they were. Missing registered models and experiments need a real MLflow server:
tests/integration/test_bad_inputs_mlflow.py.
"""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path

import pytest
from helpers.bad_inputs import (
    Case,
    Places,
    assert_clean_failure,
    call_entry,
    check_case,
    earlier_outputs,
    entry_env,
    error_paragraph,
    folder_digest,
)

PROMOTE = ["--model", "tiny-t5", "--task", "rte"]


def _report(p: Places, *args: str) -> list[str]:
    return ["--experiment", "capt-smoke", "--out", str(p.outputs / "reports"), *args]


CASES = [
    Case("promote-unreachable", "promote", lambda p: [*PROMOTE, "--tracking-uri", p.closed_uri],
         "Cannot reach the MLflow tracking server"),
    Case("promote-not-mlflow", "promote", lambda p: [*PROMOTE, "--tracking-uri", p.http_uri],
         "is not an MLflow server"),
    Case("promote-unknown-task", "promote", lambda p: ["--model", "tiny-t5", "--task", "mnli",
                                                       "--tracking-uri", p.http_uri], "Unknown task 'mnli'"),
    Case("promote-no-tracking-uri", "promote", lambda p: PROMOTE, "No tracking store found: no --tracking-uri"),
    Case("promote-metric-of-unknown-direction", "promote",
         lambda p: [*PROMOTE, "--metric", "accuracy", "--tracking-uri", p.http_uri],
         "'accuracy': its direction is unknown"),
    Case("promote-direction-against-the-metric", "promote",
         lambda p: [*PROMOTE, "--metric", "train_loss", "--higher-is-better", "--tracking-uri", p.http_uri],
         "for this metric lower is better"),
    Case("report-unreachable", "report", lambda p: _report(p, "--tracking-uri", p.closed_uri),
         "Cannot reach the MLflow tracking server"),
    Case("report-not-mlflow", "report", lambda p: _report(p, "--tracking-uri", p.http_uri),
         "is not an MLflow server"),
    Case("report-no-tracking-uri", "report", lambda p: _report(p), "No tracking store found: no --tracking-uri"),
    Case("report-out-is-a-file", "report",
         lambda p: ["--experiment", "x", "--tracking-uri", p.http_uri,
                    "--out", str(p.outputs / "reports" / "report.md")],
         "report.md' is a file, not a folder; pass a folder you can write to"),
    Case("report-out-under-a-file", "report",
         lambda p: ["--experiment", "x", "--tracking-uri", p.http_uri,
                    "--out", str(p.outputs / "job" / "result.json" / "reports")],
         lambda p: f"cannot be created: {p.outputs / 'job' / 'result.json'} is a file"),
    Case("report-out-on-proc", "report",
         lambda p: ["--experiment", "x", "--tracking-uri", p.http_uri, "--out", "/proc/capt-reports"],
         "is on a kernel file system (proc)"),
    Case("report-out-holds-a-folder-named-report-md", "report",
         lambda p: ["--experiment", "x", "--tracking-uri", p.http_uri, "--out", str(p.inputs / "odd-reports")],
         "holds a folder named report.md"),
    Case("tracking-sync-unreachable", "tracking",
         lambda p: ["sync", "--root", str(p.outputs / "job"), "--tracking-uri", p.closed_uri],
         "Cannot reach the MLflow tracking server (--tracking-uri)"),
    Case("tracking-sync-not-mlflow", "tracking",
         lambda p: ["sync", "--root", str(p.outputs / "job"), "--tracking-uri", p.http_uri],
         "is not an MLflow server"),
]

DEBUG_CASES = [
    Case("train-debug", "train", lambda p: ["--config", str(p.inputs / "list.yaml"), "--debug"],
         "must be a mapping of sections"),
    Case("sweep-debug", "sweep", lambda p: ["--config", str(p.inputs / "list.yaml"), "--debug"],
         "must be a mapping of sections"),
    Case("promote-debug", "promote", lambda p: [*PROMOTE, "--tracking-uri", p.closed_uri, "--debug"],
         "Cannot reach"),
    Case("report-debug", "report", lambda p: _report(p, "--tracking-uri", p.http_uri, "--debug"),
         "is not an MLflow server"),
    Case("tracking-debug", "tracking",
         lambda p: ["sync", "--root", str(p.outputs), "--tracking-uri", p.closed_uri, "--debug"], "Cannot reach"),
]


@pytest.fixture(scope="module")
def places(tmp_path_factory: pytest.TempPathFactory, closed_uri: str, http_uri: str) -> Places:
    inputs = tmp_path_factory.mktemp("bad-service-inputs")
    (inputs / "list.yaml").write_text("- model\n- task\n", encoding="utf-8")
    (inputs / "odd-reports" / "report.md").mkdir(parents=True)
    return Places(earlier_outputs(tmp_path_factory.getbasetemp()), inputs, inputs, closed_uri, http_uri)


REAL_COMMANDS = [case for case in CASES
                 if case.name in ("promote-not-mlflow", "report-not-mlflow", "report-out-on-proc",
                                  "tracking-sync-unreachable")]
"""The cases also run as the real command (`python -m pipelines.promote`, ...)."""


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
@pytest.mark.slow
def test_bad_input_fails_cleanly_and_changes_nothing(case: Case, places: Places, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    check_case(case, places, tmp_path, capsys)
    assert not any(tmp_path.iterdir()), "a failed run wrote into its working directory"


@pytest.mark.parametrize("case", REAL_COMMANDS, ids=[c.name for c in REAL_COMMANDS])
@pytest.mark.slow
def test_the_real_command_fails_cleanly_and_changes_nothing(case: Case, places: Places, tmp_path: Path) -> None:
    check_case(case, places, tmp_path)
    assert not any(tmp_path.iterdir()), "a failed run wrote into its working directory"


@pytest.mark.parametrize("case", DEBUG_CASES, ids=[c.name for c in DEBUG_CASES])
@pytest.mark.slow
def test_debug_adds_the_traceback_to_the_same_paragraph(case: Case, places: Places, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    before = folder_digest(places.outputs)
    proc = call_entry(case.entry, case.args(places), entry_env(), tmp_path, capsys)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback (most recent call last)" in proc.stderr
    assert case.expected_phrase(places) in error_paragraph(proc.stderr)
    assert folder_digest(places.outputs) == before


def test_the_matrix_checks_cannot_pass_vacuously(tmp_path: Path) -> None:
    """A changed byte changes the digest; a traceback, a second paragraph or a wrong status is not clean."""
    (tmp_path / "a.txt").write_text("a", encoding="utf-8")
    before = folder_digest(tmp_path)
    (tmp_path / "a.txt").write_text("b", encoding="utf-8")
    assert folder_digest(tmp_path) != before
    for status, stderr in [(2, "Traceback (most recent call last):\nerror: bad\n"), (2, "error: bad\n\nmore\n"),
                           (1, "error: bad\n"), (2, "error: other\n"), (2, "bad\n")]:
        with pytest.raises(AssertionError):
            assert_clean_failure(subprocess.CompletedProcess([], status, "", stderr), "bad")
    assert_clean_failure(subprocess.CompletedProcess([], 2, "", "INFO loading\nerror: bad\n"), "bad")


def test_a_run_in_this_process_leaves_the_process_as_it_was(closed_uri: str, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """The case's environment and cwd, and the root log handler `cli_main` installs, are gone afterwards."""
    (tmp_path / "list.yaml").write_text("- model\n", encoding="utf-8")
    root = logging.getLogger()
    before = dict(os.environ), os.getcwd(), root.handlers[:], root.level
    env = entry_env(RAY_ADDRESS=closed_uri.removeprefix("http://"))
    proc = call_entry("train", ["--config", str(tmp_path / "list.yaml")], env, tmp_path, capsys)
    assert proc.returncode == 2 and "must be a mapping of sections" in proc.stderr
    assert (dict(os.environ), os.getcwd(), root.handlers, root.level) == before


@pytest.mark.slow
def test_a_refused_serve_start_leaves_no_generated_token(places: Places, tmp_path: Path) -> None:
    """serve generates its bearer token before it checks the store; refused (exit 2), it removes the token's file."""
    import subprocess
    import sys

    from pipelines.services import free_port
    from pipelines.services.private import private_temp_dir

    port = free_port()
    token = private_temp_dir("capt-serve") / f"serve-{port}.token"
    proc = subprocess.run([sys.executable, "-m", "pipelines.serve", "--model", "tiny-t5", "--tasks", "cb",
                           "--port", str(port), "--tracking-uri", places.closed_uri],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path, env=entry_env())
    assert proc.returncode == 2 and "Cannot reach the MLflow tracking server" in proc.stderr, proc.stderr[-2000:]
    assert not token.exists(), "the generated token outlived the refused start"
