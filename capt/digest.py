"""The digest manifest of a method artifact: a SHA-256 of the exact bytes of each of its files.

A capsule or adapter artifact is a folder of safetensors and JSON files. When it is written, `seal` records
the SHA-256 of every such file in ``digest.json`` beside them, plus one *artifact digest*: the SHA-256 of the
canonical JSON of that {file name: file digest} table. The artifact digest is what the pipeline records
elsewhere (result.json, the MLflow run, the registered version), so one short string names the whole content.

`verify` is called by every reader before it uses an artifact. A file whose bytes differ from the manifest, a
listed file that is missing, an unlisted safetensors or JSON file (a reader could read it), a manifest that
does not add up, or an artifact digest other than the one recorded elsewhere is refused with one paragraph
naming the artifact, the file, the expected and the found digest. A symbolic link anywhere in the folder is refused
by name before any file is read (`link_problem`): it would hand readers, and the upload to MLflow, the bytes of
whatever it leads to, inside or outside the artifact. No option skips either check. An artifact written
before manifests existed is loaded with a one-line warning that it cannot be verified, unless a digest was
recorded for it elsewhere (then its missing manifest is itself a mismatch).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from capt.atomic import write_atomically
from capt.errors import ArtifactIntegrityError

logger = logging.getLogger(__name__)

MANIFEST_NAME = "digest.json"
FORMAT = "capt-artifact-digest"
FORMAT_VERSION = 1
ALGORITHM = "sha256"
SEALED_SUFFIXES = (".safetensors", ".json")
"""The files of an artifact that readers read: every one of them is in the manifest."""
_CHUNK = 1 << 20
_SHOWN_TARGET_CHARS = 200
_MAX_MANIFEST_BYTES = 1 << 20
REFUSAL = ("It is not loaded: the files were changed after they were written (edited, re-saved, damaged or "
            "replaced), and no option loads an artifact whose digest does not match. Restore the original files, "
            "or train (and register) it again.")


LINK_REFUSAL = ("An artifact holds plain files only: through a link, every reader and the upload to MLflow would take "
                "the bytes of whatever file it leads to. Replace each link with a copy of the artifact's own file (its "
                "SHA-256 is in the artifact's digest.json), or train it again.")


def symbolic_links(directory: str | os.PathLike[str]) -> list[tuple[str, str]]:
    """(path relative to `directory`, where it points) of every symbolic link below `directory`, links to folders
    included; links are reported, never followed."""
    found = []
    for here, folders, files in os.walk(directory):
        for name in sorted(folders + files):
            path = os.path.join(here, name)
            if os.path.islink(path):
                found.append((os.path.relpath(path, directory), os.readlink(path)))
    return sorted(found)


def link_problem(directory: str | os.PathLike[str], label: str) -> str | None:
    """Why `directory` is not an artifact of plain files (every symbolic link in it, by name and target), or None."""
    links = symbolic_links(directory) if Path(directory).is_dir() else []
    if not links:
        return None
    shown = "; ".join(f"{name} -> {_shown_target(target)}" for name, target in links)
    what = "a symbolic link" if len(links) == 1 else f"{len(links)} symbolic links"
    return f"{label} holds {what} where a file belongs: {shown}. " + LINK_REFUSAL


def _shown_target(target: str) -> str:
    """A link's target as a message shows it: quoted (control characters escaped) and cut to a readable length."""
    if len(target) <= _SHOWN_TARGET_CHARS:
        return repr(target)
    return repr(target[:_SHOWN_TARGET_CHARS]) + f"... ({len(target)} characters)"


def file_sha256(path: str | os.PathLike[str]) -> str:
    """SHA-256 (hex) of the bytes of `path`, read in chunks (an adapter of a full fine-tune is gigabytes)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def artifact_digest(files: Mapping[str, str]) -> str:
    """The artifact digest of a {file name: SHA-256} table: SHA-256 of its canonical (sorted, compact) JSON."""
    text = json.dumps(dict(sorted(files.items())), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def sealed_files(directory: str | os.PathLike[str]) -> list[str]:
    """Names of the files of `directory` that a manifest covers: every safetensors and JSON file but itself."""
    return sorted(p.name for p in Path(directory).iterdir()
                  if p.is_file() and p.suffix in SEALED_SUFFIXES and p.name != MANIFEST_NAME)


def seal(directory: str | os.PathLike[str], names: Iterable[str] | None = None) -> str:
    """Write `directory`'s manifest over `names` (default: `sealed_files`); returns the artifact digest.

    Refuses (`ArtifactIntegrityError`) a folder holding a symbolic link: a manifest over a link's target would vouch
    for bytes that live elsewhere."""
    folder = Path(directory)
    if problem := link_problem(folder, f"The artifact at {folder}"):
        raise ArtifactIntegrityError(problem)
    files = {name: file_sha256(folder / name) for name in sorted(names if names is not None else sealed_files(folder))}
    digest = artifact_digest(files)
    manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, "algorithm": ALGORITHM, "files": files,
                "digest": digest}
    write_atomically(folder / MANIFEST_NAME, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    logger.debug("Sealed %s: %s", folder, digest)
    return digest


def verify(directory: str | os.PathLike[str], label: str | None = None, expected: str | None = None,
           expected_files: Mapping[str, str] | None = None, expected_from: str = "the digest recorded for it",
           error: type[ArtifactIntegrityError] = ArtifactIntegrityError) -> str | None:
    """Check every file of the artifact in `directory` against its manifest, and against what was recorded.

    `label` names the artifact in messages (default: ``The artifact at <directory>``); `expected` is the
    artifact digest recorded elsewhere and `expected_files` its {file: SHA-256} table (to name the file that
    changed), `expected_from` says where they were recorded. Returns the verified artifact digest, or None for
    an artifact without a manifest and with nothing recorded (logged as unverifiable). Raises `error` (an
    `ArtifactIntegrityError`) on any mismatch, and on any symbolic link in the folder (`link_problem`).
    """
    folder = Path(directory)
    label = label or f"The artifact at {folder}"
    if problem := link_problem(folder, label):
        raise error(problem)
    path = folder / MANIFEST_NAME
    if not path.is_file():
        if expected or expected_files:
            recorded = expected or artifact_digest(expected_files or {})
            raise error(f"{label} failed its integrity check: its {MANIFEST_NAME} is missing, but {expected_from} "
                        f"records artifact digest {recorded} for it. " + REFUSAL)
        logger.warning("%s has no %s (written before artifacts carried digests): it cannot be verified.",
                       label, MANIFEST_NAME)
        return None
    manifest = _read_manifest(path, label, error)
    if expected_files:
        _compare_files(folder, label, expected_files, expected_from, error)
    _compare_files(folder, label, manifest["files"], f"its {MANIFEST_NAME}", error)
    if artifact_digest(manifest["files"]) != manifest["digest"]:
        _refuse(error, label, MANIFEST_NAME, manifest["digest"], artifact_digest(manifest["files"]),
                "the artifact digest its manifest records")
    if expected and expected != manifest["digest"]:
        _refuse(error, label, "(the artifact as a whole)", expected, manifest["digest"], expected_from)
    return manifest["digest"]


def _compare_files(folder: Path, label: str, files: Mapping[str, str], source: str,
                   error: type[ArtifactIntegrityError]) -> None:
    """Refuse the first listed file whose bytes differ or that is missing, then the first unlisted one."""
    for name, recorded in sorted(files.items()):
        target = folder / name
        found = file_sha256(target) if target.is_file() else "no file (it is missing)"
        if found != recorded:
            _refuse(error, label, name, recorded, found, source)
    for name in sorted(set(sealed_files(folder)) - set(files)):
        _refuse(error, label, name, "no such file (it is not listed)", file_sha256(folder / name), source)


def _read_manifest(path: Path, label: str, error: type[ArtifactIntegrityError] = ArtifactIntegrityError) -> dict:
    """The parsed manifest, its shape checked; a damaged manifest is an integrity failure like a damaged file."""
    problem = None
    try:
        if path.stat().st_size > _MAX_MANIFEST_BYTES:
            problem = f"larger than {_MAX_MANIFEST_BYTES} bytes"
        else:
            data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        problem = f"not readable JSON ({err})"
    if problem is None:
        files = data.get("files") if isinstance(data, dict) else None
        if not (isinstance(files, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in files.items())
                and isinstance(data.get("digest"), str) and data.get("algorithm") == ALGORITHM
                and all("/" not in k and k not in ("", ".", "..") for k in files)):
            problem = (f"not a {FORMAT} manifest (expected keys format, format_version, algorithm={ALGORITHM!r}, "
                       "files: {file name: sha256}, digest)")
    if problem is not None:
        raise error(f"{label} failed its integrity check: its {MANIFEST_NAME} is {problem}. "
                                     + REFUSAL)
    return data


def _refuse(error: type[ArtifactIntegrityError], label: str, name: str, expected: str, found: str,
            expected_from: str) -> None:
    raise error(
        f"{label} failed its integrity check: file {name} was expected to have SHA-256 {expected} "
        f"({expected_from}) but has {found}. " + REFUSAL)
