"""The bad-input matrix's shared pieces: run an entry point as a real process or through its `main(argv)` in
this process, digest a folder, and check that a failure is clean (its exit status, one `error:` paragraph
naming the problem, no traceback)."""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import logging
import os
import subprocess
import sys
import time
import traceback
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pipelines.services import LOCALHOST, free_port

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = {
    "train": ["-m", "pipelines.train"],
    "sweep": [str(ROOT / "pipelines" / "sweep.py")],
    "promote": ["-m", "pipelines.promote"],
    "report": ["-m", "pipelines.report"],
    "tracking": ["-m", "pipelines.tracking"],
}
"""How each entry point is started, after `sys.executable` (the sweep as a script, as `ray job submit` does)."""
MAINS = {"train": "pipelines.train", "sweep": "pipelines.sweep", "promote": "pipelines.promote",
         "report": "pipelines.report", "tracking": "pipelines.tracking.__main__"}
"""The module whose `main(argv)` each entry point's command runs."""
GOOD_RTE = {"premise": "A cat sat on the mat.", "hypothesis": "A cat sat.", "label": "entailment", "idx": 0}


@dataclass(frozen=True)
class Places:
    """Where a case finds things: the earlier outputs it must not change, its inputs, the two servers."""

    outputs: Path
    """The earlier outputs: `job/` (a finished job) and `reports/` (an earlier report)."""
    inputs: Path
    """Bad input files, made once per module."""
    scratch: Path
    """A folder of this case only, outside `outputs`."""
    closed_uri: str = ""
    """An http URI on 127.0.0.1 where nothing listens."""
    http_uri: str = ""
    """A plain `http.server` on 127.0.0.1 (answers HTTP, is not MLflow)."""


@dataclass(frozen=True)
class Case:
    """One bad input: the entry point, its arguments, the exit status and a phrase its message must contain."""

    name: str
    entry: str
    args: Callable[[Places], list[str]]
    phrase: str | Callable[[Places], str]
    code: int = 2
    env: Callable[[Places], dict[str, str]] = lambda places: {}
    """Environment changes (the base environment has no tracking URI, data dir or Ray address)."""

    def expected_phrase(self, places: Places) -> str:
        """The phrase, with paths filled in when it depends on them."""
        return self.phrase(places) if callable(self.phrase) else self.phrase


def entry_env(**changes: str) -> dict[str, str]:
    """The inherited environment (PYTHONPATH included), offline, without any tracking URI, data dir or Ray."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("MLFLOW_TRACKING_URI", "CAPT_DATA_DIR", "RAY_ADDRESS")}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", **changes)
    return env


def run_entry(entry: str, args: list[str], env: dict[str, str] | None = None, cwd: Path = ROOT,
              timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """Run an entry point to its end, capturing both streams."""
    return subprocess.run([sys.executable, *COMMANDS[entry], *args], cwd=cwd, env=env or entry_env(),
                          capture_output=True, text=True, timeout=timeout, check=False)


def call_entry(entry: str, args: list[str], env: dict[str, str], cwd: Path,
               capsys: pytest.CaptureFixture[str]) -> subprocess.CompletedProcess[str]:
    """Run an entry point's `main(args)` in this process as `run_entry` runs its command: `env` as the whole
    environment, from `cwd`, both streams captured, the status `sys.exit(main())` would exit with. What a run
    may change in the process (environment, cwd, logging handlers, cached model shapes) is put back after."""
    main = importlib.import_module(MAINS[entry]).main
    capsys.readouterr()
    with _process_state(env, cwd):
        code = _exit_status(main, args)
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess([MAINS[entry], *args], code, out, err)


def _exit_status(main: Callable[[list[str]], int], args: list[str]) -> int:
    """What `sys.exit(main(args))` exits with; an uncaught exception prints its traceback and gives 1, as
    Python does."""
    try:
        return main(args)
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            return stop.code or 0
        print(stop.code, file=sys.stderr)
        return 1
    except Exception:
        traceback.print_exc()
        return 1


@contextlib.contextmanager
def _process_state(env: dict[str, str], cwd: Path) -> Iterator[None]:
    """`env` and `cwd` for the block, a root logger without handlers (so the entry point's `logging.basicConfig`
    logs to this run's stderr, as in a new process) and no cached model shape; all put back afterwards."""
    from pipelines.models.shape import forget_model_shapes

    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    root.handlers = []
    forget_model_shapes()
    try:
        yield
    finally:
        _drop_handlers_writing_to(sys.stdout, sys.stderr)
        root.handlers = saved_handlers
        root.setLevel(saved_level)
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        forget_model_shapes()


def _drop_handlers_writing_to(*streams: object) -> None:
    """Remove every logging handler that writes to one of `streams` (this test's captured ones)."""
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    for logger in loggers:
        for handler in getattr(logger, "handlers", [])[:]:
            if getattr(handler, "stream", None) in streams:
                logger.removeHandler(handler)


def error_paragraph(stderr: str) -> str:
    """The `error:` paragraph at the end of stderr; fails unless there is exactly one, and it is last."""
    lines = stderr.rstrip("\n").splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("error: ")]
    assert len(starts) == 1, f"expected one 'error:' paragraph in stderr:\n{stderr[-3000:]}"
    paragraph = lines[starts[0]:]
    assert all(line.strip() for line in paragraph), f"the error is more than one paragraph:\n{stderr[-3000:]}"
    return "\n".join(paragraph)


def assert_clean_failure(proc: subprocess.CompletedProcess[str], phrase: str, code: int = 2) -> None:
    """Exit status `code`, one `error:` paragraph holding `phrase`, no traceback anywhere."""
    output = proc.stdout + proc.stderr
    assert proc.returncode == code, f"exit {proc.returncode}, expected {code}:\n{output[-3000:]}"
    assert "Traceback" not in output, output[-3000:]
    paragraph = error_paragraph(proc.stderr)
    assert phrase in paragraph, f"{phrase!r} not in:\n{paragraph}"


def folder_digest(root: Path) -> str:
    """A hash of every path under `root` with each file's bytes (a new empty folder changes it too)."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        if path.is_file():
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def write_rte(data_dir: Path, train: list | bytes, val: list | bytes | None = None) -> Path:
    """`data_dir/rte/{train,val}.jsonl`: rows (dicts or raw lines) or raw bytes; returns `data_dir`."""
    folder = data_dir / "rte"
    folder.mkdir(parents=True, exist_ok=True)
    for split, rows in (("train", train), ("val", [GOOD_RTE] if val is None else val)):
        if isinstance(rows, bytes):
            (folder / f"{split}.jsonl").write_bytes(rows)
        else:
            text = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)
            (folder / f"{split}.jsonl").write_text(text, encoding="utf-8")
    return data_dir


def rte_rows(count: int) -> list[dict]:
    """`count` valid RTE rows with both labels."""
    labels = ("entailment", "not_entailment")
    return [dict(GOOD_RTE, idx=i, label=labels[i % 2]) for i in range(count)]


class PlainHttpServer:
    """``python -m http.server`` on 127.0.0.1: a web server that is not MLflow (every API path is a 404 page)."""

    def __init__(self, folder: Path) -> None:
        self.port = free_port(LOCALHOST)
        self.uri = f"http://{LOCALHOST}:{self.port}"
        self._proc = subprocess.Popen([sys.executable, "-m", "http.server", str(self.port), "--bind", LOCALHOST],
                                      cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def wait_ready(self, timeout: float = 30.0) -> PlainHttpServer:
        """Block until it answers HTTP."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.uri, timeout=1.0):
                    return self
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"http.server on {self.uri} did not start")

    def stop(self) -> None:
        """Stop it (only the process this object started)."""
        self._proc.terminate()
        self._proc.wait(timeout=10)


def plain_http_server(folder: Path) -> Iterator[PlainHttpServer]:
    """A generator for a fixture: a started `PlainHttpServer`, stopped afterwards."""
    server = PlainHttpServer(folder)
    try:
        yield server.wait_ready()
    finally:
        server.stop()


def earlier_outputs(base: Path) -> Path:
    """`base/outputs` with a finished tiny job (`job/`) and an earlier report (`reports/`), made once per
    session: every module of the matrix checks the same folder is left as it was."""
    outputs = base / "outputs"
    if (outputs / "job" / "result.json").is_file():
        return outputs
    from helpers.jobs import tiny_job
    from pipelines.training.loop import run

    run(tiny_job(outputs / "job", train={"max_epochs": 2}))
    reports = outputs / "reports"
    reports.mkdir()
    (reports / "report.md").write_text("# an earlier report\n", encoding="utf-8")
    (reports / "report.png").write_bytes(b"\x89PNG\r\n\x1a\n earlier")
    return outputs


def check_case(case: Case, places: Places, scratch: Path,
               capsys: pytest.CaptureFixture[str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run `case` from `scratch` (its own folder) and check the failure is clean and `places.outputs` intact:
    through the entry point's `main` in this process with `capsys`, else as a real process."""
    places = Places(places.outputs, places.inputs, scratch, places.closed_uri, places.http_uri)
    before = folder_digest(places.outputs)
    env = entry_env(**case.env(places))
    if capsys is None:
        proc = run_entry(case.entry, case.args(places), env, cwd=scratch)
    else:
        proc = call_entry(case.entry, case.args(places), env, scratch, capsys)
    assert_clean_failure(proc, case.expected_phrase(places), case.code)
    assert folder_digest(places.outputs) == before, "a failed run changed an earlier output"
    return proc
