"""Pure tracking helpers: retries, the spool, params and metrics, the offline tracker, promotion and tables."""

from __future__ import annotations

import math
import threading
import time
from importlib import metadata
from pathlib import Path

import pandas as pd
import pytest
import requests
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException, RestException

from pipelines.provenance import registered_model_name
from pipelines.reporting import build_tables, format_cell, markdown, run_frame
from pipelines.services import free_port
from pipelines.tracking import TrialTracker, VersionInfo, is_transient, main, sync_pending
from pipelines.tracking.client import own_http_retries
from pipelines.tracking.promotion import PromotionError, choose_best, metric_direction, metric_value
from pipelines.tracking.run_content import (
    final_metrics,
    mlflow_metric_name,
    numeric_metrics,
    project_metric_name,
    run_params,
)
from pipelines.tracking.scope import state_dirs
from pipelines.tracking.spool import (
    FAILED_FILE,
    PARAM_VALUE_LIMIT,
    PENDING_FILE,
    RetryPolicy,
    Spool,
    TrackingUnavailable,
    call_with_retry,
    param_strings,
)


class FakeClock:
    """Time that only moves when the code sleeps."""

    def __init__(self) -> None:
        self.now, self.sleeps = 0.0, []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_retry_backs_off_then_succeeds_and_gives_up_after_the_budget() -> None:
    clock, calls = FakeClock(), []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 4:
            raise ConnectionError("refused")
        return "ok"

    policy = RetryPolicy(budget_s=30, first_delay_s=0.5, max_delay_s=1.5)
    assert call_with_retry(flaky, is_transient, policy, "x", clock.sleep, lambda: clock.now) == "ok"
    assert clock.sleeps == [0.5, 1.0, 1.5]
    def down() -> None:
        raise ConnectionError("down")

    clock = FakeClock()
    with pytest.raises(TrackingUnavailable, match="no answer after"):
        call_with_retry(down, is_transient, RetryPolicy(budget_s=10, first_delay_s=1, max_delay_s=4), "x",
                        clock.sleep, lambda: clock.now)
    assert sum(clock.sleeps) == pytest.approx(10)
    with pytest.raises(ValueError):  # not transient: no retry
        call_with_retry(lambda: int("x"), is_transient, policy, "x", clock.sleep, lambda: clock.now)


def test_transient_errors_are_connection_problems_and_5xx_only(monkeypatch) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    with pytest.raises(MlflowException) as refused:  # a real client against a closed port, as MLflow raises it
        MlflowClient(f"http://127.0.0.1:{free_port()}").get_experiment("0")
    assert is_transient(refused.value)
    assert not is_transient(MlflowException("API request to http://h/api failed with exception refused")), \
        "the message alone decides nothing"
    assert is_transient(RestException({"error_code": "TEMPORARILY_UNAVAILABLE", "message": "busy"}))
    assert is_transient(requests.ConnectionError("refused"))
    assert not is_transient(RestException({"error_code": "INVALID_PARAMETER_VALUE", "message": "bad"}))
    assert not is_transient(MlflowException("Registered model not found"))
    assert not is_transient(ValueError("x"))


def _server_that_drops_its_first_request(seen: list[str]) -> int:
    """A loopback HTTP server whose first connection reads a request and closes without an answer (as a server
    closing an idle kept-alive connection does), then answers MLflow's get-experiment; the port."""
    import json
    import socket

    listener = socket.create_server(("127.0.0.1", 0))
    body = json.dumps({"experiment": {"experiment_id": "0", "name": "Default", "artifact_location": "x",
                                      "lifecycle_stage": "active"}}).encode()

    def serve() -> None:
        with listener:
            for attempt in range(2):
                connection, _ = listener.accept()
                with connection:
                    seen.append(connection.recv(65536).decode().split(" ")[1])
                    if attempt:
                        connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                           b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))

    threading.Thread(target=serve, daemon=True).start()
    return listener.getsockname()[1]


def test_a_request_the_server_dropped_unanswered_is_sent_once_more(monkeypatch) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_RESPECT_RETRY_AFTER_HEADER", "true")  # both restored after the test:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # own_http_retries writes the process environment
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    seen: list[str] = []
    with pytest.raises(MlflowException, match="Remote end closed connection"):  # without the re-send it fails
        MlflowClient(f"http://127.0.0.1:{_server_that_drops_its_first_request(seen)}").get_experiment("0")
    own_http_retries()
    seen.clear()
    port = _server_that_drops_its_first_request(seen)
    assert MlflowClient(f"http://127.0.0.1:{port}").get_experiment("0").name == "Default"
    assert len(seen) == 2 and seen[0] == seen[1] and "experiments/get" in seen[0]


def test_spool_appends_reads_in_order_and_drops_only_the_line_it_was_given(tmp_path: Path) -> None:
    spool = Spool(tmp_path / PENDING_FILE)
    spool.append({"op": "params", "params": {"a": "1"}})
    spool.append({"op": "metrics", "metrics": {"loss": 1.0}, "step": 1})
    assert [op["op"] for op in spool.read()] == ["params", "metrics"]
    first = spool.first()
    assert first is not None and first.op == {"op": "params", "params": {"a": "1"}}
    spool.drop_first(first)
    with pytest.raises(RuntimeError, match="nothing was removed"):
        spool.drop_first(first)  # the first line is another one now
    assert len(spool) == 1 and state_dirs(tmp_path) == ([tmp_path], [])
    spool.drop_first(spool.first())
    assert not spool.path.exists() and state_dirs(tmp_path) == ([], []) and spool.first() is None


def test_a_reader_without_the_lock_sees_no_error_while_the_flusher_empties_the_spool(tmp_path: Path) -> None:
    # TrialTracker.finished reads the spool while its flush thread drops the last line (which removes the file).
    spool, errors, stop = Spool(tmp_path / PENDING_FILE), [], threading.Event()

    def read_until_stopped() -> None:
        while not stop.is_set():
            try:
                spool.read()
            except Exception as err:  # noqa: BLE001 - the test reports whatever the read raised
                errors.append(err)
                return

    reader = threading.Thread(target=read_until_stopped)
    reader.start()
    try:
        for _ in range(400):
            spool.append({"op": "params", "params": {"a": "1"}})
            spool.drop_first(spool.first())
    finally:
        stop.set()
        reader.join()
    assert errors == []


def test_a_torn_last_line_is_kept_and_the_next_append_is_not_swallowed(tmp_path: Path) -> None:
    spool, dead = Spool(tmp_path / PENDING_FILE), Spool(tmp_path / FAILED_FILE)
    spool.append({"op": "params", "params": {"a": "1"}})
    with spool.path.open("a") as handle:
        handle.write('{"op": "fin')  # a crash mid-append
    spool.append({"op": "end", "status": "FAILED", "timestamp": 1})
    assert [op["op"] for op in spool.read()] == ["params", "end"]
    assert [(line.number, line.raw, line.op is None) for line in spool.lines()] == [
        (1, b'{"op": "params", "params": {"a": "1"}}', False), (2, b'{"op": "fin', True),
        (3, b'{"op": "end", "status": "FAILED", "timestamp": 1}', False)]
    assert len(spool) == 3  # the torn line still waits: nothing is skipped silently
    assert spool.quarantine(dead) == 1
    [record] = dead.records()
    assert record["raw"] == '{"op": "fin' and record["line"] == 2 and record["file"] == str(spool.path)
    assert "not valid JSON" in record["reason"] and "torn" in record["reason"]
    assert [op["op"] for op in spool.read()] == ["params", "end"] and len(spool) == 2


def test_every_kind_of_corrupt_line_is_dead_lettered_with_its_reason(tmp_path: Path) -> None:
    spool, dead = Spool(tmp_path / PENDING_FILE), Spool(tmp_path / FAILED_FILE)
    spool.path.write_bytes(b'{"op": "params", "params": {}}\n\xff\xfe{"op": "end"}\n[1, 2]\n\n'
                           b'{"op": "teleport"}\n{"op": "metrics", "metrics": {}, "step": 1, "timestamp": 1}\n')
    assert spool.quarantine(dead) == 3
    reasons = {record["line"]: (record["raw"], record["reason"]) for record in dead.records()}
    assert reasons[2][0] == '\\xff\\xfe{"op": "end"}' and "not UTF-8" in reasons[2][1]
    assert reasons[3][0] == "[1, 2]" and "not a tracking operation" in reasons[3][1]
    assert reasons[5][0] == '{"op": "teleport"}' and "not a tracking operation" in reasons[5][1]
    assert [op["op"] for op in spool.read()] == ["params", "metrics"] and len(spool) == 2


def test_params_are_flat_strings_within_the_limit_and_metrics_numeric() -> None:
    params = param_strings({"model": {"name": "t5"}, "method": {"options": {"layers": [0, 1]}}, "x": None,
                            "long": "y" * 2000})
    assert params["model.name"] == "t5" and params["method.options.layers"] == "[0, 1]" and params["x"] == "None"
    assert len(params["long"]) == PARAM_VALUE_LIMIT and params["long"].endswith("[truncated]")
    assert numeric_metrics({"step": 3, "loss": 1, "flag": True, "name": "a", "bad": math.nan}) == {
        "step": 3.0, "loss": 1.0}
    result = {"metrics": {"test_score": 50.0, "train_loss": 0.5, "best_validation_score": 60.0}, "steps": 7,
              "stopped_early": False, "history": [{}], "wall_time_s": 2.0, "trainable_parameters": 64}
    assert final_metrics(result) == {"test/score": 50.0, "perf/wall_time_s": 2.0}
    assert registered_model_name("t5-base", "rte") == "capt-t5-base-rte"


def test_metric_names_group_in_mlflow_and_map_back_to_the_project_names() -> None:
    names = {"train_loss": "train/loss", "validation_score": "validation/score", "test_macro_f1": "test/macro_f1",
             "best_validation_score": "validation/best_score", "epoch": "train/epoch",
             "tokens_per_second": "perf/tokens_per_second", "system/cpu_utilization_percentage":
             "system/cpu_utilization_percentage", "loss": "loss"}
    assert {k: mlflow_metric_name(k) for k in names} == names
    assert {v: project_metric_name(v) for v in names.values()} == {v: k for k, v in names.items()}


def test_params_hold_resolved_values_and_paths_become_tags() -> None:
    config = {"output_dir": "outputs/x", "task": {"name": "rte", "data_dir": None, "max_train_examples": None},
              "optim": {"lr": 0.3, "head_lr": 0.001}, "method": {"name": "capt", "options": {}}}
    assert run_params(config, classifier_head=False) == ({"task.name": "rte", "optim.lr": 0.3, "method.name": "capt"},
                                        {"output_dir": "outputs/x"})
    params, _ = run_params({**config, "task": {"name": "rte", "data_dir": "/data"}}, classifier_head=True)
    assert params["optim.head_lr"] == 0.001 and "task.data_dir" not in params


def test_an_unreachable_server_never_fails_the_trial_and_spools_everything(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    tracker = TrialTracker(closed, "exp", "rte/tiny-t5/capt/s0", {"task": "rte"}, tmp_path,
                           retry=RetryPolicy(budget_s=0.3, first_delay_s=0.1), reconnect_s=3600)
    began = time.monotonic()
    assert tracker.start() is None and tracker.offline
    tracker.log_params({"a": 1})
    tracker.log_metrics({"loss": 1.0, "step": 1}, step=1)
    assert tracker.finish({"task": "rte", "metrics": {}}, tmp_path / "artifact", register=True) is None
    assert time.monotonic() - began < 10
    ops = Spool(tmp_path / PENDING_FILE).read()
    assert [op["op"] for op in ops] == ["start", "params", "metrics", "finish"]
    assert ops[2]["metrics"] == {"loss": 1.0} and all(op["tracking_uri"] == closed for op in ops)
    summary = sync_pending(tmp_path, retry=RetryPolicy(budget_s=0.0))
    assert (summary.synced, summary.pending) == (0, 4) and "no answer after" in summary.folders[0].error
    assert len(Spool(tmp_path / PENDING_FILE)) == 4  # nothing lost
    assert main(["sync", "--root", str(tmp_path), "--retry-s", "0"]) == 1
    out = capsys.readouterr().out
    assert "Synced 0 operation(s)" in out and "4 still pending" in out and closed in out


def _spool_of_two_trials(root: Path, uri: str) -> None:
    """Two trial folders spooled against `uri`, the first with a corrupt line and a torn last line."""
    for name in ("a", "b"):
        spool = Spool(root / name / PENDING_FILE)
        spool.append({"op": "start", "experiment": "e", "run_name": name, "tags": {}, "trial_key": name,
                      "timestamp": 1, "tracking_uri": uri})
        spool.append({"op": "params", "params": {"x": "1"}, "tracking_uri": uri})
    with (root / "a" / PENDING_FILE).open("a") as handle:
        handle.write('not json\n{"op": "metr')


def test_sync_with_the_server_down_dead_letters_corrupt_lines_and_keeps_the_rest_pending(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    _spool_of_two_trials(tmp_path, closed)
    summary = sync_pending(tmp_path, retry=RetryPolicy(budget_s=0.0))
    counts = {f.state_dir.name: (f.synced, f.dead_lettered, f.pending, f.dead_letters) for f in summary.folders}
    assert counts == {"a": (0, 2, 2, 2), "b": (0, 0, 2, 0)}
    assert (summary.synced, summary.dead_lettered, summary.pending, summary.complete) == (0, 2, 4, False)
    assert closed in summary.folders[0].error and summary.folders[1].error == summary.folders[0].error
    raws = [record["raw"] for record in Spool(tmp_path / "a" / FAILED_FILE).records()]
    assert raws == ["not json", '{"op": "metr']
    assert main(["sync", "--root", str(tmp_path), "--retry-s", "0"]) == 1  # still pending, dead letters kept
    out = capsys.readouterr().out
    assert "Synced 0 operation(s)" in out and "dead-lettered 0; 4 still pending" in out
    assert "  a: 0 synced, 0 dead-lettered now (2 in mlflow_failed.jsonl), 2 still pending" in out


def test_sync_of_a_missing_root_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "no-such-folder"
    assert main(["sync", "--root", str(missing)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --root") and str(missing) in err and "does not exist" in err
    assert err.count("\n") == 1, "one paragraph"
    (tmp_path / "job_config.json").write_text("{}")  # a job folder with nothing spooled
    assert main(["sync", "--root", str(tmp_path)]) == 0
    assert "Nothing to sync under" in capsys.readouterr().out


def _version(number: int, value: float | None, aliases: tuple[str, ...] = (), tag: str | None = None,
             run_error: str | None = None) -> VersionInfo:
    tags = {"test_score": tag} if tag is not None else {}
    metrics = {"test_score": value} if value is not None else {}
    return VersionInfo("m", number, f"r{number}", tags, list(aliases), "None", metrics, number, run_error)


def test_best_version_reads_its_run_never_its_tags_then_keeps_the_champion_on_ties(
        caplog: pytest.LogCaptureFixture) -> None:
    assert metric_value(_version(1, 50.0, tag="70"), "test_score") == 50.0
    assert metric_value(_version(1, None, tag="99.5"), "test_score") is None
    assert metric_value(_version(1, math.nan), "test_score") is None
    versions = [_version(1, 60.0, ("champion",)), _version(2, 60.0), _version(3, 55.0, tag="99.5"), _version(4, None),
                _version(5, 90.0, run_error="its source run r5 does not exist")]
    assert choose_best(versions, "test_score")[0].version == 1
    assert "version 4: its source run r4 logged no 'test_score'" in caplog.text
    assert "version 5: its source run r5 does not exist" in caplog.text
    assert choose_best(versions[1:], "test_score")[0].version == 2  # no champion: the newest of the best
    with pytest.raises(PromotionError, match="No version's source run logged a numeric 'accuracy'"):
        choose_best(versions, "accuracy")


def test_a_metric_is_chosen_in_its_known_or_stated_direction() -> None:
    versions = [_version(1, 60.0), _version(2, 55.0)]
    assert choose_best(versions, "test_score", metric_direction("test_score"))[0].version == 1
    assert choose_best(versions, "test_score", higher_is_better=False)[0].version == 2
    assert metric_direction("best_validation_score") is True and metric_direction("train_loss") is False
    assert metric_direction("my_cost", higher_is_better=False) is False
    with pytest.raises(PromotionError, match="'accuracy': its direction is unknown.*--lower-is-better"):
        metric_direction("accuracy")
    with pytest.raises(PromotionError, match="for this metric higher is better"):
        metric_direction("best_validation_score", higher_is_better=False)


def _run(task: str, method: str, seed: int, value: float, validation: float = 0.0, model: str = "t5-base",
         status: str = "FINISHED") -> dict:
    return {"run_id": f"{task}{method}{seed}{value}", "status": status,
            "tags": {"task": task, "method": method, "seed": str(seed), "model": model},
            "metrics": {"test_score": value, "best_validation_score": validation}}


def test_the_superglue_average_leaves_csqa_out_and_csqa_has_its_own_column() -> None:
    runs = [_run("rte", "capt", 0, 70.0), _run("cb", "capt", 0, 90.0), _run("csqa", "capt", 0, 20.0),
            _run("rte", "lora", 0, 60.0), _run("csqa", "lora", 0, 30.0)]
    table = build_tables(run_frame(runs, "test_score"))["t5-base"]
    assert list(table.columns.get_level_values(0).unique()) == ["cb", "rte", "SuperGLUE avg", "csqa"]
    assert table.loc["capt", ("SuperGLUE avg", "mean")] == 80.0 and table.loc["lora", ("SuperGLUE avg", "mean")] == 60.0
    text = markdown({"t5-base": table}, "test_score", "title")
    assert "| method | cb | rte | SuperGLUE avg (2 of 6 tasks) | csqa |" in text
    assert "| lora | - | 60.00 | 60.00* | 30.00 |" in text and "| capt | 90.00 | 70.00 | 80.00 | 20.00 |" in text


def test_report_tables_select_on_validation_and_format_mean_std() -> None:
    runs = [_run("rte", "capt", 0, 70.0), _run("rte", "capt", 1, 74.0), _run("cb", "capt", 0, 90.0),
            _run("rte", "lora", 0, 60.0, validation=1.0), _run("rte", "lora", 0, 99.0, validation=0.5),
            _run("rte", "lora", 1, 10.0, status="FAILED"), _run("rte", "capt", 0, 10.0, model="llama")]
    frame = run_frame(runs, "test_score")
    assert len(frame) == 5 and frame.loc[frame.method == "lora", "value"].tolist() == [60.0]
    tables = build_tables(frame)
    assert list(tables) == ["llama", "t5-base"]
    table = tables["t5-base"]
    assert list(table.index) == ["lora", "capt"]
    assert table.loc["capt", ("rte", "mean")] == 72.0
    assert table.loc["capt", ("rte", "std")] == pytest.approx(math.sqrt(8))
    assert table.loc["capt", ("SuperGLUE avg", "mean")] == 81.0
    text = markdown(tables, "test_score", "title")
    assert "| method | cb | rte | SuperGLUE avg (2 of 6 tasks) |" in text
    assert "| capt | 90.00 | 72.00 ± 2.83 | 81.00 |" in text and "| lora | - | 60.00 | 60.00* |" in text
    assert format_cell(float("nan"), float("nan")) == "-"
    assert run_frame([], "test_score").empty and isinstance(run_frame([], "x"), pd.DataFrame)


def test_pyfunc_requirements_are_public_versions_and_name_the_project() -> None:
    from pipelines.tracking.pyfunc import _public_version, _requirements

    assert _public_version("2.13.0+cpu") == "2.13.0" and _public_version("1.0.0") == "1.0.0"
    pins = _requirements()
    assert not [pin for pin in pins if "+" in pin], pins
    assert f"capt=={metadata.version('capt')}" in pins and any(pin.startswith("torch==") for pin in pins)


def test_the_background_uploader_keeps_unexpected_errors_and_goes_on(tmp_path: Path) -> None:
    from pipelines.tracking.tracker import BackgroundUploader

    calls, done = [], [threading.Event(), threading.Event()]

    def upload() -> None:
        calls.append(len(calls))
        done[calls[-1]].set()
        if calls == [0]:
            raise ValueError("a bug in the upload")

    uploader = BackgroundUploader(upload, "test")
    uploader.close()  # never woken: nothing to stop
    for event in done:
        uploader.wake()
        assert event.wait(timeout=60)
    uploader.close()
    assert calls == [0, 1] and uploader.errors == ["ValueError: a bug in the upload"]


def test_metrics_logged_while_offline_stay_in_the_spool_in_order(tmp_path: Path) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    tracker = TrialTracker(closed, "exp", "rte/tiny-t5/capt/s0", {}, tmp_path, system_metrics=False,
                           retry=RetryPolicy(budget_s=0.2, first_delay_s=0.1), reconnect_s=3600)
    tracker.start()
    for step in (1, 2, 3):
        tracker.log_metrics({"loss": float(step)}, step=step)
    tracker.fail()
    ops = Spool(tmp_path / PENDING_FILE).read()
    assert [(op["op"], op.get("step")) for op in ops] == [("start", None), ("metrics", 1), ("metrics", 2),
                                                          ("metrics", 3), ("end", None)]
    assert tracker.background_problems == []
