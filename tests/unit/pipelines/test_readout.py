"""`model.readout` in jobs: resolved at validation, in result.json, stored with the artifact (a mismatch refused),
served by the registry predictor, removed before a cached base model is reused; refused where it cannot apply."""

from __future__ import annotations

import json

import pytest
from helpers.jobs import tiny_job

import capt
from capt import tasks
from capt.arch.readout import install_readout, installed_readout
from capt.digest import MANIFEST_NAME
from capt.tasks import example_rows
from pipelines.adapted import load_artifact, predict
from pipelines.capsule_predictor import CapsulePredictor
from pipelines.config.load import ENCODER_READOUT
from pipelines.config.sources import PipelineConfigError
from pipelines.models.cache import BaseModelCache
from pipelines.models.loading import load_model
from pipelines.training.loop import run
from pipelines.training.setup import load_data


def test_an_unset_readout_resolves_by_family(tmp_path):
    assert tiny_job(tmp_path, "tiny-bert").model.readout == ENCODER_READOUT
    assert tiny_job(tmp_path, "tiny-t5").model.readout == "lm_head"
    assert tiny_job(tmp_path, "tiny-llama").model.readout == "lm_head"
    assert tiny_job(tmp_path, "tiny-bert", model={"readout": "cls"}).model.readout == "cls"


@pytest.mark.parametrize(("model", "method", "readout", "message"), [
    ("tiny-bert", "lora", "capsule", "method 'lora' has no capsule slot.*allowed: pooler, cls, mean, or leave"),
    ("tiny-t5", "capt", "mean", "read the label word from their language-model head.*allowed: lm_head"),
    ("tiny-bert", "capt", "lm_head", "classify with a linear head"),
    ("tiny-bert", "capt", "avg", "model.readout='avg'"),
])
def test_readouts_that_cannot_apply_are_refused(tmp_path, model, method, readout, message):
    with pytest.raises(PipelineConfigError, match=message):
        tiny_job(tmp_path, model, method, model={"readout": readout})


def test_the_readout_travels_with_the_artifact_and_a_mismatch_is_refused(tmp_path):
    config = tiny_job(tmp_path / "job", "tiny-bert", "capt", model={"readout": "capsule"},
                      train={"max_steps": 6, "eval_every_steps": 3})
    result = run(config)
    saved = json.loads((tmp_path / "job" / "result.json").read_text())
    assert result["readout"] == saved["readout"] == saved["config"]["model"]["readout"] == "capsule"
    artifact = tmp_path / "job" / "artifact"
    assert json.loads((artifact / "method.json").read_text())["readout"] == "capsule"

    loaded = load_model("tiny-bert", tasks.get("rte").num_labels)
    reloaded = load_artifact(loaded.model, artifact)
    assert installed_readout(loaded.model) == "capsule"
    collator = tasks.Collator(loaded.tokenizer, "encoder", max_length=96, capsule_slots=1)
    test = load_data(config).test
    predictions = predict(reloaded, test, collator, loaded.spec, "rank", 8, 10, loaded.tokenizer, "cpu")
    assert tasks.compute_metrics("rte", predictions, [e.label for e in test])["score"] == pytest.approx(
        result["metrics"]["test_score"])

    with pytest.raises(capt.CapsuleArtifactError, match="trained with readout='capsule', but readout='mean'"):
        load_artifact(load_model("tiny-bert", 2).model, artifact, readout="mean")
    predictor = CapsulePredictor.from_paths(artifact, tmp_path / "job" / "result.json", device="cpu")
    assert installed_readout(predictor.model.base_model) == "capsule"
    assert set(predictor.predict_rows(example_rows("rte", 3))) <= set(tasks.get("rte").label_names)
    saved["config"]["model"]["readout"] = "cls"
    (tmp_path / "other.json").write_text(json.dumps(saved))
    with pytest.raises(capt.CapsuleArtifactError, match="readout='cls' was asked for"):
        CapsulePredictor.from_paths(artifact, tmp_path / "other.json", device="cpu")


def test_an_artifact_without_a_recorded_readout_reads_the_pooler(tmp_path):
    config = tiny_job(tmp_path / "job", "tiny-bert", "lora", method={"options": {"r": 2}},
                      train={"max_steps": 2, "eval_every_steps": 2})
    run(config)
    info_file = tmp_path / "job" / "artifact" / "method.json"
    info = json.loads(info_file.read_text())
    assert info.pop("readout") == ENCODER_READOUT
    info_file.write_text(json.dumps(info))  # as written before readouts (and digests) were recorded
    (info_file.parent / MANIFEST_NAME).unlink()
    model = load_model("tiny-bert", 2).model
    load_artifact(model, info_file.parent)
    assert installed_readout(model) == "pooler"


def test_a_readout_left_on_a_cached_model_is_detected():
    cache = BaseModelCache()
    with cache.lease("tiny-bert", 2, "float32", "capt") as loaded:
        install_readout(loaded.model, "cls")  # a job that forgot to remove it
    assert len(cache) == 0, "the hook changed the fingerprint: the entry is dropped"
