"""A finished job's result.json is verified before it is reused, never believed.

At the end of a job, `seal_result` records in result.json the digest of its artifact (`capt.digest`: the
artifact digest and the SHA-256 of each file) and, last, ``result_digest``: the SHA-256 of the canonical
JSON of every other field of result.json. The digest lives inside result.json rather than in a sidecar so
that the one file that travels (to MLflow, into a registered version, into a report) carries its own check,
and a sidecar cannot be lost or left stale beside it.

`verify_result` checks both before a job or sweep reuses a finished result: a result.json edited by hand (a
score changed) or whose artifact changed is refused with the way out. That stops careless and accidental
edits; someone who rewrites result.json and recomputes its digest is caught, when tracking is on, by the
comparison of its scores with the metrics of its MLflow run (`pipelines.tracking.TrialTracker`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from capt import digest
from capt.errors import ArtifactIntegrityError, CaptError

RESULT_DIGEST_KEY = "result_digest"
ARTIFACT_DIGEST_KEY = "artifact_digest"
ARTIFACT_FILES_KEY = "artifact_files"
WAY_OUT = ("Set train.overwrite=true to delete this job's outputs and train it again, or delete its output folder "
           "and run it again (a sweep retrains the trial).")


class CachedResultError(CaptError, RuntimeError):
    """A finished result.json (or its artifact) does not match its recorded digests; it is not reused."""


def result_digest(result: Mapping[str, Any]) -> str:
    """SHA-256 of the canonical JSON (sorted keys, compact) of `result` without its ``result_digest`` field."""
    plain = json.loads(json.dumps({k: v for k, v in result.items() if k != RESULT_DIGEST_KEY}, default=str))
    return hashlib.sha256(json.dumps(plain, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def seal_result(result: dict[str, Any], artifact_dir: str | Path) -> dict[str, Any]:
    """`result` with its artifact's digests (read from the artifact's manifest) and its own digest recorded."""
    manifest = json.loads((Path(artifact_dir) / digest.MANIFEST_NAME).read_text(encoding="utf-8"))
    result[ARTIFACT_DIGEST_KEY] = manifest["digest"]
    result[ARTIFACT_FILES_KEY] = manifest["files"]
    result[RESULT_DIGEST_KEY] = result_digest(result)
    return result


def verify_result(result: Mapping[str, Any], result_path: Path) -> None:
    """Refuse (`CachedResultError`) a result.json that does not match its own digest, or whose artifact does not
    match the digests it records; the message names the file, the expected and the found digest, and the way out."""
    recorded = result.get(RESULT_DIGEST_KEY)
    found = result_digest(result)
    if recorded != found:
        what = "records no result_digest" if recorded is None else f"records result_digest {recorded}"
        raise CachedResultError(
            f"The finished result {result_path} is not reused: it {what}, but its content has SHA-256 {found} "
            f"(it was edited after the job wrote it, or written before results carried digests). {WAY_OUT}")
    artifact_dir = Path(result.get("artifact_dir") or result_path.parent / "artifact")
    try:
        digest.verify(artifact_dir, f"The artifact of the finished result {result_path} ({artifact_dir})",
                      result.get(ARTIFACT_DIGEST_KEY), result.get(ARTIFACT_FILES_KEY), f"{result_path.name}")
    except ArtifactIntegrityError as err:
        raise CachedResultError(f"{err} The finished result is not reused. {WAY_OUT}") from err
