"""attach/detach, trainable parameters, gradients, and the method's definition."""

from __future__ import annotations

import pytest
import torch
from tiny_models import BUILDERS, random_batch

import capt
from capt.arch import spec_for


def _outputs(model, inputs):
    out = model(**inputs)
    return out.logits


def test_detach_is_bit_identical(kind):
    model = BUILDERS[kind]()
    inputs = random_batch(kind)
    flags_before = {n: p.requires_grad for n, p in model.named_parameters()}
    with torch.no_grad():
        before = _outputs(model, inputs)
    capsule_model = capt.attach(model, capt.CapsuleConfig(init="normal", init_std=1.0))
    with torch.no_grad():
        during = _outputs(capsule_model, inputs)
    base = capsule_model.detach()
    with torch.no_grad():
        after = _outputs(base, inputs)
    assert base is model
    assert not torch.allclose(before, during), "the capsule must change the outputs"
    assert torch.equal(before, after)
    assert {n: p.requires_grad for n, p in base.named_parameters()} == flags_before
    capt.attach(base).detach()  # can be attached again after detach


def test_attach_twice_is_refused():
    model = BUILDERS["llama"]()
    capt.attach(model)
    with pytest.raises(capt.CaptError, match="already has capsules"):
        capt.attach(model)


def test_only_capsule_parameters_are_trainable(kind):
    model = BUILDERS[kind]()
    capsule_model = capt.attach(model, capt.CapsuleConfig(length=2))
    trainable = [p for p in capsule_model.parameters() if p.requires_grad]
    listed = list(capsule_model.trainable_parameters())
    assert {id(p) for p in trainable} == {id(p) for p in listed}
    layers = len(spec_for(model).find_layers(model))
    assert sum(p.numel() for p in listed) == layers * 2 * 32


def test_gradients_reach_every_capsule_vector(kind):
    model = BUILDERS[kind](layers=4)
    capsule_model = capt.attach(model, capt.CapsuleConfig(init="normal", length=2))
    capsule_model(**random_batch(kind)).loss.backward()
    grad = capsule_model.capsules[0].vectors.grad  # (L, k, D)
    assert grad.shape == (4, 2, 32)
    assert (grad.abs().sum(dim=-1) > 0).all(), "every vector of every capsule layer gets a gradient"
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("layers, expected", [("odd", [0, 2]), ("first_half", [0, 1]), ([1, 3], [1, 3])])
def test_layers_without_a_capsule_get_none(kind, layers, expected):
    model = BUILDERS[kind](layers=4)
    capsule_model = capt.attach(model, capt.CapsuleConfig(layers=layers, init="normal"))
    capsule = capsule_model.capsules[0]
    assert list(capsule.layers) == expected
    hooked = [i for i, layer in enumerate(spec_for(model).find_layers(model)) if layer._forward_pre_hooks]
    assert hooked == expected
    capsule_model(**random_batch(kind)).loss.backward()
    assert capsule.vectors.grad.shape[0] == len(expected)
    assert (capsule.vectors.grad.abs().sum(dim=(1, 2)) > 0).all()


def _record_layer_inputs(model, capsule_model):
    """Record each layer's input hidden states after the capsule overwrite."""
    records = []
    for layer in spec_for(model).find_layers(model):
        layer.register_forward_pre_hook(
            lambda _m, args, kwargs: records.append((args[0] if args else kwargs["hidden_states"]).clone()),
            with_kwargs=True,
        )
    return records


def test_capsule_follows_the_papers_definition():
    """S_1 = p_1 + Mean(E); S_i = p_i + Mean(S'_{i-1} and H_{i-1}), masked, slot overwritten per layer."""
    model = BUILDERS["llama"](layers=3)
    capsule_model = capt.attach(model, capt.CapsuleConfig(init="normal", init_std=0.5))
    records = _record_layer_inputs(model, capsule_model)
    outputs_of = []
    for layer in spec_for(model).find_layers(model):
        layer.register_forward_hook(lambda _m, _a, out: outputs_of.append(out[0] if isinstance(out, tuple) else out))
    inputs = random_batch("llama", batch=2)
    prompt = (inputs["labels"] == -100) & inputs["attention_mask"].bool()
    with torch.no_grad():
        capsule_model(**inputs)
    vectors = capsule_model.capsules[0].vectors  # (L, 1, D)
    embeds = model.get_input_embeddings()(inputs["input_ids"])
    expected_first = vectors[0, 0] + (embeds * prompt[..., None]).sum(1) / prompt.sum(1, keepdim=True)
    torch.testing.assert_close(records[0][:, 0], expected_first)
    with_slot = torch.cat([torch.ones(2, 1, dtype=torch.bool), prompt], dim=1)  # (B, T+1)
    for i in (1, 2):
        previous = outputs_of[i - 1]
        mean = (previous * with_slot[..., None]).sum(1) / with_slot.sum(1, keepdim=True)
        torch.testing.assert_close(records[i][:, 0], vectors[i, 0] + mean)


def test_outputs_drop_the_slot_and_keep_the_output_type(kind):
    model = BUILDERS[kind]()
    inputs = random_batch(kind)
    with torch.no_grad():
        base_out = model(**inputs, output_hidden_states=True)
    capsule_model = capt.attach(model)
    with torch.no_grad():
        out = capsule_model(**inputs, output_hidden_states=True)
    assert type(out) is type(base_out)
    assert out.logits.shape == base_out.logits.shape
    for name in ("hidden_states", "encoder_hidden_states", "encoder_last_hidden_state"):
        if getattr(base_out, name, None) is not None:
            mine, theirs = getattr(out, name), getattr(base_out, name)
            shapes = [t.shape for t in mine] if isinstance(mine, tuple) else [mine.shape]
            ref = [t.shape for t in theirs] if isinstance(theirs, tuple) else [theirs.shape]
            assert shapes == ref, name


def test_unsupported_model_lists_supported_types():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=4, vocab_size=64))
    with pytest.raises(capt.UnsupportedModelError) as err:
        capt.attach(model)
    message = str(err.value)
    assert "gpt2" in message
    for model_type in ("t5", "llama", "qwen2", "mistral", "gemma", "bert"):
        assert model_type in message
