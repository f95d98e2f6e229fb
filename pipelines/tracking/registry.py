"""The Model Registry as the project reads and writes it: registered capsule versions and what promotion needs of
them (`Registry`, `VersionInfo`: aliases, tags, legacy stages, the source run's metrics), which version an alias
names, and a version's files downloaded and verified: its capsule for Serve and promote (`download_verified_version`),
the whole logged model before it is loaded (`load_capsule_model`).

For Serve and promote a version's files are read as plain files: the pyfunc's ``capsule`` artifact (safetensors +
JSON) and its ``result.json``. Nothing is unpickled and no pyfunc is loaded (that would build a base model per
task).

`load_capsule_model` does load one, once what it would run is verified: `mlflow.pyfunc.load_model` runs a version's
model file, its ``MLmodel``'s loader and its ``code/`` archive as the artifact store holds them: someone who can
rewrite the store (not the tracking database) could make it run anything, including code that skips the capsule's
own digest check. Here the version's files are downloaded first and compared with what registration recorded in the
tracking database (the version's ``code_digest`` and ``code_files`` tags, `pipelines.tracking.bundle`; the capsule
against its ``artifact_digest`` tags, as Serve and promote check it); only a version that matches is loaded.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import mlflow
import requests
import yaml
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException, RestException

from capt.errors import ArtifactIntegrityError
from pipelines.provenance import verify_version
from pipelines.tracking.bundle import CODE_DIGEST_TAG, CODE_FILES_TAG, changed_files, code_digest, code_table
from pipelines.tracking.client import TrackingError, mlflow_client
from pipelines.tracking.run_content import project_metrics

logger = logging.getLogger(__name__)
_MISSING_RUN = ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE")
"""Error codes of `get_run` for a run id the server does not know (or that is not a run id at all)."""
OUTSIDE_STORE_TEXT = "resolved path is outside the artifact directory"
"""MLflow's words (server and local store alike) for a file of the store that resolves outside it: a symbolic link."""
VERSION_URI = re.compile(r"models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/]+)|/(?P<version>\d+))/?")
"""The model URIs that name one registered version: ``models:/<name>/<version>`` and ``models:/<name>@<alias>``."""


def registered_model(client: MlflowClient, uri: str, name: str) -> Any:
    """The registered model `name` at `uri`; TrackingError when it does not exist."""
    try:
        return client.get_registered_model(name)
    except RestException as err:
        if err.error_code == "RESOURCE_DOES_NOT_EXIST":
            raise TrackingError(f"No registered model {name!r} at {uri}.") from err
        raise


def registered_names(uri: str, prefix: str = "capt-") -> list[str]:
    models = mlflow_client(uri).search_registered_models(filter_string=f"name LIKE '{prefix}%'")
    return sorted(m.name for m in models)


def alias_version(uri: str, name: str, alias: str) -> int | None:
    """The version `alias` points at in registered model `name`; None when the model has no such alias.

    TrackingError when the model does not exist.
    """
    version = (registered_model(mlflow_client(uri), uri, name).aliases or {}).get(alias)
    return None if version is None else int(version)


def version_tags(uri: str, name: str, version: int) -> dict[str, str]:
    """The tags of one version (``base_model`` says which base model its capsule was trained on)."""
    return dict(mlflow_client(uri).get_model_version(name, str(version)).tags or {})


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
    """Model Registry reads and the tag writes of promotion (its `client` moves aliases and legacy stages)."""

    def __init__(self, tracking_uri: str | None = None) -> None:
        self.uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or mlflow.get_tracking_uri()
        self.client = mlflow_client(self.uri)

    def versions(self, name: str) -> list[VersionInfo]:
        """Every version of `name`, oldest first; raises TrackingError when the model does not exist."""
        model = registered_model(self.client, self.uri, name)
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
        except MlflowException as err:
            if isinstance(err, RestException) and err.error_code in _MISSING_RUN:
                return {}, f"its source run {run_id} does not exist at {self.uri}"
            raise TrackingError(f"Could not read run {run_id} at {self.uri}: {err.message}") from err
        if run.info.lifecycle_stage == "deleted":
            return {}, f"its source run {run_id} was deleted"
        return project_metrics(run.data.metrics), None

    def delete_alias(self, name: str, alias: str) -> None:
        """Remove `alias` from the model (no-op when unset)."""
        with contextlib.suppress(RestException):
            self.client.delete_registered_model_alias(name, alias)

    def set_tags(self, name: str, version: int, tags: Mapping[str, Any]) -> None:
        for key, value in tags.items():
            self.client.set_model_version_tag(name, str(version), key, str(value))

    def delete_tag(self, name: str, version: int, key: str) -> None:
        """Remove the version tag `key` (no-op when unset)."""
        with contextlib.suppress(RestException):
            self.client.delete_model_version_tag(name, str(version), key)


@dataclass(frozen=True)
class CapsuleVersion:
    """One registry version downloaded for serving."""

    name: str
    """Registered model name, ``capt-<model-slug>-<task>``."""
    version: int
    """The version the alias named when it was read."""
    capsule_dir: Path
    """The capsule artifact folder (capsule.safetensors, capsule.json, method.json)."""
    result: dict[str, Any]
    """The job's result.json: base model, method, evaluation settings."""
    digest: str
    """SHA-256 of the artifact's digest manifest, which `download_verified_version` verified the files against."""


def download_verified_version(uri: str, name: str, version: int, root: str | os.PathLike[str]) -> CapsuleVersion:
    """The capsule and result.json of version `version` of `name` (not its code copy) downloaded below `root`, then
    verified by `pipelines.provenance.verify_version` against the digests the tracking database records
    (`recorded_digests`): what the Serve source and promote read before they use a version."""
    target, source = Path(tempfile.mkdtemp(prefix=f"{name}-v{version}-", dir=root)), ""
    try:
        try:  # the version's own location: a models:/ URI would be resolved against the default registry
            source = mlflow_client(uri).get_model_version_download_uri(name, str(version)).rstrip("/")
            mlmodel = download_to(uri, f"{source}/MLmodel", target)
            artifacts = capsule_artifacts(mlmodel, name, version)
            capsule_dir, result_path = (download_to(uri, f"{source}/{artifacts[key]['path']}", target / key)
                                        for key in ("capsule", "result"))
            result = json.loads(result_path.read_text(encoding="utf-8"))
        except (MlflowException, requests.HTTPError) as err:
            raise _download_error(err, uri, name, version, source) from err
        digest = verify_version(capsule_dir, result, name, version, recorded_digests(uri, name, version))
    except BaseException:  # a refused copy is not kept: a later poll downloads the version afresh
        shutil.rmtree(target, ignore_errors=True)
        raise
    return CapsuleVersion(name, version, capsule_dir, result, digest)


def _download_error(err: MlflowException | requests.HTTPError, uri: str, name: str, version: int,
                    source: str) -> Exception:
    """What a failed download of a version's files (below `source`) raises: a symbolic link in the store refused by
    name (`ArtifactIntegrityError`), any other failure as a `TrackingError`."""
    message = err.message if isinstance(err, MlflowException) else f"{err} {getattr(err.response, 'text', '')}"
    if (link := _linked_file(message, source)) is None:
        return TrackingError(f"Cannot download version {version} of {name!r} from {uri}: {message}")
    return ArtifactIntegrityError(
        f"Version {version} of {name} is refused: its {link} in the artifact store of {uri} is a symbolic link "
        "that leads outside the store (MLflow answers 400, \"Invalid path: resolved path is outside the "
        "artifact directory\"; where it points is known only on the server). A registered version holds plain "
        "files only. On the server, replace the link with the version's own file (its SHA-256 is in the "
        "version's digest.json and result.json), or register the version again.")


def _linked_file(message: str, source: str) -> str | None:
    """The file or folder (below the version's `source`) a download failure names when the store refused it as
    leading outside itself; None for any other failure."""
    if OUTSIDE_STORE_TEXT not in message:
        return None
    if named := re.search(r"##### File (.+?) #####", message):  # a file's download
        return named.group(1)
    if listed := re.search(r"[?&]path=([^&\s]+)", message):  # a folder's listing
        path, root = unquote(listed.group(1)).rstrip("."), source.split(":", 1)[-1].strip("/")
        return path.removeprefix(root).strip("/") or path
    return "(a file MLflow did not name)"


def download_to(uri: str, artifact_uri: str, target: Path) -> Path:
    """`artifact_uri` (a file or a folder) downloaded into `target`, without MLflow's progress bar."""
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    target.mkdir(parents=True, exist_ok=True)
    return Path(mlflow.artifacts.download_artifacts(artifact_uri=artifact_uri, dst_path=str(target), tracking_uri=uri))


def capsule_artifacts(mlmodel: Path, name: str, version: int) -> dict[str, Any]:
    """The ``python_function`` flavor's artifacts table of an MLmodel file (YAML, never unpickled); TrackingError
    when it is not a CaPT capsule pyfunc's (no ``capsule`` and ``result`` artifacts)."""
    if not mlmodel.is_file():
        raise TrackingError(f"Version {version} of {name!r} has no MLmodel file: it is not a logged model.")
    flavor = (yaml.safe_load(mlmodel.read_text(encoding="utf-8")) or {}).get("flavors", {}).get("python_function", {})
    artifacts = flavor.get("artifacts") or {}
    if not all(isinstance(artifacts.get(key), dict) for key in ("capsule", "result")):
        raise TrackingError(f"Version {version} of {name!r} is not a CaPT capsule pyfunc: its MLmodel names no "
                            f"'capsule' and 'result' artifacts (it has {sorted(artifacts)}).")
    return artifacts


def recorded_digests(uri: str, name: str, version: int) -> dict[str, str]:
    """The artifact digests the tracking database records for a version: {where: digest}.

    Its ``artifact_digest`` tag and its source run's; empty for a version registered before digests. Both
    are read, so a version whose tag was edited (or whose run's was) disagrees with the other and is refused.
    """
    client = mlflow_client(uri)
    found = client.get_model_version(name, str(version))
    digests = {}
    if (tag := (found.tags or {}).get("artifact_digest")):
        digests[f"the artifact_digest tag of version {version} of {name}"] = tag
    if found.run_id:
        try:
            run_tag = client.get_run(found.run_id).data.tags.get("artifact_digest")
        except MlflowException:
            run_tag = None  # a deleted source run: the version's tag still stands
        if run_tag:
            digests[f"the artifact_digest tag of its source run {found.run_id}"] = run_tag
    return digests


def resolve_version(client: MlflowClient, model_uri: str) -> tuple[str, str]:
    """(registered model name, version) that `model_uri` names; TrackingError for a URI naming no version (a
    logged model id or a path carries no registration to compare with)."""
    match = VERSION_URI.fullmatch(model_uri)
    if match is None:
        raise TrackingError(f"{model_uri!r} names no registered version: the verified loader takes "
                            "models:/<name>/<version> or models:/<name>@<alias>, whose registration records "
                            "what the version may run.")
    name, alias, version = match.group("name", "alias", "version")
    return name, str(client.get_model_version_by_alias(name, alias).version if alias else version)


def verify_code(model_dir: Path, name: str, version: str, tags: dict[str, str]) -> str:
    """The code digest of the downloaded version in `model_dir`, once it equals its ``code_digest`` tag;
    `ArtifactIntegrityError` naming the version, the digests and the changed files otherwise."""
    label = f"Version {version} of {name}"
    recorded = tags.get(CODE_DIGEST_TAG)
    if not recorded:
        raise ArtifactIntegrityError(
            f"{label} cannot be verified: its registration records no {CODE_DIGEST_TAG} tag (it was registered "
            "before the code it carries was hashed, or the tag was removed), so nothing says which model file, "
            "MLmodel and code/ archive it may run. It is not loaded. Register the capsule again (a new version "
            "records the tag); loading it with plain mlflow.pyfunc.load_model would run its files unverified.")
    table = code_table(model_dir)
    found = code_digest(table)
    if found != recorded:
        try:  # the code_files tag names the changed files when it agrees with the code_digest tag
            known = json.loads(tags.get(CODE_FILES_TAG) or "null")
        except json.JSONDecodeError:
            known = None
        changed = ("; ".join(changed_files(known, table)) if isinstance(known, dict) and code_digest(known) == recorded
                   else "(the code_files tag is missing)")
        raise ArtifactIntegrityError(
            f"{label} is refused before anything of it runs: the code it carries (model file, MLmodel, code/, "
            f"environment files) has digest {found} in the artifact store, but its registration recorded "
            f"{recorded} (tag {CODE_DIGEST_TAG}); files that differ: {changed}. Someone or something rewrote "
            "them in the artifact store. Restore the version's files from a copy you trust, or register the "
            "capsule again; do not load it with plain mlflow.pyfunc.load_model, which would run the changed code.")
    return found


def download_verified_model(model_uri: str, dst: str | Path | None = None, tracking_uri: str | None = None) -> Path:
    """Download the registered version `model_uri` names and verify it (`verify_code`, then its capsule against the
    digests the tracking database records for it, and its task, base model and method against its name, as Serve
    and promote check it); the local model folder, which ``mlflow.pyfunc.load_model`` can load in a fresh process
    with the version's own code. `dst`: where to download (a new temporary folder by default, kept: a loaded model
    imports from it)."""
    uri = tracking_uri or mlflow.get_tracking_uri()
    client = mlflow_client(uri)
    name, version = resolve_version(client, model_uri)
    target = Path(dst) if dst is not None else Path(tempfile.mkdtemp(prefix=f"{name}-v{version}-"))
    source = client.get_model_version_download_uri(name, version).rstrip("/")
    try:
        local = download_to(uri, source, target)
    except (MlflowException, requests.HTTPError) as err:
        raise _download_error(err, uri, name, int(version), source) from err
    digest = verify_code(local, name, version, dict(client.get_model_version(name, version).tags or {}))
    artifacts = capsule_artifacts(local / "MLmodel", name, int(version))
    result = json.loads((local / artifacts["result"]["path"]).read_text(encoding="utf-8"))
    verify_version(local / artifacts["capsule"]["path"], result, name, int(version),
                   recorded_digests(uri, name, int(version)))
    logger.info("Version %s of %s verified (code digest %s) in %s", version, name, digest, local)
    return local


def load_capsule_model(model_uri: str, tracking_uri: str | None = None, dst: str | Path | None = None) -> Any:
    """`mlflow.pyfunc.load_model` of a registered capsule version, only after `download_verified_model` found its
    code and capsule as registered. In this process the project's already imported `capt` and `pipelines` serve
    the load; a fresh process loading the verified folder runs the version's own code archive."""
    return mlflow.pyfunc.load_model(str(download_verified_model(model_uri, dst, tracking_uri)))
