"""A job's output folder: which config its outputs belong to, and the one job that writes to it.

Every output of a job (checkpoints, artifact, result.json, the MLflow run record `mlflow_run.json` and
spool) belongs to one resolved config, identified by `config_hash`. A job claims its folder before it
reads or writes anything there: it takes an exclusive lock held for its whole life (a second job on the
same folder fails at once), refuses a folder that holds another config's outputs unless
`train.overwrite` is set, and records its hash and config in ``job_config.json``. Only the main
process of a distributed job (RANK 0) claims; the other ranks share its folder. A finished result.json is
sealed with its own digest and verified before it is reused (`seal_result`, `verify_result`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from capt import digest
from capt.atomic import write_atomically
from capt.errors import ArtifactIntegrityError, CaptError
from pipelines.config.schema import JobConfig, flatten, require_resolved
from pipelines.services.folder_lock import check_job_folder, held_folder

logger = logging.getLogger(__name__)

CLAIM_FILE = "job_config.json"
LOCK_FILE = "job.lock"
RESULT_FILE = "result.json"
_OUTPUTS = ("checkpoints", "artifact", RESULT_FILE, RESULT_FILE + ".tmp", "mlflow_*")
EXCLUDED_KEYS = ("output_dir", "train.resume", "train.overwrite", "train.log_every_steps",
                 "train.checkpoint_every_steps")
_HELD: set[Path] = set()  # folders this process has claimed (a nested claim of the same folder is a no-op)


class JobFolderError(CaptError, RuntimeError):
    """The job's output folder cannot be used as asked; the message says why and the ways out."""


def hashed_config(config: JobConfig | Mapping[str, Any]) -> dict[str, Any]:
    """The config as the hash sees it: plain JSON values, every key that can change the result.

    A result is keyed by its resolved config (a `JobConfig` must be the `ResolvedJobConfig` that
    `pipelines.config.load` returns), so a job that leaves `optim.lr` empty and one that gives the default value
    explicitly share one hash and one folder, and a change of the defaults table changes the hash of exactly the
    jobs it changes.

    Excluded (`EXCLUDED_KEYS`): where the outputs go (`output_dir`), how the job treats existing
    outputs (`train.resume`, `train.overwrite`), and settings that change only logging or how often
    resumable state is saved (`train.log_every_steps`, `train.checkpoint_every_steps`; a resumed job
    ends bit-identical to an uninterrupted one). `task.data_dir` counts as the job reads it: for local
    data without one, CAPT_DATA_DIR.
    """
    data = require_resolved(config, "config_hash").to_dict() if isinstance(config, JobConfig) else dict(config)
    plain = json.loads(json.dumps(data, default=str))
    for key in EXCLUDED_KEYS:
        section, _, leaf = key.rpartition(".")
        holder = plain.get(section, {}) if section else plain
        if isinstance(holder, dict):
            holder.pop(leaf, None)
    task = plain.get("task")
    if isinstance(task, dict) and task.get("source", "local") == "local" and not task.get("data_dir"):
        task["data_dir"] = os.environ.get("CAPT_DATA_DIR") or None
    return plain


def config_hash(config: JobConfig | Mapping[str, Any]) -> str:
    """SHA-256 of the canonical JSON of `hashed_config(config)`."""
    text = json.dumps(hashed_config(config), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def finished_result(config: JobConfig) -> dict[str, Any] | None:
    """The stored result.json of this exact config with its artifact, verified; None when missing, partial or of
    another config.

    A result that fails verification (`verify_result`: edited, or its artifact changed)
    is never reused: `CachedResultError` with the way out, or, with `train.overwrite`, its outputs are deleted
    (logged) and None returned, so the job trains afresh.
    """
    output_dir = config.resolved_output_dir()
    try:
        result = json.loads((output_dir / RESULT_FILE).read_text())
    except (OSError, ValueError):
        return None
    artifact = Path(result.get("artifact_dir", output_dir / "artifact"))
    recorded = result["config_hash"] if "config_hash" in result else (
        config_hash(result["config"]) if isinstance(result.get("config"), dict) else None)
    if recorded != config_hash(config) or not artifact.is_dir() or not any(artifact.iterdir()):
        return None
    try:
        verify_result(result, output_dir / RESULT_FILE)
    except CachedResultError as err:
        if not config.train.overwrite:
            raise
        logger.warning("%s Training afresh because train.overwrite=true.", err)
        _remove_outputs(output_dir, _outputs(output_dir))
        return None
    return result


def is_main_process() -> bool:
    """Whether this is the main process of its job (torchrun, Accelerate and Ray Train all set RANK)."""
    return os.environ.get("RANK", "0") == "0"


@contextlib.contextmanager
def claim_job_folder(config: JobConfig, wait_s: float = 0.0) -> Iterator[None]:
    """Hold the job folder for the duration (main process only): lock it, check it, record the config.

    `wait_s`: how long to wait for another holder to let go (a restarted Ray worker group may start
    while the previous attempt's process is still exiting); 0 fails at once.
    """
    folder = config.resolved_output_dir().resolve()
    if not is_main_process() or folder in _HELD:
        yield
        return
    check_job_folder("output_dir", config.resolved_output_dir())
    # an exclusive lock on folder/job.lock; the kernel releases it when the holding process dies
    with held_folder(folder / LOCK_FILE, wait_s, refusal=lambda who: JobFolderError(
            f"output_dir={folder} is in use by another job ({who}); one job writes to a folder at a time. "
            "Wait for that job to end or stop it, or give this job another output_dir.")):
        _HELD.add(folder)
        try:
            _make_room(folder, config)
            write_atomically(folder / CLAIM_FILE,
                              json.dumps({"config_hash": config_hash(config), "config": hashed_config(config)},
                                         indent=2))
            yield
        finally:
            _HELD.discard(folder)


def _make_room(folder: Path, config: JobConfig) -> None:
    """Refuse a folder holding another config's outputs (unless train.overwrite); clear this config's
    old outputs when the job starts afresh (no train.resume)."""
    present = _outputs(folder)
    if not present:
        return
    recorded = _recorded_config(folder)
    same = recorded is not None and config_hash(recorded) == config_hash(config)
    if same and config.train.resume:
        return
    if not same and not config.train.overwrite:
        names = ", ".join(p.name for p in present)
        what = (f"outputs ({names}) whose config is not recorded" if recorded is None else
                f"the outputs ({names}) of another config, which differs in {config_diff(recorded, config)}")
        raise JobFolderError(
            f"output_dir={folder} holds {what}; outputs are never reused or replaced for another config. Give this "
            "job a new output_dir, or set train.overwrite=true to delete that folder's outputs and train afresh.")
    _remove_outputs(folder, present)


def _remove_outputs(folder: Path, present: list[Path]) -> None:
    logger.info("Removing the old outputs of %s (%s) before training afresh", folder,
                ", ".join(p.name for p in present))
    remove_paths(present)


def remove_paths(paths: list[Path]) -> None:
    for path in paths:
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def _outputs(folder: Path) -> list[Path]:
    return sorted({p for pattern in _OUTPUTS for p in folder.glob(pattern)})


def _recorded_config(folder: Path) -> dict[str, Any] | None:
    """The config the folder's outputs belong to: its claim record, else its result.json (older jobs)."""
    for name in (CLAIM_FILE, RESULT_FILE):
        with contextlib.suppress(OSError, ValueError):
            config = json.loads((folder / name).read_text()).get("config")
            if isinstance(config, dict):
                return hashed_config(config)
    return None


def config_diff(old: Mapping[str, Any], new: JobConfig | Mapping[str, Any], limit: int = 8) -> str:
    """`key: old -> new` for every hashed key that differs (the first `limit`, then a count)."""
    before, after = flatten(hashed_config(old)), flatten(hashed_config(new))
    missing = "<unset>"
    changes = [f"{key}: {before.get(key, missing)!r} -> {after.get(key, missing)!r}"
               for key in sorted(set(before) | set(after)) if before.get(key, missing) != after.get(key, missing)]
    shown = "; ".join(changes[:limit])
    return shown + (f"; and {len(changes) - limit} more" if len(changes) > limit else "")


# A finished result, verified before reuse (README: "Artifact integrity and provenance"). The digest lives inside
# result.json rather than in a sidecar so that the one file that travels (to MLflow, into a registered version, into a
# report) carries its own check, and a sidecar cannot be lost or left stale beside it. Someone who rewrites result.json
# and recomputes its digest is caught, when tracking is on, by comparing its scores with its MLflow run's metrics.

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
