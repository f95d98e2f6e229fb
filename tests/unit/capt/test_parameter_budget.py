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


def _baseline_count_on_t5_base(method: str) -> int:
    from capt.methods import METHODS, apply_method

    model, _, _ = _meta_model("t5-base")
    return sum(p.numel() for p in apply_method(model, METHODS[method].build_config({})).trainable_parameters())


def test_smop_budget_on_t5_base():
    # SMoP (Choi et al. 2023), its default 4 prompts x 5 tokens: 4*5*768 prompt + 4*768 router. The paper states no
    # count we could read; it is about a quarter of 100-token prompt tuning's 76,800.
    assert _baseline_count_on_t5_base("smop") == 4 * 5 * 768 + 4 * 768 == 18_432


def test_ept_budget_on_t5_base():
    # EPT (Lan et al. 2025) at this module's defaults (l=60, r=30, s=256, 4 subspaces of rank 4): the paper's own
    # count could not be read here. 60*768 + 256*30 + 30*768 (DePT's 76,800) + 4*2*768*4 + 4*768.
    assert _baseline_count_on_t5_base("ept") == 76_800 + 4 * 2 * 768 * 4 + 4 * 768 == 104_448
