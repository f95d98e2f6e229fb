"""The project code a registered version carries (one archive) and the digest that vouches for what of it runs,
checked on a folder laid out as a logged model, without a server (issue 56)."""

from __future__ import annotations

import json
import zipfile
import zipimport
from pathlib import Path
from types import SimpleNamespace

import pytest

from capt.errors import ArtifactIntegrityError
from pipelines.tracking import bundle
from pipelines.tracking.bundle import CODE_ARCHIVE, CODE_DIGEST_TAG, CODE_FILES_TAG, code_digest, code_table, code_tags
from pipelines.tracking.client import TrackingError
from pipelines.tracking.pyfunc import MODEL_CODE
from pipelines.tracking.registry import resolve_version, verify_code


def _logged_model(root: Path) -> Path:
    """A folder laid out as a logged capsule model: what runs, and its data under artifacts/."""
    for name, text in {"MLmodel": "flavors: {}\n", "capsule_model.py": "print('model')\n",
                       "code/project_code.zip": "zip bytes", "requirements.txt": "torch==2\n",
                       "artifacts/result.json": "{}", "artifacts/artifact/capsule.json": "{}"}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_the_code_digest_covers_every_file_that_runs_and_leaves_the_capsule_data_to_its_own_digest(tmp_path):
    model = _logged_model(tmp_path / "model")
    table = code_table(model)
    assert sorted(table) == ["MLmodel", "capsule_model.py", "code/project_code.zip", "requirements.txt"]
    first = code_digest(table)
    assert first == code_digest(dict(reversed(table.items()))), "the order files are listed in does not count"
    (model / "artifacts/result.json").write_text('{"changed": 1}')
    assert code_digest(code_table(model)) == first
    changes = {"changed": lambda m: (m / "code/project_code.zip").write_text("other bytes"),
               "added": lambda m: (m / "code/sitecustomize.py").write_text("import os\n"),
               "renamed": lambda m: (m / "capsule_model.py").rename(m / "model.py"),
               "removed": lambda m: (m / "requirements.txt").unlink()}
    for name, change in changes.items():
        copy = _logged_model(tmp_path / name)
        change(copy)
        assert code_digest(code_table(copy)) != first, name


def test_a_version_whose_code_differs_from_its_tags_is_refused_naming_the_files(tmp_path):
    model = _logged_model(tmp_path / "model")
    tags = code_tags(model)
    assert verify_code(model, "capt-tiny-t5-rte", "3", tags) == tags[CODE_DIGEST_TAG]
    recorded = tags[CODE_DIGEST_TAG]
    (model / "code/project_code.zip").write_text("tampered")
    (model / "code/sitecustomize.py").write_text("import os\n")
    with pytest.raises(ArtifactIntegrityError) as refused:
        verify_code(model, "capt-tiny-t5-rte", "3", tags)
    message = str(refused.value)
    assert message.startswith("Version 3 of capt-tiny-t5-rte is refused before anything of it runs")
    assert recorded in message and code_digest(code_table(model)) in message
    assert "code/project_code.zip (changed); code/sitecustomize.py (added)" in message
    with pytest.raises(ArtifactIntegrityError, match="records no code_digest tag"):
        verify_code(model, "capt-tiny-t5-rte", "3", {})
    forged = {CODE_DIGEST_TAG: recorded, CODE_FILES_TAG: json.dumps({"MLmodel": "0" * 64})}
    with pytest.raises(ArtifactIntegrityError, match="the code_files tag is missing"):
        verify_code(model, "capt-tiny-t5-rte", "3", forged)  # a files tag that disagrees with the digest is not used


def test_the_archive_holds_both_packages_byte_for_byte_the_same_each_time_and_zipimport_finds_them(tmp_path):
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    first, second = bundle.write_code_archive(tmp_path / "a"), bundle.write_code_archive(tmp_path / "b")
    assert first.name == CODE_ARCHIVE and first.read_bytes() == second.read_bytes()
    with zipfile.ZipFile(first) as archive:
        names = archive.namelist()
    assert names == [name for _, name in bundle.project_files()] and len(names) == bundle.code_size()[1]
    assert "pipelines/capsule_predictor.py" in names and not [n for n in names if "__pycache__" in n]
    assert sum(archive.getinfo(n).file_size for n in names) == bundle.code_size()[0]
    importer = zipimport.zipimporter(str(first))
    assert importer.find_spec("capt") is not None and importer.find_spec("pipelines") is not None
    assert f'"{CODE_ARCHIVE}"' in MODEL_CODE.read_text(), "the model file puts the same archive on sys.path"


def test_only_a_uri_naming_one_registered_version_is_taken():
    client = SimpleNamespace(get_model_version_by_alias=lambda name, alias: SimpleNamespace(version=7))
    assert resolve_version(client, "models:/capt-tiny-t5-rte/3") == ("capt-tiny-t5-rte", "3")
    assert resolve_version(client, "models:/capt-tiny-t5-rte@champion") == ("capt-tiny-t5-rte", "7")
    for uri in ("models:/m-0123abcd", "runs:/abc/model", "/tmp/model"):
        with pytest.raises(TrackingError, match="names no registered version"):
            resolve_version(client, uri)
