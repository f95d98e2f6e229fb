"""EPT: a short prompt fused with a low-rank input-embedding update and reweighted over gated subspaces."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from capt.baselines import apply
from capt.baselines.ept.config import EPTConfig

from . import prompt_method_checks as checks
from . import soft_prompt_checks as shared
from .baselines_helpers import build, random_batch, small_config

CONFIG = small_config("ept")


@pytest.mark.parametrize("kind", ["t5", "llama", "bert"])
@pytest.mark.slow
def test_trains_only_its_parameters(kind: str) -> None:
    checks.trains_only_its_parameters(kind, CONFIG, lr=0.05)


@pytest.mark.parametrize("kind", ["t5", "llama", "bert"])
def test_parameter_count_matches_the_formula(kind: str) -> None:
    adapted = apply(build(kind), CONFIG)
    d, c = adapted.info.hidden_size, CONFIG
    expected = (c.num_tokens * d + c.max_length * c.rank + c.rank * d
                + c.num_spaces * 2 * d * c.space_rank + c.num_spaces * d)
    assert adapted.num_trainable_parameters() == expected == 96 + 32 + 64 + 256 + 64
    assert adapted.added_positions == c.num_tokens


@pytest.mark.parametrize("kind", ["t5", "llama", "bert"])
def test_round_trip_is_exact(kind: str, tmp_path: Path) -> None:
    shared.round_trip(kind, CONFIG, tmp_path / "artifact")


def test_wrong_base_and_corrupt_file_are_refused(tmp_path: Path) -> None:
    shared.refuses_wrong_base_and_corrupt_files(CONFIG, tmp_path)


@pytest.mark.parametrize("kind", ["t5", "llama"])
def test_cached_generate_equals_uncached_greedy(kind: str) -> None:
    shared.cached_generate_is_greedy(kind, CONFIG)


@pytest.mark.parametrize("kind", ["t5", "llama", "bert"])
def test_detach_restores_the_base(kind: str) -> None:
    shared.detach_restores_base(kind, CONFIG)


@pytest.mark.parametrize("kind", ["t5", "llama", "bert"])
def test_starts_as_prompt_tuning_with_its_short_prompt(kind: str) -> None:
    ept = apply(build(kind), CONFIG)
    plain = apply(build(kind), small_config("prompt_tuning", num_tokens=CONFIG.num_tokens))
    with torch.no_grad():
        plain.prompt.copy_(ept.prompt)
        batch = random_batch(kind)
        torch.testing.assert_close(ept(**batch).logits, plain(**batch).logits, rtol=0, atol=0)


def test_reconstructed_prompt_follows_fusion_then_gated_projection() -> None:
    adapted = apply(build("t5"), CONFIG)
    shared.perturb(adapted)
    with torch.no_grad():
        update = adapted.embedding_a @ adapted.embedding_b * CONFIG.alpha / math.sqrt(CONFIG.rank)
        short = adapted.prompt
        fused = short + torch.softmax(short @ update.t() / math.sqrt(short.shape[1]), dim=-1) @ update
        gates = torch.softmax(adapted.gate @ fused.mean(dim=0), dim=-1)
        expected = fused + sum(gates[i] * fused @ adapted.space_down[i] @ adapted.space_up[i]
                               for i in range(CONFIG.num_spaces))
        torch.testing.assert_close(adapted.current_prompt(), expected)
        assert not torch.allclose(expected, short, atol=1e-3)


def test_low_rank_matrices_train_at_the_embedding_lr_and_the_rest_at_the_jobs() -> None:
    adapted = apply(build("t5"), small_config("ept", embedding_lr=1e-3))
    (own, own_lr), (low_rank, low_rank_lr) = adapted.parameter_groups()
    assert own_lr is None and low_rank_lr == 1e-3
    assert [id(p) for p in low_rank] == [id(adapted.embedding_a), id(adapted.embedding_b)]
    assert {id(p) for p in own + low_rank} == {id(p) for p in adapted.trainable_parameters()}
    assert len(own) + len(low_rank) == len(list(adapted.trainable_parameters()))


def test_bad_options_are_named() -> None:
    with pytest.raises(ValueError, match=r"rank.*integer >= 1") as error:
        EPTConfig(rank=0, num_spaces=-1)
    assert "num_spaces" in str(error.value)
