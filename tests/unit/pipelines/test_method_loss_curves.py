"""Every method's learning dynamics: a seeded run of each method on each tiny model family it supports,
checked step by step against its stored loss curve (tests/data/method_loss_curves.json).

The run goes through the pipeline's own pieces (`pipelines.adapted.adapt` and `parameter_groups`, the
phase hook as `pipelines.training.loop` drives it) with AdamW on one fixed batch; the classifier head
of BERT is held still (lr 0) so that its curves show the method alone. The tolerance allows float noise
across platforms (BLAS builds, thread counts) and catches a change in a method: each method has a
test that changing one of its mechanisms moves the curve outside it. After a deliberate change of a
method, regenerate its curves (all of them without METHOD) and say why in the commit:

    PYTHONPATH=.:tests python tests/unit/pipelines/test_method_loss_curves.py [METHOD ...]
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from pipelines.config.schema import METHOD_NAMES

CURVES = Path(__file__).resolve().parents[2] / "data" / "method_loss_curves.json"
STEPS = 12
KINDS = ("t5", "llama", "bert")
LEARNING_RATES = {"full_finetune": 1e-3, "lora": 1e-2, "adapter": 1e-2}
"""AdamW learning rates; every other method (the prompt methods, CaPT) trains at `PROMPT_LR`."""
PROMPT_LR = 0.2
MODEL_CHANGES = {"t5": {"initializer_factor": 1.0}, "llama": {"initializer_range": 0.2},
                 "bert": {"initializer_range": 0.2}}
"""T5 at its default init; Llama and BERT at std 0.2, since the near-uniform outputs of their default 0.02
barely move when a prompt is trained."""
CURVE_OPTIONS = {"dept": {"embedding_lr": 1e-2}, "ept": {"embedding_lr": 1e-2}}
"""Options of the curves on top of the small ones: DePT's and EPT's low-rank update at a rate that moves
it within `STEPS` steps (at their default 5e-4 their curves are the prompt's alone)."""
RTOL, ATOL = 1e-3, 1e-4
"""Relative and absolute tolerance per step."""
MIN_DROP = 0.1
"""Every stored curve learns: its last loss is at least this much below its first."""

Change = dict[str, Any] | Callable[[torch.nn.Module], None]
CHANGES: dict[str, Change] = {
    "capt": {"fusion": "prepend"},
    "prompt_tuning": {"instance_token": True},
    "ptuning_v2": {"reparameterize": True, "reparam_hidden": 16},
    "lora": {"alpha": 8},
    "full_finetune": lambda adapted: _freeze_layer_norms(adapted),
    "adapter": {"activation": "relu"},
    "dept": {"alpha": 4.0},
    "residual_prompt": {"bottleneck": 8},
    "superpos_prompt": {"train_embeddings": False},
    "vfpt": {"fourier_fraction": 1.0},
    "smop": {"router_noise": 0.0},
    "ept": {"num_spaces": 1},
    "xprompt": {"token_prune_fraction": 0.5},
}
"""Per method, a change of one of its mechanisms (an option, or for full fine-tuning: frozen layer norms)."""


def _freeze_layer_norms(adapted: torch.nn.Module) -> None:
    for name, param in adapted.named_parameters():
        if "layer_norm" in name:
            param.requires_grad_(False)


def supported_kinds(method: str) -> list[str]:
    """The tiny model families of `KINDS` that `method` runs on (each kind is its model_type)."""
    from capt.methods import get_method

    return [kind for kind in KINDS if get_method(method).unsupported_reason(kind) is None]


def loss_curve(method: str, kind: str, change: Change | None = None) -> list[float]:
    """Training losses of `STEPS` AdamW steps of `method` (small options, plus `change`) on the seeded tiny
    model `kind` and one fixed batch; a method with phases begins each at its boundary step."""
    from helpers.methods import options
    from tiny_models import random_batch, tiny_model

    from pipelines.adapted import adapt, parameter_groups

    model = tiny_model(kind, seed=0, **MODEL_CHANGES[kind])
    torch.manual_seed(0)
    changed = change if isinstance(change, dict) else {}
    adapted = adapt(model, method, {**options(method), **CURVE_OPTIONS.get(method, {}), **changed})
    if callable(change):
        change(adapted)
    lr = LEARNING_RATES.get(method, PROMPT_LR)
    optimizer = torch.optim.AdamW(parameter_groups(adapted, model, lr, 0.0, 0.0))
    batch = random_batch(kind, batch=4, length=9, seed=1)
    boundaries = adapted.training_phases(STEPS)
    adapted.train()
    losses = []
    for step in range(1, STEPS + 1):
        loss = adapted(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
        if step in boundaries:  # as pipelines.training.loop.begin_phase_if_due does
            adapted.eval()
            adapted.begin_phase(boundaries.index(step) + 1, lambda: iter([adapted(**batch).loss]))
            adapted.train()
            optimizer.state.clear()
    return losses


def _stored() -> dict[str, list[float]]:
    return json.loads(CURVES.read_text())["curves"]


def _close(curve: list[float], reference: list[float]) -> bool:
    return torch.allclose(torch.tensor(curve), torch.tensor(reference), rtol=RTOL, atol=ATOL)


def test_every_method_has_a_stored_curve_that_learns():
    stored = _stored()
    assert set(stored) == {f"{method}/{kind}" for method in METHOD_NAMES for kind in supported_kinds(method)}
    for key, reference in stored.items():
        assert len(reference) == STEPS and reference[-1] < reference[0] - MIN_DROP, f"{key}: {reference}"


@pytest.mark.parametrize("method", METHOD_NAMES)
@pytest.mark.slow
def test_the_method_follows_its_stored_loss_curves(method: str):
    stored = _stored()
    for kind in supported_kinds(method):
        reference, curve = stored[f"{method}/{kind}"], loss_curve(method, kind)
        worst = max(abs(a - b) / abs(b) for a, b in zip(curve, reference, strict=True))
        assert _close(curve, reference), f"{method}/{kind} moved (worst relative change {worst:.2e}): {curve}"


@pytest.mark.parametrize("method", METHOD_NAMES)
@pytest.mark.slow
def test_a_change_in_the_method_leaves_the_tolerance(method: str):
    assert not _close(loss_curve(method, "t5", CHANGES[method]), _stored()[f"{method}/t5"])


def _regenerate(methods: list[str]) -> None:
    curves = _stored() if CURVES.is_file() else {}
    for method in methods:
        for kind in supported_kinds(method):
            curves[f"{method}/{kind}"] = loss_curve(method, kind)
            print(f"{method}/{kind}: {curves[f'{method}/{kind}'][0]:.4f} -> {curves[f'{method}/{kind}'][-1]:.4f}")
    record = {"what": f"tests/unit/pipelines/test_method_loss_curves.py: {STEPS} AdamW steps per method and tiny "
                      "model family (tests/tiny_models.py, seed 0), one fixed batch (random_batch(kind, 4, 9, seed=1))",
              "regenerate": "PYTHONPATH=.:tests python tests/unit/pipelines/test_method_loss_curves.py [METHOD ...]",
              "torch": torch.__version__, "curves": dict(sorted(curves.items()))}
    CURVES.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    _regenerate(sys.argv[1:] or list(METHOD_NAMES))
