"""Every ablation of the paper is a CapsuleConfig of the one code path; each trains and has its parameter count."""

from __future__ import annotations

import pytest
import torch
from tiny_models import BUILDERS, random_batch

import capt
from capt.capsule import Capsule, masked_mean

LAYERS, D = 4, 32

# name -> (config, capsule layers, trainable parameters by the definition of the variant)
VARIANTS = {
    "all-layers": (dict(), 4, 4 * D),
    "first-half": (dict(layers="first_half"), 2, 2 * D),
    "odd-layers": (dict(layers="odd"), 2, 2 * D),
    "explicit-layers": (dict(layers=[1, 3]), 2, 2 * D),
    "fusion-project": (dict(fusion="project"), 4, 4 * (D + 2 * 8 * D)),
    "fusion-project-rank-2": (dict(fusion="project", project_rank=2), 4, 4 * (D + 2 * 2 * D)),
    "fusion-prepend": (dict(fusion="prepend"), 4, 4 * D),
    "fusion-conv": (dict(fusion="conv"), 4, 4 * (D + 3 * D)),
    "instance-only": (dict(task_vector=False), 4, 0),
    "task-only": (dict(instance_mean=False), 4, 4 * D),
    "length-3": (dict(length=3), 4, 4 * 3 * D),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_variant_trains_and_has_its_parameter_count(kind, variant):
    options, capsule_layers, expected = VARIANTS[variant]
    model = BUILDERS[kind](layers=LAYERS)
    inputs = random_batch(kind)
    with torch.no_grad():
        base_logits = model(**inputs).logits
    capsule_model = capt.attach(model, capt.CapsuleConfig(init="normal", **options))
    if hasattr(capsule_model.capsules[0], "projection_up"):
        with torch.no_grad():  # U starts at zero, which blocks V's gradient until U has moved
            capsule_model.capsules[0].projection_up.normal_(0.0, 0.1)
    params = list(capsule_model.trainable_parameters())
    assert len(capsule_model.capsules[0].layers) == capsule_layers
    assert sum(p.numel() for p in params) == expected
    out = capsule_model(**inputs)
    assert out.logits.shape == base_logits.shape
    assert not torch.allclose(out.logits, base_logits), "the capsule must act on the model"
    if params:
        out.loss.backward()
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in params)


def test_prepend_uses_one_more_slot_than_length():
    capsule_model = capt.attach(BUILDERS["llama"](), capt.CapsuleConfig(fusion="prepend", length=2))
    assert capsule_model.num_slots == 3


def _slot_states(kind, config, inputs):
    model = BUILDERS[kind]()
    capsule_model = capt.attach(model, config)
    seen = []
    capsule_model.spec.find_layers(model)[0].register_forward_pre_hook(
        lambda _m, args, kwargs: seen.append((args[0] if args else kwargs["hidden_states"])[:, 0].clone()),
        with_kwargs=True)
    with torch.no_grad():
        capsule_model(**inputs)
    return seen[0]  # (B, D)


def test_task_only_capsule_ignores_the_instance():
    inputs = random_batch("t5", batch=3)
    states = _slot_states("t5", capt.CapsuleConfig(instance_mean=False, init="normal"), inputs)
    assert torch.equal(states[0], states[1]) and torch.equal(states[1], states[2])


def test_instance_only_capsule_is_the_mean_of_the_instance():
    inputs = random_batch("t5", batch=2)
    states = _slot_states("t5", capt.CapsuleConfig(task_vector=False), inputs)
    embeds = BUILDERS["t5"]().get_input_embeddings()(inputs["input_ids"])
    mask = inputs["attention_mask"][..., None].float()
    torch.testing.assert_close(states, (embeds * mask).sum(1) / mask.sum(1))


def test_project_fusion_starts_as_add_and_then_adds_its_low_rank_map_of_the_mean():
    added = Capsule(capt.CapsuleConfig(init="normal"), (0, 1), D)
    projected = Capsule(capt.CapsuleConfig(init="normal", fusion="project", project_rank=3), (0, 1), D)
    assert projected.projection_up.shape == (2, D, 3) and projected.projection_down.shape == (2, 3, D)
    with torch.no_grad():
        projected.vectors.copy_(added.vectors)
    states, mask = torch.randn(2, 5, D), torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    torch.testing.assert_close(projected.fuse(1, states, mask), added.fuse(1, states, mask))
    with torch.no_grad():
        projected.projection_up.normal_(0.0, 0.1)
    low_rank = (masked_mean(states, mask) @ projected.projection_down[1].T) @ projected.projection_up[1].T
    assert low_rank.abs().min() > 0
    torch.testing.assert_close(projected.fuse(1, states, mask), added.fuse(1, states, mask) + low_rank.unsqueeze(1))


def test_project_rank_above_the_hidden_size_is_refused():
    with pytest.raises(capt.CapsuleConfigError, match=r"project_rank=33 exceeds the model's hidden size 32"):
        capt.attach(BUILDERS["t5"](), capt.CapsuleConfig(fusion="project", project_rank=33))
