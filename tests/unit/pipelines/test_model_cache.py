"""The base-model cache of a reused trial process: a second job loads no weights and trains exactly as a fresh one;
a cached model that a job changed is dropped and loaded again."""

from __future__ import annotations

import pytest
import torch
from helpers.jobs import tiny_job
from safetensors.torch import load_file

from pipelines.models.cache import BaseModelCache, weights_fingerprint
from pipelines.models.loading import load_model
from pipelines.training.loop import run

CASES = [("tiny-t5", "capt", {}), ("tiny-llama", "lora", {"r": 4}), ("tiny-llama", "ptuning_v2", {"num_tokens": 4}),
         ("tiny-bert", "prompt_tuning", {"num_tokens": 4})]
CASES.append(("tiny-t5", "adapter", {"bottleneck": 4}))  # trains the base's layer norms; detach writes them back


def _job(path, model: str, method: str, options: dict, seed: int):
    return tiny_job(path, model, method, method={"options": options}, seed=seed,
                    train={"max_epochs": 4, "eval_every_steps": 2})


def _tensors(result: dict) -> dict[str, torch.Tensor]:
    from pathlib import Path

    tensors = {}
    for file in sorted(Path(result["artifact_dir"]).glob("*.safetensors")):
        tensors |= {f"{file.name}:{k}": v for k, v in load_file(str(file)).items()}
    return tensors


@pytest.mark.parametrize(("model", "method", "options"), CASES)
@pytest.mark.slow
def test_a_second_job_takes_the_cached_model_and_trains_exactly_as_a_fresh_load(tmp_path, model, method, options):
    cache = BaseModelCache()
    first = run(_job(tmp_path / "a", model, method, options, seed=0), base_models=cache)
    second = run(_job(tmp_path / "b", model, method, options, seed=1), base_models=cache)
    assert (cache.loads, cache.hits, len(cache)) == (1, 1, 1), "the second job loaded no weights"
    fresh = run(_job(tmp_path / "c", model, method, options, seed=1))  # no cache: loaded afresh
    assert second["history"] == fresh["history"] and second["metrics"] == fresh["metrics"]
    cached, loaded = _tensors(second), _tensors(fresh)
    assert cached.keys() == loaded.keys() and cached
    assert all(cached[k].equal(loaded[k]) for k in cached), "capsule/adapter (and head) bit-identical"
    assert first["history"] != second["history"], "different seeds: a real second job"


def test_a_changed_cached_model_is_detected_and_loaded_again():
    cache = BaseModelCache()
    with cache.lease("tiny-t5", 2, "float32", "capt") as loaded:
        pristine = weights_fingerprint(loaded.model)
    with cache.lease("tiny-t5", 2, "float32", "capt") as loaded:
        assert cache.hits == 1
        with torch.no_grad():
            next(loaded.model.parameters()).view(-1)[-1] += 1e-3  # one value of one tensor, as a stray update would
    assert len(cache) == 0, "the changed model left the cache"
    with cache.lease("tiny-t5", 2, "float32", "capt") as loaded:
        assert weights_fingerprint(loaded.model) == pristine, "a fresh load, not the changed model"
    assert (cache.loads, cache.hits, len(cache)) == (2, 1, 1)


def test_a_module_left_in_the_model_is_detected():
    model = load_model("tiny-t5", 2).model
    before = weights_fingerprint(model)
    model.encoder.add_module("stray", torch.nn.Identity())  # no weights, only structure
    assert weights_fingerprint(model) != before


def test_a_failed_job_drops_the_entry_and_full_finetuning_never_uses_the_cache():
    cache = BaseModelCache()
    with pytest.raises(RuntimeError), cache.lease("tiny-t5", 2, "float32", "capt"):
        raise RuntimeError("the job failed mid-way")
    assert len(cache) == 0
    for _ in range(2):
        with cache.lease("tiny-t5", 2, "float32", "full_finetune"):
            pass
    assert (cache.loads, cache.hits, len(cache)) == (3, 0, 0)


def test_encoder_heads_are_keyed_by_their_labels():
    cache = BaseModelCache()
    with cache.lease("tiny-bert", 2, "float32", "capt"):
        pass
    with cache.lease("tiny-bert", 3, "float32", "capt") as loaded:
        assert loaded.model.classifier.out_features == 3
    assert (cache.loads, cache.hits, len(cache)) == (2, 0, 2)
