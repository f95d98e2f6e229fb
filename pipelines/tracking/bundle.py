"""The project code a registered capsule version carries, and the digest that vouches for what of it runs.

A version's logged model holds the `capt` and `pipelines` packages as ONE archive, ``code/project_code.zip``:
MLflow uploads a model file by file, and the packages' two hundred source files cost seconds per registration
where one archive costs one upload. The model file (`capsule_model.py`) puts the archive first on ``sys.path``
(zipimport), so a load in a fresh process runs the code that wrote the capsule (a capsule and the code that reads it
change together), whatever checkout the caller stands in and even where the project (``capt==X``, a requirement of
the version) is not installed. A process that already imported `capt`/`pipelines` keeps its own modules.

Everything of the logged model outside its ``artifacts/`` folder decides what runs on `mlflow.pyfunc.load_model`:
``MLmodel`` (which loader module, which model file, which code folder), the model file, ``code/``, and the
environment files an ``env_manager`` installs from. `code_table` hashes each of those files and `code_digest`
hashes the table; registration records both on the version (tags `CODE_DIGEST_TAG`, `CODE_FILES_TAG`), in the
tracking database, where someone who can rewrite only the artifact store cannot follow. ``artifacts/`` (the
capsule and its result.json) is data, checked against its own digests by every reader.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from collections.abc import Mapping
from pathlib import Path

import capt
import pipelines
from capt.digest import file_sha256

CODE_ARCHIVE = "project_code.zip"
"""The archive's name in the logged model's ``code/`` folder (`capsule_model.py` names it too)."""
DATA_FOLDER = "artifacts"
"""The logged model's folder of pyfunc artifacts (the capsule, result.json): data, outside the code digest."""
CODE_DIGEST_TAG = "code_digest"
"""The version tag holding `code_digest` of the version's logged model, as logged."""
CODE_FILES_TAG = "code_files"
"""The version tag holding `code_table` as JSON: which file changed, when the digest no longer matches."""
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)
"""Every archive member's timestamp: the same sources give the same archive bytes."""


def project_files() -> list[tuple[Path, str]]:
    """(file, name inside the archive) of every file of the `capt` and `pipelines` packages, sorted, without
    ``__pycache__`` (compiled files belong to one interpreter, and MLflow never copied them either)."""
    found = []
    for package in (capt, pipelines):
        root = Path(package.__file__).parent
        found += [(p, p.relative_to(root.parent).as_posix()) for p in root.rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts]
    return sorted(found, key=lambda pair: pair[1])


def code_size() -> tuple[int, int]:
    """(bytes, files) of the project code every logged model carries (before compression, in its archive)."""
    files = project_files()
    return sum(path.stat().st_size for path, _ in files), len(files)


def write_code_archive(folder: Path) -> Path:
    """`CODE_ARCHIVE` of `project_files` in `folder`: sorted members with one fixed timestamp, so that the
    same sources give the same bytes; compressed (zipimport reads deflated members)."""
    archive = folder / CODE_ARCHIVE
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as bundle:
        for path, name in project_files():
            member = zipfile.ZipInfo(name, date_time=_ZIP_TIME)
            member.compress_type, member.external_attr = zipfile.ZIP_DEFLATED, 0o644 << 16
            bundle.writestr(member, path.read_bytes())
    return archive


def code_table(model_dir: str | Path) -> dict[str, str]:
    """{path relative to `model_dir`: SHA-256} of every file of a logged model outside `DATA_FOLDER`, sorted."""
    root = Path(model_dir)
    files = (p for p in root.rglob("*") if p.is_file() and p.relative_to(root).parts[0] != DATA_FOLDER)
    return {p.relative_to(root).as_posix(): file_sha256(p) for p in sorted(files)}


def code_digest(table: Mapping[str, str]) -> str:
    """SHA-256 over `table`'s sorted (path, file digest) lines: any changed, added, removed or renamed file
    changes it."""
    lines = "".join(f"{path}\t{sha}\n" for path, sha in sorted(table.items()))
    return hashlib.sha256(lines.encode("utf-8")).hexdigest()


def code_tags(model_dir: str | Path) -> dict[str, str]:
    """The version tags that record what of the logged model in `model_dir` runs (`CODE_DIGEST_TAG`,
    `CODE_FILES_TAG`)."""
    table = code_table(model_dir)
    return {CODE_DIGEST_TAG: code_digest(table), CODE_FILES_TAG: json.dumps(table, sort_keys=True)}


def changed_files(recorded: Mapping[str, str], found: Mapping[str, str]) -> list[str]:
    """What differs between a recorded `code_table` and the one found: changed, added and missing paths."""
    changed = [f"{p} (changed)" for p in sorted(set(recorded) & set(found)) if recorded[p] != found[p]]
    return (changed + [f"{p} (added)" for p in sorted(set(found) - set(recorded))]
            + [f"{p} (missing)" for p in sorted(set(recorded) - set(found))])
