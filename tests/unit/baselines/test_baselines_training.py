"""Every method on every tiny family: loss, gradient isolation, parameter count, loss decreases."""

from __future__ import annotations

import pytest
import torch

from capt.baselines import apply

from .baselines_helpers import KINDS, attention_layers, build, kv_width, random_batch, small_config

METHODS = ("prompt_tuning", "ptuning_v2", "lora", "full_finetune")
LEARNING_RATES = {"prompt_tuning": 0.1, "ptuning_v2": 0.05, "lora": 0.01, "full_finetune": 0.003}


def expected_count(method: str, model: torch.nn.Module, adapted) -> int:
    """The trainable-parameter formula of each method."""
    config = adapted.adapter_config
    if method == "prompt_tuning":
        return config.num_tokens * adapted.info.hidden_size
    if method == "ptuning_v2":
        return attention_layers(model) * 2 * config.num_tokens * kv_width(model)
    if method == "lora":
        return adapted.peft_model.get_nb_trainable_parameters()[0]
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.slow
def test_method_trains_only_its_parameters(kind: str, method: str) -> None:
    model = build(kind)
    adapted = apply(model, small_config(method))
    trainable = list(adapted.trainable_parameters())
    assert sum(p.numel() for p in trainable) == expected_count(method, model, adapted)
    assert all(p.requires_grad for p in trainable)

    batch = random_batch(kind)
    adapted.train()
    loss = adapted(**batch).loss
    assert torch.isfinite(loss)
    loss.backward()
    trainable_ids = {id(p) for p in trainable}
    for name, param in adapted.named_parameters():
        if id(param) in trainable_ids:
            continue
        assert param.grad is None, f"frozen parameter {name} received a gradient"
    assert all(p.grad is not None for p in trainable)
    assert sum(p.grad.abs().sum().item() for p in trainable) > 0

    optimizer = torch.optim.Adam(trainable, lr=LEARNING_RATES[method])
    optimizer.zero_grad()
    first = None
    for _ in range(30):
        loss = adapted(**batch).loss
        first = loss.item() if first is None else first
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    final = adapted(**batch).loss.item()
    assert final < first * 0.9, f"{method} on {kind}: loss {first:.4f} -> {final:.4f}"


def test_lora_count_matches_rank_formula() -> None:
    model = build("llama")
    adapted = apply(model, small_config("lora", r=2))
    attn = model.model.layers[0].self_attn
    per_layer = 2 * (attn.q_proj.in_features + attn.q_proj.out_features) + 2 * (
        attn.v_proj.in_features + attn.v_proj.out_features)
    assert adapted.num_trainable_parameters() == per_layer * model.config.num_hidden_layers


@pytest.mark.parametrize("kind", ["t5", "llama"])
def test_reparameterized_prefix_count_and_training(kind: str) -> None:
    model = build(kind)
    adapted = apply(model, small_config("ptuning_v2", reparameterize=True, reparam_hidden=16))
    d, width, tokens = adapted.info.hidden_size, kv_width(model), 3
    stacks = [model.config.num_layers, model.config.num_decoder_layers] if kind == "t5" else [2]
    expected = sum(tokens * d + d * 16 + 16 + 16 * layers * 2 * width + layers * 2 * width for layers in stacks)
    assert adapted.num_trainable_parameters() == expected
    batch = random_batch(kind)
    optimizer = torch.optim.Adam(adapted.trainable_parameters(), lr=0.01)
    first = adapted(**batch).loss.item()
    for _ in range(20):
        loss = adapted(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert adapted(**batch).loss.item() < first


@pytest.mark.parametrize("method", METHODS)
def test_detach_restores_base(method: str) -> None:
    model = build("t5")
    batch = random_batch("t5")
    flags = [p.requires_grad for p in model.parameters()]
    with torch.no_grad():
        before = model(**batch).logits
    adapted = apply(model, small_config(method))
    restored = adapted.detach()
    assert restored is model
    assert restored.config._attn_implementation == "sdpa"
    assert [p.requires_grad for p in restored.parameters()] == flags
    with torch.no_grad():
        torch.testing.assert_close(restored(**batch).logits, before)
    apply(restored, small_config(method))  # can be adapted again


def test_cannot_adapt_twice() -> None:
    model = build("llama")
    apply(model, small_config("prompt_tuning"))
    with pytest.raises(ValueError, match="already carries"):
        apply(model, small_config("ptuning_v2"))
