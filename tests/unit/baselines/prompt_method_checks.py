"""Checks of SMoP and EPT that `soft_prompt_checks` cannot make as they stand: SMoP routes each row to one of its
prompts (a batch may leave a prompt unchosen at the first step) and routes a decoder-only input by its prompt tokens
only; EPT starts with zero-initialised branches (no gradient before their partners move)."""

from __future__ import annotations

from typing import Any

import torch

from capt.baselines import apply

from .baselines_helpers import build, fixed_ids, greedy_without_cache, perturb, random_batch


def trains_only_its_parameters(kind: str, config: Any, lr: float, steps: int = 30) -> None:
    """Loss falls under Adam; only the method's parameters receive gradients, and by the end every one of them."""
    model = build(kind)
    adapted = apply(model, config)
    trainable = list(adapted.trainable_parameters())
    batch = random_batch(kind)
    adapted.train()
    optimizer = torch.optim.Adam(trainable, lr=lr)
    first = adapted(**batch).loss.item()
    for _ in range(steps):
        optimizer.zero_grad()
        adapted(**batch).loss.backward()
        optimizer.step()
    assert all(p.grad is None for p in model.parameters())
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in trainable)
    final = adapted(**batch).loss.item()
    assert final < first * 0.9, f"{config.method} on {kind}: loss {first:.4f} -> {final:.4f}"


def cached_generate_equals_greedy_over_the_prompt(kind: str, config: Any) -> None:
    """Cached greedy generate equals uncached greedy decoding whose forward is told which tokens are the prompt."""
    adapted = apply(build(kind), config)
    perturb(adapted)
    adapted.eval()
    ids = fixed_ids(batch=3, length=5)
    generated = adapted.generate(ids, torch.ones_like(ids), max_new_tokens=6, do_sample=False, use_cache=True)
    assert torch.equal(generated, greedy_without_cache(adapted, kind, ids, 6, pass_prompt_mask=True))
