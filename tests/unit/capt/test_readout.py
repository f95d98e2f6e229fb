"""Encoder readouts (`capt.arch.readout`): what a BERT classifier's head reads, each one trainable and distinct."""

from __future__ import annotations

import pytest
import torch
from tiny_models import random_batch, tiny_model

import capt
from capt.arch.readout import (
    READOUTS,
    ReadoutError,
    install_readout,
    installed_readout,
    readout_vector,
    remove_readout,
)


def _train(readout: str, steps: int = 25) -> tuple[list[float], torch.Tensor]:
    model = tiny_model("bert")
    capsule_model = capt.attach(model)
    head = list(model.classifier.parameters())
    for param in head:
        param.requires_grad_(True)
    install_readout(model, readout, capsule_model.slot_span)
    batch = random_batch("bert", batch=6, length=9)
    labels = batch.pop("labels")
    optimizer = torch.optim.AdamW([*capsule_model.trainable_parameters(), *head], lr=1e-2)
    losses = []
    for _ in range(steps):
        loss = torch.nn.functional.cross_entropy(capsule_model(**batch).logits, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    with torch.no_grad():
        return losses, capsule_model(**batch).logits


def test_every_readout_trains_and_reads_something_different():
    results = {readout: _train(readout) for readout in READOUTS}
    for readout, (losses, _) in results.items():
        assert losses[-1] < 0.8 * losses[0], f"{readout}: the loss must fall, got {losses[0]:.3f} -> {losses[-1]:.3f}"
    for i, first in enumerate(READOUTS):
        for second in READOUTS[i + 1:]:
            assert not torch.allclose(results[first][1], results[second][1], atol=1e-3), (first, second)


def test_the_mean_ignores_padding_and_removing_a_readout_restores_the_pooler():
    model = tiny_model("bert")
    batch = random_batch("bert", batch=3, length=7)
    batch.pop("labels")
    with torch.no_grad():
        pooled = model(**batch).logits
        install_readout(model, "mean")
        assert installed_readout(model) == "mean"
        padded = model(**batch).logits[2]  # row 2 has two padding positions
        alone = model(input_ids=batch["input_ids"][2:, :5], attention_mask=batch["attention_mask"][2:, :5]).logits[0]
        remove_readout(model)
        assert torch.equal(model(**batch).logits, pooled) and installed_readout(model) == "pooler"
    assert torch.allclose(padded, alone, atol=1e-5)


def test_the_mean_leaves_out_inserted_positions_and_the_capsule_readout_reads_them():
    states = torch.arange(2 * 5 * 1, dtype=torch.float32).view(2, 5, 1)  # row 0: 0..4, row 1: 5..9
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]])
    means = [(0 + 2 + 3 + 4) / 4, (5 + 7 + 8) / 3]
    assert readout_vector("mean", states, mask, 1, 2).flatten().tolist() == pytest.approx(means)
    assert readout_vector("capsule", states, mask, 1, 2).flatten().tolist() == [1.0, 6.0]
    assert readout_vector("cls", states, mask, 1, 2).flatten().tolist() == [0.0, 5.0]


def test_bad_readouts_are_refused():
    model = tiny_model("bert")
    with pytest.raises(ReadoutError, match="readout='avg' is not a readout"):
        install_readout(model, "avg")
    with pytest.raises(ReadoutError, match="only CaPT has a capsule slot"):
        install_readout(model, "capsule", (1, 1))
    install_readout(model, "cls")
    with pytest.raises(ReadoutError, match="already has a readout"):
        install_readout(model, "mean")
    with pytest.raises(ReadoutError, match="no pooler output"):
        install_readout(tiny_model("t5"), "mean")
