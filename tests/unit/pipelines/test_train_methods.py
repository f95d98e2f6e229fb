"""Every method trains on tiny T5, Llama and BERT; artifacts reload to the same predictions."""

from __future__ import annotations

import json

import pytest
from helpers.jobs import tiny_job

from capt import tasks
from pipelines.config.schema import METHOD_NAMES
from pipelines.evaluation import predict
from pipelines.methods import load_artifact, sequence_overhead
from pipelines.models.loading import load_model
from pipelines.train import run
from pipelines.training.setup import load_data

MODELS = ["tiny-t5", "tiny-llama", "tiny-bert"]
OPTIONS = {"prompt_tuning": {"num_tokens": 4}, "ptuning_v2": {"num_tokens": 4}, "lora": {"r": 4}}
LEARNING_RATES = {"full_finetune": 1e-3, "lora": 1e-2}
OPTIONS["adapter"] = {"bottleneck": 8}
LEARNING_RATES["adapter"] = 1e-2
OPTIONS["dept"] = {"num_tokens": 4, "rank": 4, "max_length": 96}
OPTIONS["residual_prompt"] = {"num_tokens": 4, "bottleneck": 16}
OPTIONS["superpos_prompt"] = {"num_tokens": 4, "num_sampled": 32}
OPTIONS["vfpt"] = {"num_tokens": 4}
OPTIONS["smop"] = {"num_tokens": 4, "num_prompts": 2}
OPTIONS["ept"] = {"num_tokens": 4, "rank": 4, "max_length": 96, "num_spaces": 2, "space_rank": 2}
OPTIONS["xprompt"] = {"num_tokens": 4, "pieces": 4, "token_prune_fraction": 0.25, "piece_prune_fraction": 0.25,
                      "pruning_at": 0.3}


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("method", METHOD_NAMES)
@pytest.mark.slow
def test_method_trains_and_its_artifact_reloads(tmp_path, model, method):
    config = tiny_job(tmp_path / "job", model, method, method={"options": OPTIONS.get(method, {})},
                      optim={"lr": LEARNING_RATES.get(method)})
    result = run(config)
    curve = [record["train_loss"] for record in result["history"]]
    assert len(curve) == 3 and curve[-1] < curve[0], f"loss must decrease: {curve}"
    artifact = tmp_path / "job" / "artifact"
    saved = json.loads((tmp_path / "job" / "result.json").read_text())
    assert saved["metrics"] == pytest.approx(result["metrics"])
    assert saved["trainable_parameters"] > 0 and saved["steps"] == 30

    loaded = load_model(model, tasks.get("rte").num_labels)
    reloaded = load_artifact(loaded.model, artifact)
    collator = tasks.Collator(loaded.tokenizer, loaded.family, max_length=96,
                              capsule_slots=sequence_overhead(method, OPTIONS.get(method, {})))
    test = load_data(config).test
    predictions = predict(reloaded, test, collator, loaded.spec, "rank", 8, 10, loaded.tokenizer, "cpu")
    metrics = tasks.compute_metrics("rte", predictions, [e.label for e in test])
    assert metrics["score"] == pytest.approx(result["metrics"]["test_score"])
