"""What a person finds in MLflow after the smoke sweep, checked through MLflow's REST API: the experiment's
description, clean params, grouped metrics, system metrics, a dataset per run, named logged models linked to
their metrics, and a registered version whose loading snippet runs. The browser side is test_mlflow_browser.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import requests
from helpers.mlflow_runs import is_sweep_run

from capt.tasks import get as task_spec
from pipelines.tracking.pyfunc import SNIPPET_FENCE

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
SWEEP = "it-ui"
MODELS = ("tiny-t5", "minilm")
TASKS = ("cb", "rte")
RUN_NAMES = sorted(f"{task}/{model}/capt/s0" for task in TASKS for model in MODELS)
METRIC_GROUPS = ("train", "validation", "test", "perf", "system")


def _rest(uri: str, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
    answer = requests.request(method, f"{uri}/api/2.0/mlflow/{path}", timeout=30, **kwargs)
    answer.raise_for_status()
    return answer.json()


def _runs(smoke_sweep: dict[str, Any]) -> list[dict[str, Any]]:
    uri = smoke_sweep["uri"]
    runs = _rest(uri, "POST", "runs/search", json={"experiment_ids": [smoke_sweep["experiment_id"]]})["runs"]
    return [run for run in runs if not is_sweep_run(run)]


def test_the_sweep_is_a_parent_run_holding_its_config_summary_and_report(smoke_sweep: dict[str, Any]) -> None:
    uri = smoke_sweep["uri"]
    every = _rest(uri, "POST", "runs/search", json={"experiment_ids": [smoke_sweep["experiment_id"]]})["runs"]
    [parent] = [run for run in every if is_sweep_run(run)]
    assert parent["info"]["status"] == "FINISHED" and parent["info"]["run_name"] == f"{SWEEP} (sweep)"
    children = [run for run in _runs(smoke_sweep) if _pairs(run["data"]["tags"]).get("mlflow.parentRunId")
                == parent["info"]["run_id"]]
    assert sorted(run["info"]["run_name"] for run in children) == RUN_NAMES, "every trial's run is nested under it"
    assert {m["key"]: m["value"] for m in parent["data"]["metrics"]} == {"trials/done": 4.0, "trials/failed": 0.0}
    listed = _rest(uri, "GET", "artifacts/list", params={"run_id": parent["info"]["run_id"]})["files"]
    assert {"sweep_config.json", "summary.md", "summary.csv", "README.md", "report.md", "report.png"} <= {
        f["path"] for f in listed}, listed
    description = _pairs(parent["data"]["tags"])["mlflow.note.content"]  # what the run's page shows first
    link = f"#/experiments/{smoke_sweep['experiment_id']}/runs/{parent['info']['run_id']}/artifacts/report.md"
    assert description.startswith("**Report**") and f"[report.md]({link})" in description, description
    rows = [line for line in description.splitlines() if line.split(" | ")[0] in ("| cb", "| rte")]
    assert f"# Sweep `{SWEEP}`: results" in description and len(rows) == 4, description


def _pairs(items: list[dict[str, str]] | None) -> dict[str, str]:
    return {item["key"]: item["value"] for item in items or []}


def _steps(uri: str, run: dict[str, Any], key: str) -> list[int]:
    history = _rest(uri, "GET", "metrics/get-history", params={"run_id": run["info"]["run_id"], "metric_key": key})
    return sorted({int(m.get("step", 0)) for m in history["metrics"]})  # a point linked to the model repeats its step


def test_the_experiment_says_what_the_sweep_is(smoke_sweep: dict[str, Any]) -> None:
    experiment = _rest(smoke_sweep["uri"], "GET", "experiments/get",
                       params={"experiment_id": smoke_sweep["experiment_id"]})["experiment"]
    tags = _pairs(experiment["tags"])
    description = tags["mlflow.note.content"]
    assert f"CaPT sweep **{SWEEP}**: 4 trial(s)" in description
    assert "config file: `pipelines/configs/smoke.yaml`" in description and "models: tiny-t5, minilm" in description
    assert tags["sweep"] == SWEEP and tags["models"] == "tiny-t5,minilm" and tags["trials"] == "4"
    runs_page = (f"/#/experiments/{experiment['experiment_id']}/runs?workflowType=machine_learning"
                 "&orderByKey=metrics.%60validation%2Fbest_score%60&orderByAsc=false")
    assert smoke_sweep["url"].endswith(runs_page)


def test_runs_hold_resolved_params_grouped_metrics_system_metrics_and_their_dataset(
        smoke_sweep: dict[str, Any]) -> None:
    runs = _runs(smoke_sweep)
    assert sorted(r["info"]["run_name"] for r in runs) == RUN_NAMES
    for run in runs:
        params, tags = _pairs(run["data"].get("params")), _pairs(run["data"].get("tags"))
        metrics = {m["key"] for m in run["data"]["metrics"]}
        name = run["info"]["run_name"]
        task = name.split("/")[0]
        assert params and not [k for k, v in params.items() if v in ("None", "", "{}")], name
        assert not [k for k, v in params.items() if "/" in v or k in ("output_dir", "task.data_dir")], name
        assert params["optim.name"] in ("adafactor", "adamw") and float(params["optim.lr"]) > 0
        assert ("optim.head_lr" in params) == ("minilm" in name), "a head lr only for a model with a head"
        assert Path(tags["output_dir"]).is_dir() and tags["mlflow.source.name"] == "pipelines/sweep.py"
        assert int(tags["steps"]) == 100 and int(tags["trainable_parameters"]) > 0 and int(tags["capsule_bytes"]) > 0
        assert {"train/loss", "validation/score", "validation/best_score", "test/score"} <= metrics, name
        assert all(key.split("/")[0] in METRIC_GROUPS for key in metrics), sorted(metrics)
        assert not metrics & {"steps", "best_step", "epochs", "trainable_parameters"}, "summaries are tags"
        assert any(key.startswith("system/") for key in metrics), f"{name} has no system metrics"
        assert _steps(smoke_sweep["uri"], run, "validation/score") == [25, 50, 75, 100], "a curve over validation steps"
        assert _steps(smoke_sweep["uri"], run, "test/score") == [0], "a one-off at step 0: a bar across runs"
        assert tags["mlflow.note.content"].startswith(f"capt on {task} with base model"), tags["mlflow.note.content"]
        [dataset] = [d["dataset"] for d in run["inputs"]["dataset_inputs"]]
        assert dataset["name"] == f"{task}-generated" and len(dataset["digest"]) == 16
        assert '"sizes": {"train": ' in dataset["profile"] and '"sample_rows": [{' in dataset["profile"]


def test_logged_models_are_named_and_carry_their_metrics(smoke_sweep: dict[str, Any]) -> None:
    uri = smoke_sweep["uri"]
    found = _rest(uri, "POST", "logged-models/search", json={"experiment_ids": [smoke_sweep["experiment_id"]]})
    models = {m["info"]["name"]: m for m in found["models"]}
    assert sorted(models) == sorted(f"capsule-{m}-{t}" for t in TASKS for m in MODELS)
    for model in models.values():
        linked = {m["key"] for m in model["data"]["metrics"]}
        assert {"test/score", "validation/best_score"} <= linked, linked
        assert _pairs(model["info"]["tags"])["mlflow.source.name"] == "pipelines/sweep.py"


def test_a_registered_version_describes_itself_and_its_loading_snippet_runs(smoke_sweep: dict[str, Any],
                                                                             tmp_path: Path) -> None:
    uri = smoke_sweep["uri"]
    [run] = [r for r in _runs(smoke_sweep) if r["info"]["run_name"] == "rte/minilm/capt/s0"]
    [version] = _rest(uri, "GET", "model-versions/search",
                      params={"filter": f"run_id='{run['info']['run_id']}'"})["model_versions"]
    description = version["description"]
    assert "**rte** on base model **minilm**" in description and "KiB" in description, description
    assert "What the test score has to beat, on the same test split: the majority class " in description
    [model] = _rest(uri, "GET", "registered-models/search",
                    params={"filter": "name='capt-minilm-rte'"})["registered_models"]
    assert "CaPT capsules for task **rte** on base model **minilm**" in model.get("description", ""), model
    [snippet] = SNIPPET_FENCE.findall(description)
    assert f"models:/capt-minilm-rte/{version['version']}" in snippet
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "PYTHONPATH")}
    done = subprocess.run([sys.executable, "-c", snippet], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    predicted = re.findall(r"'([^']+)'", done.stdout)
    assert predicted and set(predicted) <= set(task_spec("rte").label_names), done.stdout
    assert "newly initialized" not in done.stderr and "LOAD REPORT" not in done.stderr, done.stderr[-3000:]
