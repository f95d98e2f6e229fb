"""Jobs with T5's own SuperGLUE input format and with P-Tuning v2's inference-time instance tokens."""

from __future__ import annotations

import pytest
import torch
from helpers.jobs import tiny_job

from capt import tasks
from pipelines.adapted import load_artifact
from pipelines.config.sources import PipelineConfigError
from pipelines.models.cache import BaseModelCache
from pipelines.models.loading import load_model
from pipelines.training.loop import run
from pipelines.training.setup import load_data


@pytest.mark.parametrize(("model", "task", "message"), [
    ("tiny-llama", "rte", "task.input_format='t5_superglue' with a 'decoder' model"),
    ("tiny-bert", "rte", "task.input_format='t5_superglue' with a 'encoder' model"),
    ("tiny-t5", "csqa", "T5's mixture had no csqa format"),
])
def test_the_t5_format_is_refused_where_t5_never_saw_it(tmp_path, model, task, message):
    with pytest.raises(PipelineConfigError, match=message):
        tiny_job(tmp_path, model, "capt", task={"name": task, "input_format": "t5_superglue"})


def test_a_t5_job_trains_and_generates_in_t5s_format(tmp_path):
    config = tiny_job(tmp_path / "job", "tiny-t5", "capt", task={"input_format": "t5_superglue"},
                      train={"max_steps": 4, "eval_every_steps": 2, "eval_mode": "generate"})
    result = run(config)
    assert result["config"]["task"]["input_format"] == "t5_superglue"
    assert result["steps"] == 4 and 0.0 <= result["metrics"]["test_score"] <= 100.0


def test_p_tuning_v2_with_instance_tokens_evaluates_with_them_and_leaves_the_cached_model_as_loaded(tmp_path):
    cache = BaseModelCache()
    results = {}
    for count in (0, 1, 1):
        config = tiny_job(tmp_path / f"job{len(results)}", "tiny-t5", "ptuning_v2",
                          method={"options": {"num_tokens": 2, "instance_tokens": count}},
                          train={"max_steps": 4, "eval_every_steps": 2})
        results[len(results)] = run(config, base_models=cache)
    assert (cache.loads, cache.hits, len(cache)) == (1, 2, 1), "each job gave the base model back as loaded"
    without, with_tokens, again = (results[i]["history"] for i in range(3))
    assert [r["train_loss"] for r in without] == [r["train_loss"] for r in with_tokens], "training never sees them"
    assert with_tokens == again
    loaded = load_model("tiny-t5", 2)
    reloaded = load_artifact(loaded.model, results[1]["artifact_dir"])
    assert reloaded.adapter_config.instance_tokens == 1
    collator = tasks.Collator(loaded.tokenizer, "t5", max_length=96, capsule_slots=1)
    batch = collator(list(load_data(config).test)[:4])
    with torch.no_grad():
        training = reloaded.train()(**batch).logits
        inference = reloaded.eval()(**batch).logits
    assert not torch.allclose(training, inference, atol=1e-4), "evaluation (eval mode) reads the instance token"
