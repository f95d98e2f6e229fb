"""A seeded tiny-T5 CaPT run checked step by step against its stored loss curve (tests/data/).

The tolerance allows float noise across platforms (BLAS builds, thread counts, CPU or GPU) and catches a
change in the method: another fusion, init, layer choice or slot handling moves the curve far outside it.
After a deliberate change of the method, regenerate the curve and say why in the commit:

    PYTHONPATH=. python tests/unit/capt/test_loss_curve.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

import capt

CURVE = Path(__file__).resolve().parents[2] / "data" / "tiny_t5_capt_loss_curve.json"
STEPS = 25
LR = 0.2
RTOL, ATOL = 1e-3, 1e-4
"""Relative and absolute tolerance per step (float noise measured here: below 1e-6 relative)."""


def loss_curve(config: capt.CapsuleConfig | None = None, device: str = "cpu") -> list[float]:
    """Training losses of `STEPS` AdamW steps of a capsule on the seeded tiny T5 and one fixed batch."""
    from tiny_models import random_batch, tiny_model

    model = tiny_model("t5", seed=0, initializer_factor=1.0).to(device)  # the default init: losses near ln(vocab)
    capsule_model = capt.attach(model, config or capt.CapsuleConfig())
    optimizer = torch.optim.AdamW(capsule_model.trainable_parameters(), lr=LR, weight_decay=0.0)
    batch = {key: value.to(device) for key, value in random_batch("t5", batch=4, length=9, seed=1).items()}
    losses = []
    for _ in range(STEPS):
        loss = capsule_model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def _stored() -> list[float]:
    return json.loads(CURVE.read_text())["losses"]


def _close(curve: list[float], reference: list[float]) -> bool:
    return torch.allclose(torch.tensor(curve), torch.tensor(reference), rtol=RTOL, atol=ATOL)


def test_the_tiny_t5_capt_run_follows_its_stored_loss_curve():
    reference = _stored()
    assert len(reference) == STEPS and reference[-1] < reference[0] - 0.1  # the stored run learns
    curve = loss_curve()
    worst = max(abs(a - b) / abs(b) for a, b in zip(curve, reference, strict=True))
    assert _close(curve, reference), f"loss curve moved (worst relative change {worst:.2e}): {curve}"


@pytest.mark.parametrize("change", [dict(layers="first_half"), dict(init="normal"), dict(fusion="prepend")],
                         ids=["layers", "init", "fusion"])
def test_a_change_in_the_method_leaves_the_tolerance(change):
    torch.manual_seed(0)
    assert not _close(loss_curve(capt.CapsuleConfig(**change)), _stored())


@pytest.mark.gpu
def test_the_stored_curve_holds_on_a_gpu():
    assert _close(loss_curve(device="cuda"), _stored())


if __name__ == "__main__":
    sys.path.insert(0, str(CURVE.parents[1]))  # tests/, for tiny_models
    record = {"what": "tiny T5 (tests/tiny_models.py, seed 0, initializer_factor 1) + CapsuleConfig() defaults, "
                      "AdamW lr "
                      f"{LR}, one fixed batch (random_batch('t5', 4, 9, seed=1)), {STEPS} steps",
              "regenerate": "PYTHONPATH=. python tests/unit/capt/test_loss_curve.py",
              "torch": torch.__version__, "losses": loss_curve()}
    CURVE.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {CURVE}: {record['losses'][0]:.4f} -> {record['losses'][-1]:.4f}")
