"""capt.packing: a packed batch routes each row to its member's capsule (and head); a member's gradient comes from
its own rows only, and equals the gradient it gets on its rows alone."""

from __future__ import annotations

import pytest
import torch
from tiny_models import BUILDERS, random_batch
from torch import nn

import capt
from capt.arch import spec_for
from capt.capsule import Capsule
from capt.errors import CaptError
from capt.packing import PackedCapsules, member_rows, merge_batches

CONFIGS = [capt.CapsuleConfig(init="normal", init_std=0.5), capt.CapsuleConfig(init="normal", layers="odd"),
           capt.CapsuleConfig(init="normal", init_std=0.5, fusion="project")]
READOUTS = ["capsule", "mean", "pooler"]
RTOL = 1e-4
"""Float noise between batch sizes: the test T5 (initializer_factor 10) has states and logits of large scale."""


LIKE_CONFIGS = [CONFIGS[0], CONFIGS[2], CONFIGS[0]]
"""Members 0 and 2 alike (one stacked group, as in most packs), member 1 of another fusion."""


def packed_model(kind: str, configs: list[capt.CapsuleConfig] = CONFIGS) -> PackedCapsules:
    """Three members of `configs`; for bert, heads of 2, 3 and 2 labels reading different readouts."""
    base = BUILDERS[kind]()
    spec, width = spec_for(base), spec_for(base).hidden_size(base)
    torch.manual_seed(7)
    capsules = [Capsule(c, c.resolve_layers(spec.num_layers(base)), width) for c in configs]
    if not spec.classifier_head:
        return PackedCapsules(base, capsules)
    heads = [nn.Linear(width, labels) for labels in (2, 3, 2)]
    return PackedCapsules(base, capsules, heads, READOUTS)


def loss(kind: str, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    if kind == "bert":
        return nn.functional.cross_entropy(logits, labels.clamp_max(logits.shape[1] - 1))
    return nn.functional.cross_entropy(logits.transpose(1, 2), labels.clamp_min(0))


@pytest.mark.parametrize("configs", [CONFIGS, LIKE_CONFIGS], ids=["unlike", "two-alike"])
@pytest.mark.parametrize("kind", ["t5", "llama", "bert"])
def test_each_members_gradient_equals_its_rows_alone(kind, configs, one_thread):
    # one thread: with two, the reduction order of a batch of 6 rows and of 2 differ, and the test T5's large-scale
    # states turn that into differences beyond RTOL (measured: 0.003 on logits of scale 1.6)
    model = packed_model(kind, configs)
    batch = random_batch(kind, batch=6)
    rows = torch.tensor([0, 1, 2, 1, 0, 2])
    logits = model.member_logits(batch, rows)
    sum(loss(kind, logits[m], batch["labels"][rows == m]) for m in range(3)).backward()
    packed = {m: {n: p.grad.clone() for n, p in model.member_parameters(m).items()} for m in range(3)}
    for m in range(3):
        model.zero_grad()
        own = rows == m
        alone = model.member_logits({k: v[own] for k, v in batch.items()}, rows[own])[m]
        torch.testing.assert_close(alone, logits[m], rtol=RTOL, atol=RTOL * logits[m].abs().max().item())
        loss(kind, alone, batch["labels"][own]).backward()
        for name, param in model.member_parameters(m).items():
            scale = param.grad.abs().max().item()
            torch.testing.assert_close(packed[m][name], param.grad, rtol=RTOL, atol=RTOL * scale)
    model.detach()


def test_a_member_view_answers_for_one_member():
    model = packed_model("bert")
    batch = random_batch("bert", batch=3)
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    view = model.member(1)
    with torch.no_grad():
        logits = view(**inputs).logits
        expected = model.member_logits(inputs, torch.ones(3, dtype=torch.long))[1]
    assert logits.shape == (3, 3) and torch.equal(logits, expected)
    model.detach()


def test_merged_batches_are_right_padded_and_rows_name_their_member():
    first = {"input_ids": torch.tensor([[5, 6, 7]]), "attention_mask": torch.ones(1, 3, dtype=torch.long),
             "labels": torch.tensor([[8, 1]])}
    second = {"input_ids": torch.tensor([[5], [9]]), "attention_mask": torch.ones(2, 1, dtype=torch.long),
              "labels": torch.tensor([[4, 4, 1], [4, 1, -100]])}
    merged, rows = merge_batches([first, second], pad_id=0)
    assert rows.tolist() == [0, 1, 1]
    assert merged["input_ids"].tolist() == [[5, 6, 7], [5, 0, 0], [9, 0, 0]]
    assert merged["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0], [1, 0, 0]]
    assert merged["labels"].tolist() == [[8, 1, -100], [4, 4, 1], [4, 1, -100]]
    with pytest.raises(CaptError, match="same keys"):
        merge_batches([first, {"input_ids": first["input_ids"]}], pad_id=0)


def test_heads_come_with_readouts():
    base = BUILDERS["bert"]()
    capsule = Capsule(CONFIGS[0], (0, 1), 32)
    with pytest.raises(CaptError, match="one head and one readout per capsule"):
        PackedCapsules(base, [capsule], [nn.Linear(32, 2)], None)


def test_member_rows_are_slices_when_contiguous_and_indices_otherwise():
    picks = member_rows(torch.tensor([0, 0, 2, 1, 2]), 4, torch.device("cpu"))
    assert picks[0] == slice(0, 2) and picks[1] == slice(3, 4) and picks[3] is None
    assert picks[2].tolist() == [2, 4]


def test_a_batch_of_one_members_rows_goes_through_its_own_capsule_alone():
    """Every row of one member: the capsule's own `fuse`, as a model with that capsule alone computes it."""
    model = packed_model("t5", LIKE_CONFIGS)
    batch = random_batch("t5", batch=3)
    with torch.no_grad():
        packed = model.member_logits(batch, torch.full((3,), 2))[2]
        alone = capt.CapsuleModel(model.detach(), [model.capsules[2]])(**batch).logits
    assert torch.equal(packed, alone)
