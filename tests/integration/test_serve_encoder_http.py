"""Encoder-only capsules served over HTTP (issue 35 item 1) on a real local Ray: two tiny-bert capsules of tasks
with 2 and 3 labels (RTE, CB), each with its own linear head and readout, deployed once in one app; concurrent
requests for both tasks answer the labels each task's registry predictor gives, and its scores to 1e-5."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import torch
from helpers.bad_inputs import ROOT
from helpers.jobs import tiny_job
from helpers.ray_head import LocalRayHead

from capt.tasks import example_rows
from pipelines.adapted import _to
from pipelines.capsule_predictor import CapsulePredictor, validated_examples
from pipelines.services import LOCALHOST, free_port
from pipelines.training.loop import run

pytestmark = pytest.mark.integration

TOKEN = "integration-token-encoder-0123456789"
PREFIX = "/capt-encoder"
READOUTS = {"rte": "capsule", "cb": "mean"}

DRIVER = """
import json, sys
from pathlib import Path
import ray
from ray import serve
args = json.loads(sys.argv[1])
ray.init(address=args["address"], runtime_env={"env_vars": args["env"]}, logging_level="WARNING")
if args["deploy"]:
    from pipelines.serving.app import deployment
    from pipelines.serving.records import ServedCapsule
    from pipelines.serving.settings import ServeSettings
    served = []
    for path in args["results"]:
        result = json.loads(Path(path).read_text())
        served.append(ServedCapsule(result["task"], result["task"], "capt-tiny-bert-" + result["task"], 1,
                                    Path(result["artifact_dir"]), result))
    serve.start(http_options={"host": "127.0.0.1", "port": args["port"]})
    serve.run(deployment(ServeSettings(**args["settings"]), served), name="capt-encoder", route_prefix=args["prefix"])
else:
    serve.shutdown()
"""
"""Deploys (or shuts down) the app from a driver process of its own, as test_serve_http.py does."""


def _driver(ray_head: LocalRayHead, **args: Any) -> None:
    env = {**os.environ, **ray_head.client_env(), "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    worker_env = {"PYTHONPATH": env["PYTHONPATH"], "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", DRIVER, json.dumps({"address": ray_head.address, "env": worker_env,
                                                                     "prefix": PREFIX, **args})],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    out = tmp_path_factory.mktemp("encoder-http-jobs")
    return {task: run(tiny_job(out / task, "tiny-bert", "capt", f"model.readout={readout}", task={"name": task},
                               train={"max_steps": 3, "eval_every_steps": 3}))
            for task, readout in READOUTS.items()}


@pytest.fixture(scope="module")
def port(ray_head: LocalRayHead, jobs: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    from pipelines.serving.auth import digest

    folder = tmp_path_factory.mktemp("encoder-http-results")
    results = []
    for task, result in jobs.items():
        (folder / f"{task}.json").write_text(json.dumps(result, default=str))
        results.append(str(folder / f"{task}.json"))
    settings = {"model": "tiny-bert", "tasks": list(jobs), "tracking_uri": "local capsules",
                "token_sha256": digest(TOKEN), "num_cpus": 0.5}
    chosen = free_port(LOCALHOST)
    try:
        _driver(ray_head, deploy=True, results=results, settings=settings, port=chosen)
        yield chosen
    finally:
        _driver(ray_head, deploy=False)


def _post(port: int, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(f"http://{LOCALHOST}:{port}{PREFIX}/", json.dumps(body).encode(),
                                     {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def test_two_tasks_of_an_encoder_answer_as_each_task_alone(port: int, jobs: dict[str, Any]) -> None:
    rows = {task: example_rows(task, 4) for task in jobs}
    with ThreadPoolExecutor(4) as pool:  # concurrent requests: Serve may batch them together
        answers = list(pool.map(lambda task: _post(port, {"task": task, "inputs": rows[task]}), [*jobs, *jobs]))
    for answer in answers:
        result = jobs[answer["task"]]
        predictor = CapsulePredictor(result["artifact_dir"], result)
        batch = predictor.collator(validated_examples(result["task"], rows[answer["task"]]))
        with torch.no_grad():
            scores = torch.log_softmax(predictor.model(**_to(batch, predictor.device)).logits, dim=-1)
        assert answer["labels"] == predictor.predict_rows(rows[answer["task"]])
        assert torch.allclose(torch.tensor(answer["scores"]), scores, atol=1e-5), (answer["scores"], scores)
        assert answer["model"] == f"capt-tiny-bert-{answer['task']}" and answer["version"] == 1
