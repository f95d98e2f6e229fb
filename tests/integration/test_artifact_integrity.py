"""Integrity and provenance from the job to the server, on a real MLflow server (issue 30).

One tiny capsule is trained once and registered three times under ``capt-tiny-t5-integrity-rte`` (module
fixture): version 1 stays untouched, version 2's weights are then multiplied by -100 in the artifact store,
version 3 is a consistent forgery (its capsule.json says task cb, its manifest and result.json re-sealed to
match). Every reader (the pyfunc, the verified loader, the Serve source, promote) loads version 1
byte-identically and refuses 2 and 3; a forged version tag is refused; a reused result whose scores were edited
(and re-sealed) is refused by comparison with its MLflow run; a version whose bundled code was rewritten in the
store is refused by the verified loader before any of it runs (issue 56).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd
import pytest
import torch
from helpers.jobs import tiny_job
from helpers.registry import track
from mlflow import MlflowClient
from safetensors.torch import load_file, save_file

from capt import digest
from capt.errors import ArtifactIntegrityError
from capt.tasks import generate_rows
from pipelines import promote
from pipelines.capsule_predictor import CapsulePredictor
from pipelines.provenance import ProvenanceError
from pipelines.services import LocalMlflowServer
from pipelines.serving.app import Reloader
from pipelines.serving.engine import CapsuleEngine
from pipelines.serving.source import RegistrySource
from pipelines.sweeps.trial import tracked_job
from pipelines.tracking import load_capsule_model
from pipelines.tracking.bundle import CODE_ARCHIVE, CODE_DIGEST_TAG, code_digest, code_table
from pipelines.training.loop import run
from pipelines.training.outputs import CachedResultError, result_digest

pytestmark = pytest.mark.integration

SLUG = "tiny-t5-integrity"
NAME = f"capt-{SLUG}-rte"
EXPERIMENT = "test-artifact-integrity"
TRAIN = {"max_epochs": 3, "eval_every_steps": 3, "resume": True}


def _config(folder: Path):
    return tiny_job(folder, "tiny-t5", "capt", "seed=0", task={"name": "rte"}, train=TRAIN)


def _register_copy(uri: str, result: dict[str, Any], folder: Path, validation: float, edit=None) -> dict[str, Any]:
    """Track (and register) a copy of `result`'s job in `folder`, its run logging best validation score
    `validation`; `edit(artifact_dir, result)` forges it first."""
    shutil.copytree(result["artifact_dir"], folder / "artifact")
    copy = {**result, "model_slug": SLUG, "artifact_dir": str(folder / "artifact"),
            "history": [{**record, "best_validation_score": validation} for record in result["history"]],
            "metrics": {**result["metrics"], "best_validation_score": validation}}
    if edit is not None:
        edit(folder / "artifact", copy)
    copy["result_digest"] = result_digest(copy)
    (folder / "result.json").write_text(json.dumps(copy, indent=2))
    track(uri, copy, EXPERIMENT)
    return copy


def _forge_task(artifact: Path, result: dict[str, Any]) -> None:
    """capsule.json says cb; the manifest and result.json's digests re-sealed to match (a consistent forgery)."""
    data = json.loads((artifact / "capsule.json").read_text())
    (artifact / "capsule.json").write_text(json.dumps({**data, "task": "cb"}, indent=2, sort_keys=True))
    result["artifact_digest"] = digest.seal(artifact)
    result["artifact_files"] = json.loads((artifact / digest.MANIFEST_NAME).read_text())["files"]


def _infinite_value(artifact: Path, result: dict[str, Any]) -> None:
    """One capsule value infinite, consistently sealed (as a faulty writer would leave it)."""
    tensors = load_file(str(artifact / "capsule.safetensors"))
    first = sorted(tensors)[0]
    tensors[first] = tensors[first].clone().flatten().index_fill(0, torch.tensor([0]), float("inf")).view_as(
        tensors[first])
    save_file(tensors, str(artifact / "capsule.safetensors"), metadata={"format": "pt"})
    result["artifact_digest"] = digest.seal(artifact)
    result["artifact_files"] = json.loads((artifact / digest.MANIFEST_NAME).read_text())["files"]


def _store_files(server: LocalMlflowServer, version: str, name: str) -> Path:
    """The version's capsule folder inside the server's artifact store."""
    source = MlflowClient(server.uri).get_model_version_download_uri(NAME, version)
    where = source.split(":", 1)[1].lstrip("/")  # mlflow-artifacts:/<experiment>/models/<model id>/artifacts
    [found] = (server.artifacts_dir / where).rglob(name)
    return found


@pytest.fixture(scope="module")
def registered(mlflow_server: LocalMlflowServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("integrity")
    result = run(_config(root / "job"))
    uri = mlflow_server.uri
    # by validation score, version 2 (whose weights are then tampered with) is the best
    versions = {key: _register_copy(uri, result, root / key, validation, edit) for key, validation, edit in
                (("1", 50.0, None), ("2", 90.0, None), ("3", 10.0, _forge_task), ("4", 5.0, _infinite_value))}
    weights = _store_files(mlflow_server, "2", "capsule.safetensors")
    original = weights.read_bytes()
    save_file({k: t * -100 for k, t in load_file(weights).items()}, weights, metadata={"format": "pt"})
    return {"uri": uri, "server": mlflow_server, "job": root / "job", "result": result, "versions": versions,
            "tampered": weights, "original": original, "root": root}


def _rows() -> list[dict[str, Any]]:
    return [{k: v for k, v in row.items() if k != "generated"} for row in generate_rows("rte", "val", 4, seed=5)]


def test_an_untouched_version_records_its_digest_and_loads_byte_identically_everywhere(registered) -> None:
    uri, result = registered["uri"], registered["result"]
    client = MlflowClient(uri)
    version = client.get_model_version(NAME, "1")
    assert version.tags["artifact_digest"] == result["artifact_digest"]
    assert result["artifact_digest"] in version.description
    assert client.get_run(version.run_id).data.tags["artifact_digest"] == result["artifact_digest"]
    served = RegistrySource(uri, SLUG, "champion", registered["root"]).fetch("rte", 1)
    local = Path(result["artifact_dir"])
    assert {p.name: digest.file_sha256(p) for p in Path(served.capsule_dir).iterdir()} == \
        {p.name: digest.file_sha256(p) for p in local.iterdir()}
    mlflow.set_tracking_uri(uri)
    predicted = mlflow.pyfunc.load_model(f"models:/{NAME}/1").predict(pd.DataFrame(_rows()))
    assert list(predicted) == CapsulePredictor(local, result).predict_rows(_rows())


def test_weights_tampered_in_the_artifact_store_are_refused_by_every_reader(registered) -> None:
    uri, tampered = registered["uri"], registered["tampered"]
    found, expected = digest.file_sha256(tampered), registered["result"]["artifact_files"]["capsule.safetensors"]
    mlflow.set_tracking_uri(uri)
    with pytest.raises(Exception) as loading:  # MLflow may wrap what load_context raised
        mlflow.pyfunc.load_model(f"models:/{NAME}/2")
    with pytest.raises(ArtifactIntegrityError) as serving:
        RegistrySource(uri, SLUG, "champion", registered["root"]).fetch("rte", 2)
    with pytest.raises(ArtifactIntegrityError) as verified:
        load_capsule_model(f"models:/{NAME}/2", tracking_uri=uri)
    for message in (str(loading.value), str(serving.value), str(verified.value)):
        assert "capsule.safetensors" in message and found in message and expected in message, message
    assert f"Version 2 of {NAME}" in str(serving.value)
    client = MlflowClient(uri)
    client.set_registered_model_alias(NAME, "champion", "1")
    with pytest.raises(promote.PromotionError, match="Version 2 of .*capsule.safetensors"):  # the best on validation
        promote.promote(SLUG, "rte", tracking_uri=uri)
    assert dict(client.get_registered_model(NAME).aliases) == {"champion": "1"}, "nothing changed"


def test_a_replica_checks_a_refused_version_again_and_serves_it_once_the_store_is_repaired(registered, tmp_path,
                                                                                        caplog) -> None:
    """The alias names the tampered version 2: each poll refuses it (one warning, no copy kept) while version 1
    answers; once the store holds the trained bytes again, the next poll serves version 2."""
    uri, tampered, client = registered["uri"], registered["tampered"], MlflowClient(registered["uri"])
    source = RegistrySource(uri, SLUG, "champion", tmp_path)
    before = client.get_registered_model(NAME).aliases.get("champion")
    client.set_registered_model_alias(NAME, "champion", "1")
    engine = CapsuleEngine([source.fetch("rte", 1)])
    reloader = Reloader(source, engine, ["rte"])
    tampered_bytes = tampered.read_bytes()
    client.set_registered_model_alias(NAME, "champion", "2")
    try:
        with caplog.at_level("INFO", logger="pipelines.serving.app"):
            reloader.poll()
            reloader.poll()
            assert engine.versions() == {"rte": 1} and len(list(tmp_path.iterdir())) == 1, "only version 1's copy"
            refusals = [r.getMessage() for r in caplog.records if "is refused" in r.getMessage()]
            assert len(refusals) == 1 and "capsule.safetensors" in refusals[0], refusals
            tampered.write_bytes(registered["original"])
            reloader.poll()
        assert engine.versions() == {"rte": 2}
        assert any("refused before, passes its checks now" in r.getMessage() for r in caplog.records)
    finally:
        tampered.write_bytes(tampered_bytes)
        client.set_registered_model_alias(NAME, "champion", before or "1")


def test_a_capsule_registered_under_another_task_is_refused(registered) -> None:
    uri = registered["uri"]
    with pytest.raises(ProvenanceError, match="capsule.json records task 'cb', result.json 'rte'"):
        RegistrySource(uri, SLUG, "champion", registered["root"]).fetch("rte", 3)
    mlflow.set_tracking_uri(uri)
    with pytest.raises(Exception, match="capsule.json records task 'cb'"):
        mlflow.pyfunc.load_model(f"models:/{NAME}/3")
    with pytest.raises(ProvenanceError, match="capsule.json records task 'cb'"):
        load_capsule_model(f"models:/{NAME}/3", tracking_uri=uri)


def test_a_forged_version_tag_is_refused(registered) -> None:
    uri, client = registered["uri"], MlflowClient(registered["uri"])
    client.set_model_version_tag(NAME, "1", "artifact_digest", "0" * 64)
    try:
        with pytest.raises(ArtifactIntegrityError, match="disagree"):
            RegistrySource(uri, SLUG, "champion", registered["root"]).fetch("rte", 1)
        with pytest.raises(ArtifactIntegrityError, match="disagree"):
            load_capsule_model(f"models:/{NAME}/1", tracking_uri=uri)
    finally:
        client.set_model_version_tag(NAME, "1", "artifact_digest", registered["result"]["artifact_digest"])


def test_a_reused_result_is_compared_with_its_run(registered) -> None:
    """The job of version 1 is finished and tracked: a restarted trial (`tracked_job`, as the sweep runs it) reuses
    it as it stands; with its scores edited and its own digest recomputed (so that only the tracking database can
    tell), the trial is refused and reports nothing."""
    uri, folder = registered["uri"], registered["root"] / "forged"
    shutil.copytree(registered["root"] / "1", folder, ignore=shutil.ignore_patterns("job.lock"))
    result = {**registered["versions"]["1"], "artifact_dir": str(folder / "artifact")}
    result["metrics"] = {**result["metrics"], "test_score": 99.9}
    result["result_digest"] = result_digest(result)
    (folder / "result.json").write_text(json.dumps(result, indent=2))
    tracking = {"uri": uri, "experiment": EXPERIMENT, "run_name": "reuse", "retry_s": 5.0, "register": True,
                "tags": {}, "system_metrics_interval_s": 10.0}
    for job, refused in ((registered["root"] / "1", False), (folder, True)):
        reported: list[dict[str, float]] = []
        loop_config = {"job": _config(job).to_dict(), "tracking": tracking}
        if not refused:
            tracked_job(loop_config, reported.append, is_main=True)
            assert reported[-1]["test_score"] == registered["result"]["metrics"]["test_score"]
            continue
        with pytest.raises(CachedResultError, match=r"test_score: result.json 99.9, run .*train.overwrite=true"):
            tracked_job(loop_config, reported.append, is_main=True)
        assert reported == [], "a refused trial reports no score"


@pytest.mark.parametrize(("version", "reason"), [("2", "capsule.safetensors was expected to have SHA-256"),
                                                 ("4", "capsule.safetensors holds NaN or infinite values")])
def test_serve_refuses_a_bad_capsule_in_one_paragraph_before_ray_starts(registered, version, reason, capsys,
                                                                        monkeypatch) -> None:
    from pipelines import serve
    from pipelines.services import free_port

    MlflowClient(registered["uri"]).set_registered_model_alias(NAME, "suspect", version)
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")  # a serve that went past the check would fail on Ray instead
    code = serve.main(["--model", SLUG, "--tasks", "rte", "--tracking-uri", registered["uri"], "--alias", "suspect",
                       "--no-auth", "--port", str(free_port())])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and f"Version {version} of {NAME}" in err and reason in err, err
    assert "Ray" not in err.split("error:", 1)[1], "refused before Ray was reached"


TAMPERED_CAPT = """import os, pathlib
pathlib.Path(os.environ["CAPT_TAMPER_MARKER"]).write_text("the rewritten code/ ran")
"""
LOAD_PLAINLY = "import sys, mlflow; mlflow.pyfunc.load_model(sys.argv[1])"


def _rewrite_archive(archive: Path) -> None:
    """The store's code/ archive, its capt/__init__.py ending in code that leaves a marker file when it runs."""
    with zipfile.ZipFile(archive) as original:
        members = {info.filename: original.read(info) for info in original.infolist()}
    members["capt/__init__.py"] += b"\n" + TAMPERED_CAPT.encode()
    with zipfile.ZipFile(archive, "w") as rewritten:
        for name, data in members.items():
            rewritten.writestr(name, data)


def test_code_rewritten_in_the_artifact_store_is_refused_before_it_runs(registered, tmp_path, monkeypatch) -> None:
    """Version 5's code/ archive is rewritten in the store so that importing capt leaves a marker: plain
    mlflow.pyfunc.load_model in a fresh process runs it; the verified loader refuses the version, naming the file
    and both digests, and nothing of it runs. The untouched version 1 loads through the verified loader and
    predicts what the job's own predictor does."""
    uri, result = registered["uri"], registered["result"]
    _register_copy(uri, result, tmp_path / "5", 1.0)
    client = MlflowClient(uri)
    recorded = client.get_model_version(NAME, "5").tags[CODE_DIGEST_TAG]
    model_dir = _store_files(registered["server"], "5", "MLmodel").parent
    assert code_digest(code_table(model_dir)) == recorded, "the tag hashes the files as the store holds them"
    _rewrite_archive(model_dir / "code" / CODE_ARCHIVE)
    marker = tmp_path / "marker"
    monkeypatch.setenv("CAPT_TAMPER_MARKER", str(marker))
    with pytest.raises(ArtifactIntegrityError) as refused:
        load_capsule_model(f"models:/{NAME}/5", tracking_uri=uri, dst=tmp_path / "verified")
    message = str(refused.value)
    assert message.startswith(f"Version 5 of {NAME} is refused before anything of it runs"), message
    assert recorded in message and code_digest(code_table(model_dir)) in message
    assert f"code/{CODE_ARCHIVE} (changed)" in message and not marker.exists()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"MLFLOW_TRACKING_URI": uri}
    plain = subprocess.run([sys.executable, "-c", LOAD_PLAINLY, str(model_dir)], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=300)
    # what the refusal kept from running: a plain load runs the rewritten archive
    assert marker.is_file() and marker.read_text() == "the rewritten code/ ran", plain.stderr[-3000:]

    loaded = load_capsule_model(f"models:/{NAME}/1", tracking_uri=uri)
    assert list(loaded.predict(pd.DataFrame(_rows()))) == CapsulePredictor(result["artifact_dir"], result).predict_rows(
        _rows())
