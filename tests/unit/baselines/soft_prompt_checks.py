"""Checks every reparameterised soft prompt (residual_prompt, superpos_prompt, vfpt) must pass, each method's
test module calling them with its own config: training, artifact round trip and errors, generation, detach."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from capt.baselines import AdapterError, apply, load_adapter
from capt.baselines.io import META_NAME, WEIGHTS_NAME

from .baselines_helpers import build, fixed_ids, greedy_without_cache, perturb, random_batch

TRAIN_STEPS = 8


def trains_only_its_parameters(kind: str, config: Any, expected_count: int, lr: float = 0.05) -> None:
    """The method's parameters number `expected_count`, get gradients (the base's do not), and the loss falls."""
    model = build(kind)
    adapted = apply(model, config)
    trainable = list(adapted.trainable_parameters())
    assert sum(p.numel() for p in trainable) == expected_count
    batch = random_batch(kind)
    adapted.train()
    optimizer = torch.optim.AdamW(trainable, lr=lr, weight_decay=0.0)
    first = adapted(**batch).loss
    first.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in trainable)
    assert all(p.grad is None for p in model.parameters())
    optimizer.step()
    optimizer.zero_grad()
    for _ in range(TRAIN_STEPS - 1):
        adapted(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert adapted(**batch).loss.item() < first.item() - 0.05


def round_trip(kind: str, config: Any, directory: Path) -> tuple[Any, Any]:
    """Save a perturbed adapter, load it on a fresh copy of the base: identical logits; (saved, loaded)."""
    adapted = apply(build(kind), config)
    perturb(adapted)
    batch = random_batch(kind)
    with torch.no_grad():
        expected = adapted(**batch).logits
    adapted.save_adapter(directory)
    loaded = load_adapter(build(kind), directory)
    assert loaded.method == config.method and type(loaded) is type(adapted)
    with torch.no_grad():
        torch.testing.assert_close(loaded(**batch).logits, expected, rtol=0, atol=0)
    return adapted, loaded


def refuses_wrong_base_and_corrupt_files(config: Any, tmp_path: Path) -> None:
    """A narrower base model and a damaged weights file both give a clear AdapterError."""
    directory = apply(build("llama"), config).save_adapter(tmp_path / "artifact")
    with pytest.raises(AdapterError, match="hidden_size"):
        load_adapter(build("llama", hidden=48), directory)
    with pytest.raises(AdapterError, match="method="):
        meta = json.loads((directory / META_NAME).read_text())
        (tmp_path / "other").mkdir()
        (tmp_path / "other" / META_NAME).write_text(json.dumps({**meta, "method": "no_such_method"}))
        (tmp_path / "other" / WEIGHTS_NAME).write_bytes((directory / WEIGHTS_NAME).read_bytes())
        load_adapter(build("llama"), tmp_path / "other")
    (directory / WEIGHTS_NAME).write_bytes(b"not a safetensors file")
    with pytest.raises(AdapterError, match="safetensors"):
        load_adapter(build("llama"), directory)


def cached_generate_is_greedy(kind: str, config: Any) -> None:
    """`generate` with the KV cache equals greedy decoding through the wrapper's forward without a cache."""
    adapted = apply(build(kind), config)
    perturb(adapted)
    ids = fixed_ids(batch=3, length=5)
    generated = adapted.generate(ids, torch.ones_like(ids), max_new_tokens=6, do_sample=False, use_cache=True)
    assert torch.equal(generated, greedy_without_cache(adapted, kind, ids, 6))


def detach_restores_base(kind: str, config: Any) -> None:
    """`detach()` hands back the base model with its outputs (train mode too, dropout included) as before."""
    model = build(kind)
    batch = random_batch(kind)
    with torch.no_grad():
        before = model(**batch).logits
    adapted = apply(model, config)
    with torch.no_grad():
        assert not torch.equal(adapted(**batch).logits[:, -1], before[:, -1])
    assert adapted.detach() is model
    with torch.no_grad():
        torch.testing.assert_close(model(**batch).logits, before, rtol=0, atol=0)
    assert all(p.requires_grad for p in model.parameters())
