"""The base-model fingerprint, and its samples reused while a bank checks many capsules against one base."""

from __future__ import annotations

import torch
from tiny_models import BUILDERS

from capt import fingerprint as module
from capt.fingerprint import fingerprint, reused_samples


def test_reused_samples_give_the_same_fingerprint_and_are_taken_once(kind, monkeypatch):
    model = BUILDERS[kind](seed=0)
    alone = fingerprint(model)
    taken = []
    sample = module._sample
    monkeypatch.setattr(module, "_sample", lambda param: taken.append(param) or sample(param))
    with reused_samples():
        assert fingerprint(model) == alone
        assert fingerprint(model) == alone, "the second call reads the samples the first took"
    assert len(taken) == len(list(model.parameters())), "each weight sampled once in the block"
    assert fingerprint(BUILDERS[kind](seed=1)) != alone


def test_a_weight_changed_in_place_or_replaced_inside_the_block_changes_the_fingerprint():
    model = BUILDERS["bert"](seed=0)
    with reused_samples():
        before = fingerprint(model)
        weight = model.get_submodule("classifier").weight
        with torch.no_grad():
            weight.add_(1.0)  # the same tensor, its version counter moved
        changed = fingerprint(model)
        assert changed != before
        model.get_submodule("classifier").weight = torch.nn.Parameter(torch.zeros_like(weight))  # a new tensor
        replaced = fingerprint(model)
        assert replaced not in (before, changed)
    assert fingerprint(model) == replaced, "what the block gave is what a fresh fingerprint gives"
