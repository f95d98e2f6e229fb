"""Model Registry and run queries for promotion (`pipelines.tracking.promotion`) and `pipelines.report`."""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import mlflow
from mlflow.exceptions import MlflowException, RestException

from pipelines.tracking.client import TrackingError, mlflow_client
from pipelines.tracking.run_content import RUN_KIND_TAG, project_metrics

_MISSING_RUN = ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE")
"""Error codes of `get_run` for a run id the server does not know (or that is not a run id at all)."""


@dataclass
class VersionInfo:
    """One registry version with what promotion needs."""

    name: str
    version: int
    run_id: str | None
    tags: dict[str, str]
    aliases: list[str]
    stage: str
    metrics: dict[str, float]
    """The metrics of the run that produced it, under the project's names (``test_score``; see `run_content`)."""
    created_ms: int
    run_error: str | None = None
    """Why the source run's metrics are unknown (no source run, missing or deleted run); None when read."""


class Registry:
    """Model Registry operations for promotion (aliases, tags, legacy stages)."""

    def __init__(self, tracking_uri: str | None = None) -> None:
        self.uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or mlflow.get_tracking_uri()
        self.client = mlflow_client(self.uri)

    def model_names(self, prefix: str = "capt-") -> list[str]:
        """Registered model names starting with `prefix`."""
        models = self.client.search_registered_models(filter_string=f"name LIKE '{prefix}%'")
        return sorted(m.name for m in models)

    def versions(self, name: str) -> list[VersionInfo]:
        """Every version of `name`, oldest first; raises TrackingError when the model does not exist."""
        try:
            model = self.client.get_registered_model(name)
        except RestException as err:
            if err.error_code == "RESOURCE_DOES_NOT_EXIST":
                raise TrackingError(f"No registered model {name!r} at {self.uri}.") from err
            raise
        aliases: dict[str, list[str]] = {}
        for alias, version in (model.aliases or {}).items():  # search results do not carry aliases
            aliases.setdefault(str(version), []).append(alias)
        found = self.client.search_model_versions(f"name='{name}'")
        return sorted((self._info(v, aliases.get(str(v.version), [])) for v in found), key=lambda v: v.version)

    def _info(self, v: Any, aliases: list[str]) -> VersionInfo:
        metrics, run_error = self._run_metrics(v.run_id)
        return VersionInfo(v.name, int(v.version), v.run_id, dict(v.tags or {}), sorted(aliases),
                           v.current_stage or "None", metrics, int(v.creation_timestamp or 0), run_error)

    def _run_metrics(self, run_id: str | None) -> tuple[dict[str, float], str | None]:
        """The logged metrics of a version's source run, or why there are none (no run, missing, deleted).

        Any other failure (server down, access refused) raises TrackingError: a version must never lose a
        promotion because its run could not be read this time.
        """
        if not run_id:
            return {}, "it has no source run"
        try:
            run = self.client.get_run(run_id)
        except RestException as err:
            if err.error_code in _MISSING_RUN:
                return {}, f"its source run {run_id} does not exist at {self.uri}"
            raise TrackingError(f"Could not read run {run_id} at {self.uri}: {err.message}") from err
        except MlflowException as err:
            raise TrackingError(f"Could not read run {run_id} at {self.uri}: {err.message}") from err
        if run.info.lifecycle_stage == "deleted":
            return {}, f"its source run {run_id} was deleted"
        return project_metrics(run.data.metrics), None

    def set_alias(self, name: str, alias: str, version: int) -> None:
        """Point `alias` at `version` (moving it from any other version)."""
        self.client.set_registered_model_alias(name, alias, str(version))

    def delete_alias(self, name: str, alias: str) -> None:
        """Remove `alias` from the model (no-op when unset)."""
        with contextlib.suppress(RestException):
            self.client.delete_registered_model_alias(name, alias)

    def set_tags(self, name: str, version: int, tags: Mapping[str, Any]) -> None:
        """Set version tags (values stringified)."""
        for key, value in tags.items():
            self.client.set_model_version_tag(name, str(version), key, str(value))

    def delete_tag(self, name: str, version: int, key: str) -> None:
        """Remove the version tag `key` (no-op when unset)."""
        with contextlib.suppress(RestException):
            self.client.delete_model_version_tag(name, str(version), key)

    def transition_stage(self, name: str, version: int, stage: str, archive_existing: bool = False) -> None:
        """Legacy stage transition (deprecated in MLflow since 2.9; aliases replace it)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            self.client.transition_model_version_stage(name, str(version), stage,
                                                       archive_existing_versions=archive_existing)


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
