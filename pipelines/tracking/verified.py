"""Loading a registered capsule version only once what it would run is verified: `load_capsule_model`.

`mlflow.pyfunc.load_model` runs a version's model file, its ``MLmodel``'s loader and its ``code/`` archive
as the artifact store holds them: someone who can rewrite the store (not the tracking database) could make
it run anything, including code that skips the capsule's own digest check. Here the version's files are
downloaded first and compared with what registration recorded in the tracking database (the version's
``code_digest`` and ``code_files`` tags, `pipelines.tracking.bundle`; the capsule against its ``artifact_digest``
tags, as Serve and promote check it); only a version that matches is loaded.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import mlflow
from mlflow import MlflowClient

from capt.errors import ArtifactIntegrityError
from pipelines.provenance import verify_version
from pipelines.tracking.bundle import CODE_DIGEST_TAG, CODE_FILES_TAG, changed_files, code_digest, code_table
from pipelines.tracking.client import TrackingError, mlflow_client
from pipelines.tracking.registry import pyfunc_artifacts, recorded_digests

logger = logging.getLogger(__name__)

VERSION_URI = re.compile(r"models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/]+)|/(?P<version>\d+))/?")
"""The model URIs that name one registered version: ``models:/<name>/<version>`` and ``models:/<name>@<alias>``."""


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


def _recorded_table(tags: dict[str, str], digest: str) -> dict[str, str] | None:
    """The version's ``code_files`` tag, when it is present and agrees with its ``code_digest`` tag."""
    try:
        table = json.loads(tags.get(CODE_FILES_TAG) or "null")
    except json.JSONDecodeError:
        return None
    return table if isinstance(table, dict) and code_digest(table) == digest else None


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
        known = _recorded_table(tags, recorded)
        changed = "; ".join(changed_files(known, table)) if known is not None else "(the code_files tag is missing)"
        raise ArtifactIntegrityError(
            f"{label} is refused before anything of it runs: the code it carries (model file, MLmodel, code/, "
            f"environment files) has digest {found} in the artifact store, but its registration recorded "
            f"{recorded} (tag {CODE_DIGEST_TAG}); files that differ: {changed}. Someone or something rewrote "
            "them in the artifact store. Restore the version's files from a copy you trust, or register the "
            "capsule again; do not load it with plain mlflow.pyfunc.load_model, which would run the changed code.")
    return found


def _verify_capsule(model_dir: Path, uri: str, name: str, version: str) -> None:
    """The capsule of the downloaded version against the digests the tracking database records for it, and its
    task, base model and method against `name` (what Serve and promote check)."""
    artifacts = pyfunc_artifacts(model_dir / "MLmodel", name, int(version))
    if not all(isinstance(artifacts.get(key), dict) for key in ("capsule", "result")):
        raise TrackingError(f"Version {version} of {name!r} is not a CaPT capsule pyfunc: its MLmodel names no "
                            f"'capsule' and 'result' artifacts (it has {sorted(artifacts)}).")
    result = json.loads((model_dir / artifacts["result"]["path"]).read_text(encoding="utf-8"))
    verify_version(model_dir / artifacts["capsule"]["path"], result, name, int(version),
                   recorded_digests(uri, name, int(version)))


def download_verified_model(model_uri: str, dst: str | Path | None = None, tracking_uri: str | None = None) -> Path:
    """Download the registered version `model_uri` names and verify it (`verify_code`, then its capsule); the
    local model folder, which ``mlflow.pyfunc.load_model`` can load in a fresh process with the version's own
    code. `dst`: where to download (a new temporary folder by default, kept: a loaded model imports from it)."""
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    uri = tracking_uri or mlflow.get_tracking_uri()
    client = mlflow_client(uri)
    name, version = resolve_version(client, model_uri)
    target = Path(dst) if dst is not None else Path(tempfile.mkdtemp(prefix=f"{name}-v{version}-"))
    source = client.get_model_version_download_uri(name, version)
    local = Path(mlflow.artifacts.download_artifacts(artifact_uri=source, dst_path=str(target), tracking_uri=uri))
    digest = verify_code(local, name, version, dict(client.get_model_version(name, version).tags or {}))
    _verify_capsule(local, uri, name, version)
    logger.info("Version %s of %s verified (code digest %s) in %s", version, name, digest, local)
    return local


def load_capsule_model(model_uri: str, tracking_uri: str | None = None, dst: str | Path | None = None) -> Any:
    """`mlflow.pyfunc.load_model` of a registered capsule version, only after `download_verified_model` found its
    code and capsule as registered. In this process the project's already imported `capt` and `pipelines` serve
    the load; a fresh process loading the verified folder runs the version's own code archive."""
    return mlflow.pyfunc.load_model(str(download_verified_model(model_uri, dst, tracking_uri)))
