"""Checks every soft-prompt method passes (SMoP, EPT): training, artifact round trip, errors, generation, detach."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from capt.baselines import AdapterError, apply, load_adapter
from capt.baselines.io import WEIGHTS_NAME

from .baselines_helpers import build, fixed_ids, greedy_without_cache, random_batch

STEPS = 6


def perturb(adapted: Any, scale: float = 0.3) -> None:
    """Move every adapter tensor away from its initial value (zero-initialised ones included)."""
    with torch.no_grad():
        for param in adapted.trainable_parameters():
            param.add_(torch.randn_like(param) * scale)


def trains_only_its_parameters(kind: str, config: Any, lr: float, steps: int = 30) -> None:
    """Loss falls under Adam; only the method's parameters receive gradients, and every one of them does."""
    model = build(kind)
    adapted = apply(model, config)
    trainable = list(adapted.trainable_parameters())
    trainable_ids = {id(p) for p in trainable}
    batch = random_batch(kind)
    adapted.train()
    optimizer = torch.optim.Adam(trainable, lr=lr)
    first = adapted(**batch).loss.item()
    for _ in range(steps):
        optimizer.zero_grad()
        adapted(**batch).loss.backward()
        optimizer.step()
    frozen_with_grad = [n for n, p in adapted.named_parameters() if id(p) not in trainable_ids and p.grad is not None]
    assert frozen_with_grad == []
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in trainable)
    final = adapted(**batch).loss.item()
    assert final < first * 0.9, f"{config.method} on {kind}: loss {first:.4f} -> {final:.4f}"


def round_trip_is_exact(kind: str, config: Any, tmp_path: Path) -> None:
    """save -> load on a fresh copy of the base model gives identical outputs."""
    adapted = apply(build(kind), config)
    perturb(adapted)
    adapted.eval()
    batch = random_batch(kind)
    with torch.no_grad():
        expected = adapted(**batch).logits
    adapted.save(tmp_path / "artifact")
    loaded = type(adapted).load(build(kind), tmp_path / "artifact")
    assert loaded.adapter_config == config
    with torch.no_grad():
        torch.testing.assert_close(loaded(**batch).logits, expected, rtol=0, atol=0)


def wrong_base_and_corrupt_file_are_refused(config: Any, tmp_path: Path) -> None:
    """A base model of another width, or a corrupt weights file, gives the clear AdapterError."""
    saved = apply(build("llama"), config).save(tmp_path / "artifact")
    with pytest.raises(AdapterError, match="hidden_size: adapter has 32, model has 48"):
        load_adapter(build("llama", hidden=48), saved)
    (saved / WEIGHTS_NAME).write_bytes(b"\x80\x04 not a safetensors file at all")
    with pytest.raises(AdapterError, match="not a readable safetensors file"):
        load_adapter(build("llama"), saved)


def cached_generate_equals_uncached_greedy(kind: str, config: Any) -> None:
    """Cached greedy generate equals re-running the wrapper's forward on the whole sequence each step."""
    adapted = apply(build(kind), config)
    perturb(adapted)
    adapted.eval()
    ids = fixed_ids(batch=3, length=5)
    generated = adapted.generate(ids, torch.ones_like(ids), max_new_tokens=STEPS, do_sample=False, use_cache=True)
    assert torch.equal(generated, greedy_without_cache(adapted, kind, ids, STEPS, pass_prompt_mask=True))


def detach_restores_the_base(kind: str, config: Any) -> None:
    """detach() hands back the base model with its outputs and requires_grad flags as before apply."""
    model = build(kind)
    batch = random_batch(kind)
    flags = [p.requires_grad for p in model.parameters()]
    with torch.no_grad():
        before = model(**batch).logits
    adapted = apply(model, config)
    perturb(adapted)
    with torch.no_grad():
        assert not torch.equal(adapted(**batch).logits, before)
    restored = adapted.detach()
    assert restored is model and [p.requires_grad for p in restored.parameters()] == flags
    with torch.no_grad():
        torch.testing.assert_close(restored(**batch).logits, before, rtol=0, atol=0)
