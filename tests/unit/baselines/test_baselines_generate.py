"""Cached greedy generate equals step-by-step greedy decoding through the wrapper's forward (no cache)."""

from __future__ import annotations

import pytest
import torch

from capt.baselines import PromptTuningConfig, PTuningV2Config, apply

from .baselines_helpers import build, fixed_ids, greedy_without_cache

CONFIGS = {
    "ptuning_v2": PTuningV2Config(num_tokens=4, init_std=2.0),
    "ptuning_v2_reparam": PTuningV2Config(num_tokens=4, reparameterize=True, reparam_hidden=16),
    "prompt_tuning": PromptTuningConfig(num_tokens=4, init_std=1.0),
    "prompt_tuning_instance": PromptTuningConfig(num_tokens=4, init_std=1.0, instance_token=True),
}
STEPS = 6


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("kind", ["t5", "llama", "qwen2"])
def test_cached_generate_equals_uncached_greedy(kind: str, name: str) -> None:
    adapted = apply(build(kind), CONFIGS[name])
    ids = fixed_ids(batch=3, length=5)
    generated = adapted.generate(ids, torch.ones_like(ids), max_new_tokens=STEPS, do_sample=False, use_cache=True)
    # The instance token is the mean over the prompt only: mark the generated tokens as not-prompt.
    expected = greedy_without_cache(adapted, kind, ids, STEPS, pass_prompt_mask=True)
    assert torch.equal(generated, expected)


@pytest.mark.parametrize("name", ["ptuning_v2", "prompt_tuning"])
def test_beam_search_with_several_returns(name: str) -> None:
    adapted = apply(build("llama"), CONFIGS[name])
    ids = fixed_ids(batch=2, length=5)
    out = adapted.generate(ids, torch.ones_like(ids), max_new_tokens=3, num_beams=3, num_return_sequences=2,
                           do_sample=False, return_dict_in_generate=True)
    assert out.sequences.shape == (4, 8)
    assert torch.equal(out.sequences[:, :5], ids.repeat_interleave(2, dim=0))


def test_prompt_tuning_max_length_counts_the_prompt() -> None:
    adapted = apply(build("llama"), CONFIGS["prompt_tuning"])
    ids = fixed_ids(batch=2, length=5)
    assert adapted.generate(ids, torch.ones_like(ids), max_length=9, do_sample=False).shape == (2, 9)


def test_encoder_models_do_not_generate() -> None:
    adapted = apply(build("bert"), CONFIGS["prompt_tuning"])
    ids = fixed_ids()
    with pytest.raises(TypeError, match="does not generate"):
        adapted.generate(ids, torch.ones_like(ids))
