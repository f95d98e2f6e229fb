"""`python -m pipelines.serve` on a real local Ray + Serve and a real MLflow server: mixed-task requests answer
what each task's registry pyfunc answers, a moved alias is served after a poll, bad requests get 4xx, the
start-up line names the generated token file (mode 600) and requests need that token, and the entry point
refuses a bad command line with one paragraph."""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd
import pytest
from helpers.bad_inputs import entry_env
from helpers.registry import track, train_capsule
from helpers.serve_process import serve_entry_point
from mlflow import MlflowClient

from capt.tasks import generate_rows
from pipelines import promote, serve
from pipelines.services import LOCALHOST, LocalMlflowServer, free_port

pytestmark = pytest.mark.integration

EXPERIMENT = "test-serve"
MODEL = "tiny-serve"  # a slug of its own: capt-tiny-serve-<task>, whatever other tests register
POLL_S = 2.0
MAX_ROWS = 8


def _rows(task: str, count: int, seed: int) -> list[dict[str, Any]]:
    return [{k: v for k, v in row.items() if k not in ("generated", "label", "idx")}
            for row in generate_rows(task, "val", count, seed=seed)]


@pytest.fixture(scope="module")
def registry(mlflow_server: LocalMlflowServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """RTE (two versions: the champion, and one to move the alias to) and CB of tiny-t5, promoted."""
    out = tmp_path_factory.mktemp("serve-jobs")
    jobs = {(task, seed): train_capsule(out / f"{task}{seed}", task, seed) for task, seed in
            (("rte", 0), ("cb", 0), ("rte", 1))}
    for (task, seed), result in jobs.items():
        if seed == 0:
            track(mlflow_server.uri, {**result, "model_slug": MODEL}, EXPERIMENT)
            promote.promote(MODEL, task, tracking_uri=mlflow_server.uri)
    return {"uri": mlflow_server.uri, "jobs": jobs}


TOKEN: dict[str, str] = {}
"""The bearer token the server generated (read from the file its start-up line names)."""


def _headers() -> dict[str, str]:
    return {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN.get('token', '')}"}


def _post(url: str, body: Any) -> tuple[int, dict[str, Any]]:
    data = json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers=_headers())
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _get(url: str) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=_headers()), timeout=5) as response:
            return json.loads(response.read())
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


@pytest.fixture(scope="module")
def server(registry: dict[str, Any], tmp_path_factory: pytest.TempPathFactory):
    """The entry point as a real process serving every task with a champion (rte, cb) on a local Ray, Serve on
    127.0.0.1:<free port>, with a token it generates (read into TOKEN); SIGINT at the end."""
    port = free_port(LOCALHOST)
    log = tmp_path_factory.mktemp("serve-log") / "serve.log"
    command = [sys.executable, "-m", "pipelines.serve", "--model", MODEL, "--all", "--tracking-uri",
               registry["uri"], "--port", str(port), "--poll-s", str(POLL_S), "--max-rows", str(MAX_ROWS),
               "--num-cpus", "2"]
    env = {k: v for k, v in entry_env().items() if k != "CAPT_SERVE_TOKEN"}
    url = f"http://{LOCALHOST}:{port}/"
    with serve_entry_point(command, env, log) as (proc, line):
        token_file = re.search(r"token in (\S+) \(mode 600, generated now\)", line)
        assert token_file, line
        assert stat.S_IMODE(os.stat(token_file.group(1)).st_mode) == 0o600
        TOKEN["token"] = Path(token_file.group(1)).read_text().strip()
        assert _get(url + "health") == {"status": "ok"}
        yield url
    assert proc.returncode == 0, log.read_text()[-3000:]
    assert _get(url + "health") is None


def _pyfunc_labels(uri: str, name: str, rows: list[dict[str, Any]], ref: str = "champion") -> list[str]:
    mlflow.set_tracking_uri(uri)
    return list(mlflow.pyfunc.load_model(f"models:/{name}@{ref}").predict(pd.DataFrame(rows)))


def test_mixed_task_requests_answer_as_each_task_pyfunc(registry: dict[str, Any], server: str) -> None:
    rows = {"rte": _rows("rte", 6, seed=5), "cb": _rows("cb", 6, seed=6)}
    requests = [("rte", rows["rte"][:3]), ("cb", rows["cb"][:4]), ("rte", rows["rte"][3:]), ("cb", rows["cb"][4:])]
    with ThreadPoolExecutor(len(requests)) as pool:  # at once, so that Serve batches them together
        answers = list(pool.map(lambda r: _post(server, {"task": r[0], "inputs": r[1]}), requests))
    assert all(status == 200 for status, _ in answers), answers
    for task in ("rte", "cb"):
        served = [label for (t, _), (_, body) in zip(requests, answers, strict=True) if t == task
                  for label in body["labels"]]
        assert served == _pyfunc_labels(registry["uri"], f"capt-{MODEL}-{task}", rows[task])
    body = answers[1][1]
    assert (body["model"], body["version"], body["label_names"]) == (
        f"capt-{MODEL}-cb", 1, ["entailment", "contradiction", "neutral"])
    assert len(body["scores"]) == 4 and all(len(s) == 3 for s in body["scores"])


@pytest.mark.parametrize(("body", "status", "phrase"), [
    ({"task": "boolq", "inputs": [{"question": "q", "passage": "p"}]}, 400, "task='boolq' is not served here"),
    ({"task": "rte", "inputs": [{"premise": "A cat sat."}]}, 400, "field 'hypothesis': missing field"),
    ({"inputs": [{"premise": "a", "hypothesis": "b"}]}, 400, "The field 'task' is missing"),
    ({"task": "rte", "inputs": [{"premise": "a", "hypothesis": "b"}] * (MAX_ROWS + 1)}, 413, f"at most {MAX_ROWS}"),
], ids=["unknown-task", "missing-field", "no-task", "oversized"])
def test_bad_requests_get_4xx_with_a_clear_message(server: str, body: Any, status: int, phrase: str) -> None:
    got, answer = _post(server, body)
    assert (got, phrase in answer["error"]) == (status, True), answer


def test_requests_without_the_generated_token_get_401(server: str) -> None:
    request = urllib.request.Request(server, data=b'{"task": "rte", "inputs": []}',
                                     headers={"Authorization": "Bearer x"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 401 and json.loads(refused.value.read())["field"] == "Authorization"


def test_a_moved_alias_is_served_without_a_restart(registry: dict[str, Any], server: str) -> None:
    uri, name = registry["uri"], f"capt-{MODEL}-rte"
    track(uri, {**registry["jobs"][("rte", 1)], "model_slug": MODEL}, EXPERIMENT)
    MlflowClient(uri).set_registered_model_alias(name, "champion", "2")
    rows = _rows("rte", 4, seed=7)
    deadline, versions = time.monotonic() + 120, []
    while time.monotonic() < deadline:  # every request is answered, by the old version or the new one
        status, body = _post(server, {"task": "rte", "inputs": rows})
        assert status == 200, body
        versions.append(body["version"])
        if body["version"] == 2:
            break
        time.sleep(POLL_S / 4)
    assert versions[-1] == 2 and set(versions) <= {1, 2}, versions
    assert body["labels"] == _pyfunc_labels(uri, name, rows)
    assert _get(server + "tasks")["versions"] == {"rte": 2, "cb": 1}


@pytest.mark.parametrize(("args", "phrase"), [
    (["--model", "no-such-model", "--tasks", "rte"], "no capsule of this base model is registered"),
    (["--model", MODEL, "--tasks", "rte,nope"], "unknown task(s) 'nope'"),
    (["--model", MODEL, "--tasks", "boolq"], "for task 'boolq' is registered"),
    (["--model", MODEL, "--tasks", "rte", "--alias", "nobody"], "has no version with this alias"),
], ids=["unknown-model", "unknown-task", "unregistered-task", "no-version-at-alias"])
def test_the_entry_point_refuses_bad_input_in_one_paragraph(registry: dict[str, Any], args: list[str], phrase: str,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert serve.main([*args, "--tracking-uri", registry["uri"], "--port", str(free_port(LOCALHOST))]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"Tracking store: {registry['uri']} (from --tracking-uri)\nerror: "), err
    assert phrase in err and "Traceback" not in err, err


def test_an_unreachable_mlflow_is_one_paragraph(capsys: pytest.CaptureFixture[str]) -> None:
    closed = f"http://{LOCALHOST}:{free_port(LOCALHOST)}"
    assert serve.main(["--model", MODEL, "--tasks", "rte", "--tracking-uri", closed]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and closed in err and "Traceback" not in err, err
