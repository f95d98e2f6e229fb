"""Every method trains on tiny T5, Llama and BERT; artifacts reload to the same predictions."""

from __future__ import annotations

import json

import pytest
from helpers.jobs import tiny_job
from helpers.methods import options

from capt import tasks
from pipelines.adapted import load_artifact, predict, sequence_overhead
from pipelines.config.schema import METHOD_NAMES
from pipelines.models.loading import load_model
from pipelines.training.loop import run
from pipelines.training.setup import load_data

MODELS = ["tiny-t5", "tiny-llama", "tiny-bert"]
LEARNING_RATES = {"full_finetune": 1e-3, "lora": 1e-2, "adapter": 1e-2}
STEPS = 3
"""Optimiser steps per job, each validated: enough to see the loss fall through the whole pipeline; each
method's learning dynamics are checked against stored curves in test_method_loss_curves.py."""


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("method", METHOD_NAMES)
@pytest.mark.slow
def test_method_trains_and_its_artifact_reloads(tmp_path, model, method):
    config = tiny_job(tmp_path / "job", model, method, method={"options": options(method)},
                      optim={"lr": LEARNING_RATES.get(method)}, train={"max_epochs": STEPS, "eval_every_steps": 1})
    result = run(config)
    curve = [record["train_loss"] for record in result["history"]]
    assert len(curve) == STEPS and curve[-1] < curve[0], f"loss must decrease: {curve}"
    artifact = tmp_path / "job" / "artifact"
    saved = json.loads((tmp_path / "job" / "result.json").read_text())
    assert saved["metrics"] == pytest.approx(result["metrics"])
    assert saved["trainable_parameters"] > 0 and saved["steps"] == STEPS

    loaded = load_model(model, tasks.get("rte").num_labels)
    reloaded = load_artifact(loaded.model, artifact)
    collator = tasks.Collator(loaded.tokenizer, loaded.family, max_length=96,
                              capsule_slots=sequence_overhead(method, options(method)))
    test = load_data(config).test
    predictions = predict(reloaded, test, collator, loaded.spec, "rank", 8, 10, loaded.tokenizer, "cpu")
    metrics = tasks.compute_metrics("rte", predictions, [e.label for e in test])
    assert metrics["score"] == pytest.approx(result["metrics"]["test_score"])
