"""Symbolic links in a capsule artifact are refused by name, on the way into MLflow and on the way out (issue 56).

One tiny capsule is trained and registered once (module fixture). A link planted in the server's artifact store (a file
or the whole capsule folder leading outside the store) is refused by the Serve source, by promote and by the verified
loader as a symbolic link naming the file, not with MLflow's "400 Bad Request". A job folder whose artifact holds a link
(to /etc/passwd, or to a copy with the very bytes the manifest records) is refused before its run uploads or registers
anything: the finish is dead-lettered with the link named.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from helpers.registry import track, train_capsule
from mlflow import MlflowClient

from capt.errors import ArtifactIntegrityError
from pipelines import promote
from pipelines.services import LocalMlflowServer
from pipelines.serving.source import RegistrySource
from pipelines.tracking import load_capsule_model
from pipelines.tracking.spool import FAILED_FILE

pytestmark = pytest.mark.integration

SLUG = "tiny-t5-links"
NAME = f"capt-{SLUG}-rte"
EXPERIMENT = "test-artifact-links"


@pytest.fixture(scope="module")
def registered(mlflow_server: LocalMlflowServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("links")
    result = {**train_capsule(root / "job", "rte", 0), "model_slug": SLUG}
    track(mlflow_server.uri, result, EXPERIMENT)
    source = MlflowClient(mlflow_server.uri).get_model_version_download_uri(NAME, "1")
    where = source.split(":", 1)[1].lstrip("/")  # mlflow-artifacts:/<experiment>/models/<model id>/artifacts
    [capsule_json] = (mlflow_server.artifacts_dir / where).rglob("capsule.json")
    return {"uri": mlflow_server.uri, "result": result, "root": root, "stored": capsule_json}


def _plant_file_link(stored: Path, outside: Path) -> None:
    stored.unlink()
    stored.symlink_to("/etc/passwd")


def _plant_folder_link(stored: Path, outside: Path) -> None:
    shutil.copytree(stored.parent, outside / "capsule-copy")
    shutil.rmtree(stored.parent)
    stored.parent.symlink_to(outside / "capsule-copy", target_is_directory=True)


@pytest.mark.parametrize("plant", [_plant_file_link, _plant_folder_link], ids=["file", "folder"])
def test_a_link_out_of_the_artifact_store_is_refused_by_name(registered, plant, tmp_path) -> None:
    uri, stored = registered["uri"], registered["stored"]
    folder, original = stored.parent, {p.name: p.read_bytes() for p in stored.parent.iterdir()}
    for name in ("serve", "load", "again", "outside"):
        (tmp_path / name).mkdir()
    plant(stored, tmp_path / "outside")
    try:
        with pytest.raises(ArtifactIntegrityError) as serving:
            RegistrySource(uri, SLUG, "champion", tmp_path / "serve").fetch("rte", 1)
        with pytest.raises(promote.PromotionError) as promoting:
            promote.promote(SLUG, "rte", tracking_uri=uri)
        with pytest.raises(ArtifactIntegrityError) as loading:
            load_capsule_model(f"models:/{NAME}/1", tracking_uri=uri, dst=tmp_path / "load")
        for message in (str(serving.value), str(promoting.value), str(loading.value)):
            assert f"Version 1 of {NAME}" in message and "is a symbolic link" in message, message
            assert "artifact" in message and "400 Client Error" not in message, message
        assert "capsule.json" in str(serving.value) or "folder" in plant.__name__
        assert not MlflowClient(uri).get_registered_model(NAME).aliases, "promote changed nothing"
    finally:
        if folder.is_symlink() or stored.is_symlink():
            (folder if folder.is_symlink() else stored).unlink()
        folder.mkdir(exist_ok=True)
        for name, data in original.items():
            (folder / name).write_bytes(data)
    assert RegistrySource(uri, SLUG, "champion", tmp_path / "again").fetch("rte", 1).version == 1, "restored: served"


@pytest.mark.parametrize("target", ["/etc/passwd", "copy"])
def test_a_job_artifact_holding_a_link_uploads_and_registers_nothing(registered, target, tmp_path) -> None:
    """Even a link to the file's own bytes is refused: the run gets no artifact, the registry no version."""
    uri, result = registered["uri"], registered["result"]
    slug = f"{SLUG}-up{'p' if target == '/etc/passwd' else 'c'}"
    artifact = tmp_path / "job" / "artifact"
    shutil.copytree(result["artifact_dir"], artifact)
    linked = artifact / "capsule.json"
    if target == "copy":
        shutil.copyfile(linked, tmp_path / "copy.json")
        target = str(tmp_path / "copy.json")
    linked.unlink()
    os.symlink(target, linked)
    run_id = track(uri, {**result, "model_slug": slug, "artifact_dir": str(artifact)}, EXPERIMENT)
    client = MlflowClient(uri)
    assert [a.path for a in client.list_artifacts(run_id)] == [], "nothing of the finish was uploaded"
    assert client.search_model_versions(f"name='capt-{slug}-rte'") == []
    [failed] = [json.loads(line) for line in (artifact.parent / FAILED_FILE).read_text().splitlines()]
    assert failed["op"] == "finish", failed
    assert f"capsule.json -> {target!r}" in failed["error"] and "symbolic link" in failed["error"], failed["error"]
