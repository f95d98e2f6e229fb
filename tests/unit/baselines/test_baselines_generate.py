"""Cached greedy generate equals step-by-step greedy decoding through the wrapper's forward (no cache)."""

from __future__ import annotations

import pytest
import torch

from capt.baselines import PromptTuningConfig, PTuningV2Config, apply

from .baselines_helpers import build, fixed_ids, greedy_without_cache, random_batch

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


def _prompted_encoder_outputs(adapted, batch: dict[str, torch.Tensor]):
    embeds, mask = adapted.extend_inputs(batch["input_ids"], batch["attention_mask"])
    with torch.no_grad():
        return adapted.base.get_encoder()(inputs_embeds=embeds, attention_mask=mask)


@pytest.mark.parametrize("name", ["prompt_tuning", "prompt_tuning_instance"])
@pytest.mark.parametrize("beams", [1, 3])
def test_prompt_tuning_generate_from_encoder_outputs_equals_from_input_ids(name: str, beams: int) -> None:
    adapted = apply(build("t5"), CONFIGS[name])
    batch = random_batch("t5")  # right-padded rows: the scores differ unless the extended mask hides the padding
    options = {"max_new_tokens": STEPS, "do_sample": False, "num_beams": beams}
    from_ids = adapted.generate(batch["input_ids"], batch["attention_mask"], **options)
    encoded = _prompted_encoder_outputs(adapted, batch)
    from_states = adapted.generate(encoder_outputs=encoded, attention_mask=batch["attention_mask"], **options)
    from_tuple = adapted.generate(encoder_outputs=(encoded.last_hidden_state,),
                                  attention_mask=batch["attention_mask"], **options)
    assert isinstance(from_states, torch.Tensor) and from_states.shape == (3, STEPS + 1)
    assert torch.equal(from_states, from_ids)
    assert torch.equal(from_tuple, from_ids)


def test_prompt_tuning_scores_from_encoder_outputs_equal_scores_from_input_ids() -> None:
    adapted = apply(build("t5"), CONFIGS["prompt_tuning"])
    batch = random_batch("t5")
    options = {"max_new_tokens": STEPS, "do_sample": False, "output_scores": True, "return_dict_in_generate": True}
    from_ids = adapted.generate(batch["input_ids"], batch["attention_mask"], **options)
    from_states = adapted.generate(encoder_outputs=_prompted_encoder_outputs(adapted, batch),
                                   attention_mask=batch["attention_mask"], **options)
    assert len(from_states.scores) == STEPS
    for expected, got in zip(from_ids.scores, from_states.scores, strict=True):
        torch.testing.assert_close(got, expected)


def test_prompt_tuning_generate_from_encoder_outputs_rejects_a_mask_of_another_length() -> None:
    adapted = apply(build("t5"), CONFIGS["prompt_tuning"])
    batch = random_batch("t5")
    encoded = _prompted_encoder_outputs(adapted, batch)
    with pytest.raises(ValueError, match="attention_mask has 6 positions"):
        adapted.generate(encoder_outputs=encoded, attention_mask=batch["attention_mask"][:, :-1], max_new_tokens=2)
