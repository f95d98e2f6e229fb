"""A job artifact is verified before use: its bytes (`capt.digest`), and what it claims against where it is.

`verify_job_artifact` is what every pipeline reader of a finished job's artifact calls first (the registry
pyfunc through `CapsulePredictor`, the Serve app's registry source, `promote`): the files must match their
manifest and the digest recorded for them (the registered version's tag, result.json), and the task, base
model and method that result.json, method.json and capsule.json / adapter.json record must agree with each
other and with the registered model the artifact is loaded or served under (``capt-<model-slug>-<task>``).
Needs no MLflow: readers pass in what the registry recorded.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from capt import digest
from capt.errors import ArtifactError, ArtifactIntegrityError
from pipelines.config.schema import model_slug


class ProvenanceError(ArtifactError):
    """What an artifact records (task, base model, method) does not match where it is loaded or served."""


def registered_model_name(slug: str, task: str) -> str:
    """The registry name of the capsules of one (base model, task): `capt-<model-slug>-<task>`."""
    return f"capt-{slug}-{task}"


def verify_job_artifact(artifact_dir: str | os.PathLike[str], result: Mapping[str, Any], label: str,
                        registered_name: str | None = None, expected_digest: str | None = None,
                        expected_from: str = "the registered version's artifact_digest tag") -> str | None:
    """Verify `artifact_dir` (a job's artifact) and its `result` before use; returns the artifact digest.

    `expected_digest`: the digest recorded outside the artifact store (the version's tag), checked besides the
    one result.json records. Raises `capt.ArtifactIntegrityError` or `ProvenanceError` (one paragraph each).
    """
    recorded = result.get("artifact_digest")
    if expected_digest and recorded and recorded != expected_digest:
        digest.verify(artifact_dir, label, expected_digest, expected_from=expected_from)  # names the side that moved
        raise ArtifactIntegrityError(
            f"{label} failed its integrity check: its result.json records artifact digest {recorded} but "
            f"{expected_from} is {expected_digest}. " + digest.REFUSAL)
    found = digest.verify(artifact_dir, label, expected_digest or recorded, result.get("artifact_files"),
                          expected_from if expected_digest else "result.json")
    check_provenance(artifact_dir, result, label, registered_name)
    return found


def check_provenance(artifact_dir: str | os.PathLike[str], result: Mapping[str, Any], label: str,
                     registered_name: str | None = None) -> None:
    """Refuse (`ProvenanceError`) an artifact whose recorded task, base model or method disagree with each other
    or with `registered_name`."""
    task, model, method = result.get("task"), result.get("model"), result.get("method")
    problems = []
    if registered_name is not None and model is not None and task is not None:
        slugs = {model_slug(model), result.get("model_slug") or model_slug(model)}  # the slug result.json names
        if registered_name not in {registered_model_name(slug, task) for slug in slugs}:
            problems.append(f"result.json records task {task!r} on base model {model!r}, which belongs under "
                            f"{registered_model_name(model_slug(model), task)!r}, not under {registered_name!r}")
    for name, keys in (("method.json", ("task", "method")), ("capsule.json", ("task",)),
                       ("adapter.json", ("method",))):
        try:  # no such file: nothing recorded (the structural checks name a bad one)
            recorded = json.loads((Path(artifact_dir) / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            recorded = {}
        recorded = recorded if isinstance(recorded, dict) else {}
        for key in keys:
            value, expected = recorded.get(key), {"task": task, "method": method}[key]
            if value is not None and expected is not None and value != expected:
                problems.append(f"{name} records {key} {value!r}, result.json {expected!r}")
    if problems:
        raise ProvenanceError(f"{label} is refused: what it records does not match where it is loaded "
                              f"({'; '.join(problems)}). A capsule is only loaded or served as the (base model, "
                              "task, method) it was trained for; register it under its own name, or retrain it.")


def verify_version(capsule_dir: str | os.PathLike[str], result: Mapping[str, Any], name: str, version: int,
                   recorded: Mapping[str, str]) -> str | None:
    """Verify a downloaded version: its files against every digest the tracking database records for it (the
    version's tag and its source run's, which must agree) and its result.json, and its task, base model and
    method against `name`; raises `capt.ArtifactIntegrityError` or `ProvenanceError`."""
    label = f"Version {version} of {name} ({capsule_dir})"
    if len(set(recorded.values())) > 1:
        listed = "; ".join(f"{where}: {value}" for where, value in recorded.items())
        raise ArtifactIntegrityError(f"{label} failed its integrity check: the digests recorded for it disagree "
                                     f"({listed}); one of them was edited. It is not used.")
    where, expected = next(iter(recorded.items()), ("", None))
    return verify_job_artifact(capsule_dir, result, label, name, expected, where or "result.json")
