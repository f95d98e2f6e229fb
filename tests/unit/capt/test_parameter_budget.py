"""Trainable capsule parameters at the real architectures' sizes, on the meta device (no weights)."""

from __future__ import annotations

import pytest

import capt
from benchmarks.models import build_meta, config_for

PAPER_MODELS = ("t5-base", "t5-large", "llama-3.2-1b", "qwen2.5-1.5b")
"""The paper's models, at their published shapes (`benchmarks.models.ARCHS`, the one copy)."""
# The checkpoints' public parameter counts.
PUBLIC_TOTALS = {"t5-base": 222_903_552, "t5-large": 737_668_096, "llama-3.2-1b": 1_235_814_400,
                 "qwen2.5-1.5b": 1_543_714_304}


def _meta_model(name: str):
    """The model on the meta device, with its layer count and hidden size (T5 maps these names to its own)."""
    config = config_for(name)
    return build_meta(config), config.num_hidden_layers, config.hidden_size


@pytest.mark.parametrize("name", PAPER_MODELS)
def test_capsule_budget_matches_the_paper(name):
    model, layers, hidden = _meta_model(name)
    total = sum(p.numel() for p in model.parameters())
    assert total == PUBLIC_TOTALS[name]
    capsule_model = capt.attach(model)
    trainable = sum(p.numel() for p in capsule_model.trainable_parameters())
    assert trainable == layers * hidden
    percent = 100 * trainable / total
    assert round(percent, 3) in (0.003, 0.004), f"{name}: {percent:.5f} %"
    if name == "t5-large":
        assert trainable == 24_576


@pytest.mark.parametrize("rank", [4, 64])
def test_low_rank_project_fusion_budget_on_t5_base(rank):
    model, layers, hidden = _meta_model("t5-base")
    capsule_model = capt.attach(model, capt.CapsuleConfig(fusion="project", project_rank=rank))
    trainable = sum(p.numel() for p in capsule_model.trainable_parameters())
    assert trainable == layers * hidden + layers * 2 * rank * hidden
    assert trainable == {4: 12 * 768 + 73_728, 64: 12 * 768 + 1_179_648}[rank]


def test_xprompt_budget_on_t5_base():
    from capt.baselines.xprompt.config import XPromptConfig
    from capt.methods import apply_method

    model, _, hidden = _meta_model("t5-base")
    adapted = apply_method(model, XPromptConfig())
    # XPrompt reports no T5-Base count (its tables use T5-Large/XL/XXL and give the pruned prompt per task). Trained:
    # the 100 x 768 prompt; its masks (100 + 100 x 16) are set by pruning, not trained.
    assert sum(p.numel() for p in adapted.trainable_parameters()) == 100 * hidden == 76_800
