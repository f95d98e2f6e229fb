"""Residual Prompt Tuning: P' = LayerNorm(MLP(P)) + P while training; the artifact holds P' alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from capt.baselines import apply
from capt.baselines.io import META_NAME

from . import soft_prompt_checks as checks
from .baselines_helpers import GENERATIVE, build, small_config


def _count(config, hidden: int = 32) -> int:
    prompt, width = config.num_tokens * hidden, config.bottleneck
    return prompt + (hidden * width + width) + (width * hidden + hidden) + 2 * hidden


@pytest.mark.parametrize("kind", ["t5", "llama", "bert"])
def test_trains_only_the_prompt_and_its_mlp(kind: str) -> None:
    config = small_config("residual_prompt")
    checks.trains_only_its_parameters(kind, config, _count(config))


def test_prompt_is_layernorm_of_the_mlp_plus_the_prompt() -> None:
    adapted = apply(build("t5"), small_config("residual_prompt"))
    checks.perturb(adapted)
    mlp, prompt = adapted.mlp, adapted.prompt
    hidden = F.relu(prompt @ mlp.down.weight.T + mlp.down.bias) @ mlp.up.weight.T + mlp.up.bias
    expected = F.layer_norm(hidden, (32,), mlp.norm.weight, mlp.norm.bias) + prompt
    torch.testing.assert_close(adapted.current_prompt(), expected)
    assert not torch.allclose(adapted.current_prompt(), prompt)


@pytest.mark.parametrize("kind", ["t5", "llama", "bert"])
def test_artifact_holds_only_the_final_prompt_and_loads_without_mlp(kind: str, tmp_path: Path) -> None:
    config = small_config("residual_prompt")
    saved, loaded = checks.round_trip(kind, config, tmp_path / "artifact")
    meta = json.loads((tmp_path / "artifact" / META_NAME).read_text())
    assert meta["tensors"] == {"prompt": [config.num_tokens, 32]} and meta["config"]["merged"] is True
    assert loaded.mlp is None and set(loaded.adapter_parameters()) == {"prompt"}
    assert loaded.num_trainable_parameters() == config.num_tokens * 32 < saved.num_trainable_parameters()
    torch.testing.assert_close(loaded.prompt, saved.current_prompt(), rtol=0, atol=0)
    assert saved.mlp is not None and not saved.adapter_config.merged  # saving leaves the trained model as it was


def test_wrong_base_and_corrupt_files_are_refused(tmp_path: Path) -> None:
    checks.refuses_wrong_base_and_corrupt_files(small_config("residual_prompt"), tmp_path)


@pytest.mark.parametrize("kind", GENERATIVE)
def test_cached_generate_equals_uncached_greedy(kind: str) -> None:
    checks.cached_generate_is_greedy(kind, small_config("residual_prompt"))


def test_detach_restores_the_base_model() -> None:
    checks.detach_restores_base("t5", small_config("residual_prompt"))


def test_config_defaults_and_errors() -> None:
    from capt.baselines.residual_prompt.config import ResidualPromptConfig

    config = ResidualPromptConfig()
    assert (config.num_tokens, config.bottleneck, config.init, config.merged) == (10, 400, "vocab", False)
    with pytest.raises(ValueError, match="bottleneck") as error:
        ResidualPromptConfig(bottleneck=0, merged="yes")
    assert "merged" in str(error.value)
