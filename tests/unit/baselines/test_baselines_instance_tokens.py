"""P-Tuning v2 with training-free instance tokens at inference (the paper's "add a single instance-aware token
without fine-tuning" rows): none changes nothing, some change the outputs, cached generation stays exact."""

from __future__ import annotations

import pytest
import torch

from capt.baselines import PTuningV2Config, apply, load_adapter

from .baselines_helpers import build, fixed_ids, greedy_without_cache, random_batch

STEPS = 5


def _logits(kind: str, instance_tokens: int, train: bool = False) -> torch.Tensor:
    torch.manual_seed(0)  # the same prefixes for every count
    adapted = apply(build(kind), PTuningV2Config(num_tokens=3, init_std=2.0, instance_tokens=instance_tokens))
    adapted.train(train)
    with torch.no_grad():
        return adapted(**random_batch(kind)).logits


@pytest.mark.parametrize("kind", ["t5", "llama"])
def test_no_instance_token_is_exactly_p_tuning_v2_and_tokens_change_the_logits(kind: str) -> None:
    torch.manual_seed(0)
    plain = apply(build(kind), PTuningV2Config(num_tokens=3, init_std=2.0)).eval()
    with torch.no_grad():
        today = plain(**random_batch(kind)).logits
    assert torch.equal(_logits(kind, 0), today)
    one, two = _logits(kind, 1), _logits(kind, 2)
    assert one.shape == today.shape, "the slots never reach the outputs"
    assert not torch.allclose(one, today, atol=1e-4) and not torch.allclose(two, one, atol=1e-4)


@pytest.mark.parametrize("kind", ["t5", "llama"])
def test_training_steps_never_see_the_instance_tokens(kind: str) -> None:
    assert torch.equal(_logits(kind, 2, train=True), _logits(kind, 0, train=True))


@pytest.mark.parametrize("count", [1, 3])
@pytest.mark.parametrize("kind", ["t5", "llama"])
def test_cached_generation_equals_uncached_greedy_decoding(kind: str, count: int) -> None:
    torch.manual_seed(0)
    adapted = apply(build(kind), PTuningV2Config(num_tokens=3, init_std=2.0, instance_tokens=count)).eval()
    ids = fixed_ids(batch=3, length=5)
    cached = adapted.generate(ids, torch.ones_like(ids), max_new_tokens=STEPS, do_sample=False, use_cache=True)
    uncached = adapted.generate(ids, torch.ones_like(ids), max_new_tokens=STEPS, do_sample=False, use_cache=False)
    # The instance mean covers the prompt only: the generated tokens are marked as not-prompt.
    stepwise = greedy_without_cache(adapted, kind, ids, STEPS, pass_prompt_mask=True)
    assert torch.equal(cached, uncached) and torch.equal(cached, stepwise)
    torch.manual_seed(0)
    plain = apply(build(kind), PTuningV2Config(num_tokens=3, init_std=2.0)).eval()
    assert not torch.equal(cached, plain.generate(ids, torch.ones_like(ids), max_new_tokens=STEPS, do_sample=False))


def test_detach_leaves_no_hook_and_the_count_survives_the_artifact(tmp_path) -> None:
    model = build("t5")
    ids = fixed_ids()
    with torch.no_grad():
        before = model(input_ids=ids, decoder_input_ids=ids).logits
    adapted = apply(model, PTuningV2Config(num_tokens=3, instance_tokens=2)).eval()
    adapted.save_adapter(tmp_path / "adapter")
    with torch.no_grad():
        expected = adapted(input_ids=ids, decoder_input_ids=ids).logits
    base = adapted.detach()
    assert not any(layer._forward_pre_hooks for layer in base.encoder.block)
    with torch.no_grad():
        assert torch.equal(base(input_ids=ids, decoder_input_ids=ids).logits, before)
    reloaded = load_adapter(base, tmp_path / "adapter").eval()
    assert reloaded.adapter_config.instance_tokens == 2
    with torch.no_grad():
        assert torch.equal(reloaded(input_ids=ids, decoder_input_ids=ids).logits, expected)


def test_bad_counts_and_encoder_models_are_refused() -> None:
    with pytest.raises(ValueError, match="instance_tokens=-1"):
        PTuningV2Config(instance_tokens=-1)
    model = build("bert")
    with pytest.raises(ValueError, match="instance_tokens=1 with an encoder-only"):
        apply(model, PTuningV2Config(num_tokens=3, instance_tokens=1))
    apply(model, PTuningV2Config(num_tokens=3)).detach()  # the refusal changed nothing on the model
