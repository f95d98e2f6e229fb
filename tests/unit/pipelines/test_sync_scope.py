"""What `python -m pipelines.tracking sync` may touch: only a job or sweep folder tree (never `/` or the home
folder, never through a link out of it), and only the operations recorded for the server it syncs to. Servers
here are closed ports: an operation that was tried says "no answer"; one that was skipped was never tried.
The same against a real MLflow server: tests/integration/test_tracking_sync_scope.py."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest

from pipelines.services import free_port
from pipelines.tracking import RetryPolicy, main, sync_pending
from pipelines.tracking.scope import JOB_MARKERS, normalised_uri, same_server
from pipelines.tracking.spool import PENDING_FILE, Spool
from pipelines.tracking.sweep_run import SWEEP_CLOSE_FILE, SweepClose, keep_for_sync
from pipelines.training.outputs import CLAIM_FILE, RESULT_FILE

NOW = RetryPolicy(budget_s=0.0)


def _spool(folder: Path, uri: str | None, name: str = "t") -> bytes:
    """A trial's spool (start, params, end) recorded for `uri` (None: recorded for no server); its bytes."""
    recorded = {"tracking_uri": uri} if uri else {}
    spool = Spool(folder / PENDING_FILE)
    spool.append({"op": "start", "experiment": "e", "run_name": name, "tags": {}, "trial_key": name, "timestamp": 1,
                  **recorded})
    spool.append({"op": "params", "params": {"x": "1"}, **recorded})
    spool.append({"op": "end", "status": "FINISHED", "timestamp": 2, **recorded})
    return spool.path.read_bytes()


def _error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and err.count("\n") == 1, f"one paragraph: {err!r}"
    return lines[0]


def test_a_filesystem_root_is_refused_at_once(capsys: pytest.CaptureFixture[str]) -> None:
    began = time.monotonic()
    assert main(["sync", "--root", "/"]) == 2
    assert time.monotonic() - began < 2, "refused without walking it"
    line = _error_line(capsys)
    assert line.startswith("error: --root '/' is refused: it is a filesystem root.") and "job_config.json" in line


def test_the_home_folder_above_it_and_unmarked_folders_are_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "home"
    (home / "job").mkdir(parents=True)
    (home / "job" / CLAIM_FILE).write_text("{}")  # even with a job just below it
    monkeypatch.setenv("HOME", str(home))
    assert main(["sync", "--root", str(home)]) == 2
    assert "is refused: it is the home folder" in _error_line(capsys)
    assert main(["sync", "--root", "~"]) == 2
    assert "is refused: it is the home folder" in _error_line(capsys)
    assert main(["sync", "--root", str(tmp_path)]) == 2
    assert "is refused: it is above the home folder" in _error_line(capsys)
    deep = tmp_path / "outputs" / "a" / "b" / "c"
    deep.mkdir(parents=True)
    _spool(deep, "http://127.0.0.1:1")
    assert main(["sync", "--root", str(tmp_path / "outputs")]) == 2  # a job three levels down is not "near the top"
    assert "nor any folder up to 2 levels below it is a job folder or a sweep folder" in _error_line(capsys)
    assert (deep / PENDING_FILE).exists()


def test_job_and_sweep_folders_up_to_two_levels_down_make_a_root(tmp_path: Path) -> None:
    assert {CLAIM_FILE, RESULT_FILE} <= JOB_MARKERS, "the job folder's own files (pipelines.training.outputs)"
    sweep = tmp_path / "outputs" / "sweeps" / "paper"
    sweep.mkdir(parents=True)
    (sweep / "tuner.pkl").write_bytes(b"")  # Tune's state: the sweep folder, before any job has a folder
    for root in (tmp_path / "outputs", tmp_path / "outputs" / "sweeps", sweep):
        assert sync_pending(root).folders == []
    job = tmp_path / "jobs" / "rte-capt-s0"
    job.mkdir(parents=True)
    (job / RESULT_FILE).write_text("{}")
    assert sync_pending(tmp_path / "jobs").folders == [] and sync_pending(job).folders == []


def test_links_are_never_followed_out_of_the_root(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    outside, root = tmp_path / "outside", tmp_path / "outputs"
    (outside / "job").mkdir(parents=True)
    before = _spool(outside / "job", closed)
    (root / "job").mkdir(parents=True)
    (root / "job" / CLAIM_FILE).write_text("{}")
    (root / "escape").symlink_to(outside)
    (root / "job" / PENDING_FILE).symlink_to(outside / "job" / PENDING_FILE)
    summary = sync_pending(root, retry=NOW)
    assert summary.folders == [] and summary.links == [root / "escape", root / "job" / PENDING_FILE]
    assert (outside / "job" / PENDING_FILE).read_bytes() == before
    assert main(["sync", "--root", str(root), "--retry-s", "0"]) == 0
    out = capsys.readouterr().out
    assert f"Nothing to sync under {root}" in out
    assert f"2 symbolic link(s) under {root} were not followed (sync never leaves --root): escape, job/" in out
    (root / "job" / CLAIM_FILE).unlink()  # the only job marker left is behind a link: not a root any more
    assert main(["sync", "--root", str(root)]) == 2
    assert "nor any folder up to 2 levels below it" in _error_line(capsys)


def test_a_sync_to_one_server_skips_and_lists_other_servers_and_unrecorded_spools(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mine, theirs = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
    _spool(tmp_path / "mine", mine)
    kept = {"theirs": _spool(tmp_path / "theirs", theirs), "old": _spool(tmp_path / "old", None)}
    spelled = mine.replace("http://", "HTTP://") + "/"  # the same server
    summary = sync_pending(tmp_path, spelled, NOW)
    folders = {f.state_dir.name: f for f in summary.folders}
    assert "no answer after" in folders["mine"].error and folders["mine"].skipped is None  # tried
    assert folders["theirs"].skipped.startswith(f"3 operation(s) recorded for {theirs}, not {spelled}")
    assert folders["old"].skipped.startswith("3 operation(s) recorded for no server")
    assert folders["theirs"].error is None and folders["old"].error is None  # never tried
    assert (summary.pending, summary.skipped, summary.complete) == (9, 6, False)
    assert all((tmp_path / name / PENDING_FILE).read_bytes() == data for name, data in kept.items())

    accepted = {f.state_dir.name: f for f in sync_pending(tmp_path, mine, NOW, accept_unrecorded=True).folders}
    assert accepted["old"].skipped is None and "no answer after" in accepted["old"].error  # tried, into `mine`
    assert accepted["theirs"].skipped
    moved = {f.state_dir.name: f for f in sync_pending(tmp_path, mine, NOW, moved_from=(theirs,)).folders}
    assert moved["theirs"].skipped is None and mine in moved["theirs"].error
    recorded = {f.state_dir.name: f for f in sync_pending(tmp_path, retry=NOW).folders}  # each to its own server
    assert theirs in recorded["theirs"].error and mine in recorded["mine"].error and recorded["old"].skipped

    assert main(["sync", "--root", str(tmp_path), "--retry-s", "0"]) == 1
    out = capsys.readouterr().out
    assert "9 still pending (3 of them skipped, not for this server)" in out
    assert "  old: 0 synced, 0 dead-lettered now (0 in mlflow_failed.jsonl), 3 still pending (skipped: 3 " in out


def test_uris_compare_by_server_and_bad_options_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert same_server("HTTP://Example.org:80/", "http://example.org")
    assert same_server("https://user:secret@mlflow.example.org:443/", "https://mlflow.example.org")
    assert not same_server("http://127.0.0.1:5000", "http://127.0.0.1:5001")
    assert not same_server("http://localhost:5000", "http://127.0.0.1:5000"), "another machine's localhost"
    assert normalised_uri("sqlite:///tmp/mlflow.db/") == "sqlite:///tmp/mlflow.db"
    (tmp_path / CLAIM_FILE).write_text("{}")
    assert main(["sync", "--root", str(tmp_path), "--retry-s", "nan"]) == 2
    assert _error_line(capsys).startswith("error: --retry-s nan: not a finite number")
    assert main(["sync", "--root", str(tmp_path), "--moved-from", "http://127.0.0.1:1"]) == 2
    assert "--moved-from needs --tracking-uri" in _error_line(capsys)
    assert main(["sync", "--root", "/", "--retry-s", "inf", "--moved-from", "http://127.0.0.1:1"]) == 2
    line = _error_line(capsys)  # every bad option named in one line
    assert all(part in line for part in ("--retry-s inf", "--moved-from needs", "--root '/' is refused")), line


def test_torn_lines_and_operations_without_a_run_are_set_aside_without_a_traceback(tmp_path: Path,
                                                                                    capsys: pytest.CaptureFixture[str],
                                                                                    caplog) -> None:
    job = tmp_path / "sweep" / "jobs" / "rte-x"
    job.mkdir(parents=True)
    (job / CLAIM_FILE).write_text('{"config": {}}')
    (job / PENDING_FILE).write_bytes(b'{"op": "metrics", "run_id": "r", "tracking_uri": "http://127.0.0.1:1"}\n'
                                     b'{"op": "metr\n')
    assert main(["sync", "--root", str(tmp_path / "sweep")]) == 1, "dead letters are left for the user"
    out, err = capsys.readouterr()
    assert "dead-lettered 2" in out and "Traceback" not in out + err + caplog.text
    assert "has no MLflow run record: cannot apply a 'metrics' operation" in caplog.text


def test_credentials_never_go_to_a_server_named_only_by_a_planted_spool(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A job folder whose spool names a listener: `sync` without --tracking-uri skips it (saying how to send it)
    while MLflow credentials are set, and the listener hears nothing; named on the command line, it gets them."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    heard: list[dict[str, str]] = []

    class Listener(BaseHTTPRequestHandler):
        def _record(self) -> None:
            heard.append(dict(self.headers))
            self.send_response(503)
            self.end_headers()

        do_GET = do_POST = _record

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Listener)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    listener = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        (tmp_path / "job").mkdir()
        (tmp_path / "job" / CLAIM_FILE).write_text("{}")
        planted = _spool(tmp_path / "job", listener)
        monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "alice")
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "canary-password-1234")
        assert main(["sync", "--root", str(tmp_path), "--retry-s", "0"]) == 1
        out = capsys.readouterr().out
        assert heard == [] and (tmp_path / "job" / PENDING_FILE).read_bytes() == planted
        assert f"--tracking-uri {listener}" in out and "never sent to a server you did not name" in out
        monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD")
        monkeypatch.delenv("MLFLOW_TRACKING_USERNAME")
        sync_pending(tmp_path, retry=NOW)  # no credentials set: the recorded server is tried, with nothing to leak
        assert heard and not any("Authorization" in h for h in heard)
        heard.clear()
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "alice")
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "canary-password-1234")
        sync_pending(tmp_path, listener, NOW)  # the operator named it: it is tried, with their credentials
        assert heard and all("Authorization" in h for h in heard)
    finally:
        server.shutdown()


def _kept_close(sweep: Path, uri: str, **fields: object) -> bytes:
    """A sweep folder holding a kept parent-run close recorded for `uri`, as a sweep writes it; its bytes."""
    sweep.mkdir(parents=True, exist_ok=True)
    (sweep / "tuner.pkl").write_bytes(b"")
    close = SweepClose("0123456789abcdef0123456789abcdef", uri, "FINISHED", {"name": "s"}, {"done": 1, "failed": 0},
                       "the table", ["summary.md"], [["tiny-t5", "rte"]])
    keep_for_sync(sweep, replace(close, **fields))
    return (sweep / SWEEP_CLOSE_FILE).read_bytes()


def test_a_kept_sweep_run_close_follows_the_spools_server_rules(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The close of a sweep's run kept for `sync` goes only where a spool would: a close recorded for another
    server than --tracking-uri, or (with credentials set) for a server only the file names, is skipped with the way
    to send it; one naming a file outside its sweep folder is refused whole. Nothing is tried, the file stays."""
    mine, theirs = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
    kept = _kept_close(tmp_path / "sweep", theirs)
    summary = sync_pending(tmp_path, mine, NOW)
    [sweep] = summary.sweeps
    assert sweep.skipped.startswith(f"1 operation(s) recorded for {theirs}, not {mine} (sync them with "
                                    f"--tracking-uri {theirs}") and sweep.error is None and not summary.complete
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "canary-password-1234")
    assert main(["sync", "--root", str(tmp_path), "--retry-s", "0"]) == 1
    out = capsys.readouterr().out
    assert f"The sweep's run 0123456789abcdef0123456789abcdef in {tmp_path / 'sweep'} was not closed (skipped: " in out
    assert f"Sync it with --tracking-uri {theirs}" in out and "canary" not in out
    assert (tmp_path / "sweep" / SWEEP_CLOSE_FILE).read_bytes() == kept
    monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD")

    (tmp_path / "secret.txt").write_text("not the sweep's")
    for name in (str(tmp_path / "secret.txt"), "../secret.txt"):
        kept = _kept_close(tmp_path / "sweep", mine, files=["summary.md", name])
        [sweep] = sync_pending(tmp_path, mine, NOW).sweeps
        assert sweep.error.startswith(f"{SWEEP_CLOSE_FILE} is refused (files is not a list of paths inside the sweep "
                                      "folder); nothing of it was sent") and sweep.uri is None
        assert (tmp_path / "sweep" / SWEEP_CLOSE_FILE).read_bytes() == kept
    (tmp_path / "sweep" / "report").symlink_to(tmp_path)
    _kept_close(tmp_path / "sweep", mine, files=["report/secret.txt"])
    assert "files is not a list of paths inside" in sync_pending(tmp_path, mine, NOW).sweeps[0].error


def test_a_kept_sweep_run_close_waits_for_its_trials_then_is_tried(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    mine = f"http://127.0.0.1:{free_port()}"
    _kept_close(tmp_path / "sweep", mine)
    _spool(tmp_path / "sweep" / "jobs" / "rte-x", mine)
    assert main(["sync", "--root", str(tmp_path / "sweep"), "--retry-s", "0"]) == 1
    out = capsys.readouterr().out
    assert "is closed once its trials' 3 pending operation(s) are synced: run this command again then." in out
    (tmp_path / "sweep" / "jobs" / "rte-x" / PENDING_FILE).unlink()
    assert main(["sync", "--root", str(tmp_path / "sweep"), "--retry-s", "0"]) == 1
    out = capsys.readouterr().out
    assert f"was not closed: MLflow at {mine}: no answer after 1 attempt(s)" in out
    assert f"Its close stays in {SWEEP_CLOSE_FILE}: run this command again once that is fixed." in out
