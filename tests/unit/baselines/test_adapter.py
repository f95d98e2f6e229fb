"""Bottleneck adapters (Houlsby et al. 2019): start at the base model, train only their own parameters, reload
exactly, generate with the cache as without it, and detach without a trace."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from capt.baselines import AdapterError, apply, load_adapter
from capt.baselines.adapter.config import AdapterConfig
from capt.errors import ConfigError, MethodError

from .baselines_helpers import (
    build,
    fixed_ids,
    greedy_without_cache,
    logits,
    perturb,
    random_batch,
    small_config,
)

FAMILIES = ("t5", "llama", "bert")


def _expected_count(model: torch.nn.Module, config: AdapterConfig) -> int:
    """Adapters per sub-layer times 2 d m + m + d, plus every layer norm's weight (and bias) when they train."""
    d, m = model.config.hidden_size, config.bottleneck
    kind = model.config.model_type
    stacks = {"t5": {"attention": 4, "feed_forward": 4, "cross_attention": 2}}.get(
        kind, {"attention": 2, "feed_forward": 2})
    adapters = sum(stacks[s] for s in config.sublayers) * (2 * d * m + m + d)
    norms = {"t5": 12 * d, "llama": 5 * d, "bert": 5 * 2 * d}[kind]  # T5/Llama RMS norms: weight only
    return adapters + (norms if config.train_layer_norms else 0)


@pytest.mark.parametrize("kind", FAMILIES)
def test_training_starts_at_the_base_model(kind: str) -> None:
    model, batch = build(kind), random_batch(kind)
    before = logits(model, batch)
    exact = apply(model, small_config("adapter", sublayers=["attention", "feed_forward"], up_init="zero"))
    torch.testing.assert_close(logits(exact, batch), before, rtol=0, atol=0)
    exact.detach()
    near = apply(model, small_config("adapter"))  # Houlsby's near-identity start: both projections at std 1e-3
    assert not torch.equal(logits(near, batch), before)
    torch.testing.assert_close(logits(near, batch), before, rtol=0, atol=1e-3)


def test_both_projections_start_truncated_normal_at_std_1e_3() -> None:
    config = AdapterConfig(bottleneck=8)
    assert (config.init_std, config.up_init, config.activation) == (1e-3, "truncated_normal", "gelu_tanh")
    adapted = apply(build("t5"), config)
    for name in ("down", "up"):
        weights = torch.cat([getattr(a, name).weight.detach().flatten() for a in adapted.adapters.values()])
        biases = torch.cat([getattr(a, name).bias.detach() for a in adapted.adapters.values()])
        # N(0, 1e-3) cut at +-2 std: nothing beyond 2e-3, and the cut normal's std is 0.880 x 1e-3.
        assert weights.abs().max().item() <= 2e-3 and weights.numel() == 8 * 32 * 8
        assert 0.83e-3 < weights.std().item() < 0.93e-3
        assert torch.count_nonzero(biases) == 0


class _Doubling(torch.nn.Module):
    """Stands in for the residual dropout with a fixed "mask" (x 2), so the order of adapter and dropout shows."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return 2 * hidden


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (x + 0.044715 * x**3)))


@pytest.mark.parametrize("placement", ["after_dropout", "before_dropout"])
def test_bert_adapter_order_and_activation_match_the_equation(placement: str) -> None:
    model = build("bert")
    sub = model.bert.encoder.layer[0].attention.output  # BertSelfOutput: LayerNorm(dropout(dense(h)) + x)
    sub.dropout = _Doubling()
    adapted = apply(model, AdapterConfig(bottleneck=4, init_std=0.5, sublayers=["attention"], placement=placement))
    adapter = adapted.adapters["bert-encoder-layer-0-attention-output-dense"]
    seen = {}
    sub.register_forward_pre_hook(lambda module, args: seen.update(h=args[0], x=args[1]))
    sub.LayerNorm.register_forward_pre_hook(lambda module, args: seen.update(norm_input=args[0]))
    with torch.no_grad():
        adapted(**random_batch("bert"))
        dense = seen["h"] @ sub.dense.weight.t() + sub.dense.bias

        def branch(z: torch.Tensor) -> torch.Tensor:  # W_up f(W_down z + b_down) + b_up, f = GELU (tanh form)
            hidden = _gelu_tanh(z @ adapter.down.weight.t() + adapter.down.bias)
            return hidden @ adapter.up.weight.t() + adapter.up.bias

        if placement == "after_dropout":
            expected = 2 * dense + branch(2 * dense) + seen["x"]
        else:
            expected = 2 * (dense + branch(dense)) + seen["x"]
    torch.testing.assert_close(seen["norm_input"], expected, rtol=1e-5, atol=1e-5)


def test_t5_adapters_hook_the_layer_dropout_after_the_projection() -> None:
    model = build("t5")
    layer = model.encoder.block[0].layer[0]
    apply(model, small_config("adapter", sublayers=["attention"]))
    assert layer.dropout._forward_hooks and not layer.SelfAttention.o._forward_hooks
    before = build("t5")
    apply(before, small_config("adapter", sublayers=["attention"], placement="before_dropout"))
    assert before.encoder.block[0].layer[0].SelfAttention.o._forward_hooks


@pytest.mark.parametrize("train_layer_norms", [True, False])
@pytest.mark.parametrize("kind", FAMILIES)
def test_adapters_train_only_their_parameters(kind: str, train_layer_norms: bool) -> None:
    model = build(kind)
    config = small_config("adapter", train_layer_norms=train_layer_norms)
    adapted = apply(model, config)
    trainable = list(adapted.trainable_parameters())
    assert sum(p.numel() for p in trainable) == _expected_count(model, config)
    batch = random_batch(kind)
    adapted.train()
    optimizer = torch.optim.Adam(trainable, lr=1e-2)
    first = adapted(**batch).loss
    first.backward()
    ids = {id(p) for p in trainable}
    assert all(p.grad is None for p in adapted.parameters() if id(p) not in ids)
    assert any(p.grad.abs().sum() > 0 for p in trainable)
    for _ in range(30):
        optimizer.step()
        optimizer.zero_grad()
        adapted(**batch).loss.backward()
    final = adapted(**batch).loss.item()
    assert final < first.item() * 0.9, f"adapter on {kind}: loss {first.item():.4f} -> {final:.4f}"


def test_cross_attention_adapters_are_t5_decoder_only() -> None:
    model = build("t5")
    config = small_config("adapter", sublayers=["cross_attention"], train_layer_norms=False)
    adapted = apply(model, config)
    assert sorted(adapted.adapters) == [f"decoder-block-{i}-layer-1-EncDecAttention-o" for i in range(2)]
    assert adapted.num_trainable_parameters() == _expected_count(model, config)
    with pytest.raises(MethodError, match="cross_attention"):
        apply(build("llama"), config)


@pytest.mark.parametrize("kind", FAMILIES)
def test_round_trip_gives_identical_outputs_and_detach_restores_the_base(kind: str, tmp_path: Path) -> None:
    model, batch = build(kind), random_batch(kind)
    before = logits(model, batch)
    adapted = apply(model, small_config("adapter"))
    perturb(adapted, 0.3)
    expected = logits(adapted, batch)
    assert not torch.equal(expected, before)
    adapted.save_adapter(tmp_path / "artifact")
    loaded = load_adapter(build(kind), tmp_path / "artifact")
    torch.testing.assert_close(logits(loaded, batch), expected, rtol=0, atol=0)
    base = adapted.detach()
    assert all(not m._forward_hooks for m in base.modules())
    torch.testing.assert_close(logits(base, batch), before, rtol=0, atol=0)


def test_artifact_of_another_base_model_is_refused(tmp_path: Path) -> None:
    apply(build("llama"), small_config("adapter")).save_adapter(tmp_path)
    with pytest.raises(AdapterError, match="hidden_size: adapter has 32, model has 48"):
        load_adapter(build("llama", hidden=48), tmp_path)
    with pytest.raises(AdapterError, match="model_type: adapter has 'llama', model has 't5'"):
        load_adapter(build("t5"), tmp_path)


def test_corrupt_weights_are_refused(tmp_path: Path) -> None:
    apply(build("t5"), small_config("adapter")).save_adapter(tmp_path)
    (tmp_path / "adapter.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(AdapterError, match="not a readable safetensors file"):
        load_adapter(build("t5"), tmp_path)


@pytest.mark.parametrize(("kind", "sublayers"), [
    ("t5", ["attention", "feed_forward"]), ("t5", ["attention", "cross_attention", "feed_forward"]),
    ("llama", ["attention", "feed_forward"])])
def test_cached_generate_equals_uncached_greedy(kind: str, sublayers: list[str]) -> None:
    adapted = apply(build(kind), small_config("adapter", sublayers=sublayers))
    perturb(adapted, 0.3)
    ids = fixed_ids(batch=3, length=5)
    generated = adapted.generate(ids, torch.ones_like(ids), max_new_tokens=6, do_sample=False, use_cache=True)
    assert torch.equal(generated, greedy_without_cache(adapted, kind, ids, 6))


def test_bad_options_are_named() -> None:
    with pytest.raises(ConfigError) as error:
        AdapterConfig(bottleneck=0, activation="swish", sublayers=["ffn"], train_layer_norms="yes", init_std=-1,
                      placement="inside", up_init="ones")
    message = str(error.value)
    for key in ("bottleneck", "activation", "sublayers", "train_layer_norms", "init_std", "placement", "up_init"):
        assert key in message
