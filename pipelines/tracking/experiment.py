"""An experiment as the MLflow UI shows it (the sweep's description, tags, source tags and the runs-view URL), and its
trials' runs read back (`experiment_runs`, for `pipelines.report`)."""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import mlflow
from mlflow.exceptions import MlflowException

from pipelines.tracking.client import TrackingError, ensure_experiment, is_transient, mlflow_client, own_http_retries
from pipelines.tracking.run_content import DESCRIPTION_TAG, RUN_KIND_TAG, project_metrics
from pipelines.tracking.spool import RetryPolicy, TrackingUnavailable, call_with_retry

logger = logging.getLogger(__name__)
TRAINING_VIEW = "workflowType=machine_learning"
"""The query that makes MLflow 3's UI show an experiment and its runs as model training: without it the UI follows
the browser's own choice (its sidebar switch, GenAI at first), and 3.17 reads no experiment tag for it (its
``mlflow.experimentKind`` tag is read only with workflow-based navigation off, which 3.17 hard-codes on)."""
SELECTION_SORT = "orderByKey=metrics.%60validation%2Fbest_score%60&orderByAsc=false"
"""The runs table sorted by the selection metric, best first (the UI keeps its sort in these query keys; which
columns it shows first is the browser's own choice, kept per browser, which no URL or tag sets)."""


def runs_url(ui_uri: str, experiment_id: str) -> str:
    """The URL that opens the experiment's runs table in the MLflow UI at `ui_uri`: MLflow 3's training-runs view (the
    plain experiment link opens the GenAI traces page), best validation first."""
    return f"{ui_uri.rstrip('/')}/#/experiments/{experiment_id}/runs?{TRAINING_VIEW}&{SELECTION_SORT}"


def run_url(ui_uri: str, experiment_id: str, run_id: str, tab: str = "") -> str:
    """The URL that opens one run's page (its `tab`, e.g. ``artifacts``) in the MLflow UI at `ui_uri`, as a
    training run (without `TRAINING_VIEW` a fresh browser shows it as a GenAI run, with an Evaluations tab)."""
    return f"{ui_uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}{'/' + tab if tab else ''}?{TRAINING_VIEW}"


def sweep_run_url(ui_uri: str, experiment_id: str, run_id: str) -> str:
    """The URL of a sweep's own run with its artifacts (report.png, report.md, summary) in the MLflow UI."""
    return run_url(ui_uri, experiment_id, run_id, "artifacts")


def source_tags(entry_point: str) -> dict[str, str]:
    """MLflow's source tags for runs started by `entry_point` (a path relative to the project), with the checked-out
    commit (none outside a git checkout, e.g. a Ray job's working dir)."""
    tags = {"mlflow.source.name": entry_point, "mlflow.source.type": "LOCAL"}
    root = Path(__file__).resolve().parents[2]
    try:
        done = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return tags
    if done.returncode == 0 and done.stdout.strip():
        tags["mlflow.source.git.commit"] = done.stdout.strip()
    return tags


def describe_experiment(uri: str, name: str, description: str, tags: Mapping[str, Any],
                        retry: RetryPolicy | None = None) -> str | None:
    """Create `name` when missing, set its description and tags; its id, or None when the server did not answer
    (the sweep goes on: trials spool their own operations)."""
    own_http_retries()
    client = mlflow_client(uri)

    def describe() -> str:
        experiment_id = ensure_experiment(client, name)
        for key, value in {**{k: str(v) for k, v in tags.items()}, DESCRIPTION_TAG: description}.items():
            client.set_experiment_tag(experiment_id, key, value)
        return experiment_id

    try:
        return call_with_retry(describe, is_transient, retry or RetryPolicy(budget_s=10.0), f"MLflow at {uri}")
    except (TrackingUnavailable, MlflowException) as err:  # the trials report tracking problems themselves
        logger.warning("The experiment %s gets no description: %s", name, err)
        return None


def describe_sweep(sweep: Any, config_file: str, trial_count: int, uri: str) -> str | None:
    """Describe the experiment of `sweep` (a `SweepConfig`) at `uri` in Markdown: what the sweep is, its config file
    and its grid; its id (None: the server did not answer)."""
    grid = {"tasks": sweep.tasks, "models": sweep.models, "methods": [m.key for m in sweep.methods],
            "seeds": sweep.seeds}
    extra = {"search": sweep.search, "select": sweep.select, "storage": f"{sweep.storage_root() / sweep.name}"}
    lines = [f"CaPT sweep **{sweep.name}**: {trial_count} trial(s), one MLflow run each (named "
             "task/model/method/seed).", "", f"- config file: `{config_file}`", f"- data: `{sweep.data_source}`"]
    lines += [f"- {axis}: {', '.join(str(v) for v in values)}" for axis, values in grid.items()]
    lines += [f"- {key}: `{value}`" for key, value in extra.items() if value]
    lines += ["", "Metrics: `train/*` and `validation/*` per validation step, `test/*` and `perf/*` once at the end; "
              "`system/*` sampled while a run trains. Per-run summaries (steps, best step, trainable parameters, "
              "capsule bytes) are run tags."]
    tags = {"sweep": sweep.name, "config_file": config_file, "trials": trial_count, "data_source": sweep.data_source,
            **{axis: ",".join(str(v) for v in values) for axis, values in grid.items()}}
    return describe_experiment(uri, sweep.experiment_name(), "\n".join(lines), tags)


def experiment_runs(experiment: str, tracking_uri: str | None = None) -> list[dict[str, Any]]:
    """Every trial's run of `experiment` as {run_id, run_name, status, tags, metrics}; TrackingError if unknown.
    The sweeps' own parent runs are left out: they hold no scores of their own.

    Metrics are under the project's names (``test_score``, ``best_validation_score``), as result.json has them.
    """
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or mlflow.get_tracking_uri()
    client = mlflow_client(uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        names = sorted(e.name for e in client.search_experiments())
        raise TrackingError(f"No experiment {experiment!r} at {uri}; experiments there: {', '.join(names) or 'none'}.")
    runs, token = [], None
    while True:
        page = client.search_runs([found.experiment_id], max_results=1000, page_token=token)
        runs += [{"run_id": r.info.run_id, "run_name": r.info.run_name, "status": r.info.status,
                  "tags": dict(r.data.tags), "metrics": project_metrics(r.data.metrics)}
                 for r in page if r.data.tags.get(RUN_KIND_TAG) != "sweep"]
        token = page.token
        if not token:
            return runs
