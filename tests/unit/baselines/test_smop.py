"""SMoP: k short prompts, a linear router picking one per input row (top-1, scaled by its probability)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from capt.baselines import apply
from capt.baselines.smop.config import SMoPConfig
from capt.capsule import masked_mean

from . import prompt_method_checks as checks
from . import soft_prompt_checks as shared
from .baselines_helpers import build, fixed_ids, small_config

CONFIG = small_config("smop")


@pytest.mark.parametrize("kind", ["t5", "llama", "bert"])
@pytest.mark.slow
def test_trains_only_its_parameters(kind: str) -> None:
    checks.trains_only_its_parameters(kind, CONFIG, lr=0.1)


@pytest.mark.parametrize("kind", ["t5", "llama", "bert"])
def test_parameter_count_is_prompts_plus_router(kind: str) -> None:
    adapted = apply(build(kind), CONFIG)
    d, k, n = adapted.info.hidden_size, CONFIG.num_prompts, CONFIG.num_tokens
    assert adapted.num_trainable_parameters() == k * n * d + k * d == 3 * 3 * 32 + 3 * 32
    assert adapted.added_positions == n


@pytest.mark.parametrize("kind", ["t5", "llama", "bert"])
def test_round_trip_is_exact(kind: str, tmp_path: Path) -> None:
    saved, loaded = shared.round_trip(kind, CONFIG, tmp_path / "artifact")
    assert loaded.adapter_config == saved.adapter_config and not loaded.training  # routes without perturbation


def test_wrong_base_and_corrupt_file_are_refused(tmp_path: Path) -> None:
    shared.refuses_wrong_base_and_corrupt_files(CONFIG, tmp_path)


@pytest.mark.parametrize("kind", ["t5", "llama"])
@pytest.mark.parametrize("instance_token", [False, True])
def test_cached_generate_equals_uncached_greedy(kind: str, instance_token: bool) -> None:
    checks.cached_generate_equals_greedy_over_the_prompt(kind, small_config("smop", instance_token=instance_token))


@pytest.mark.parametrize("kind", ["t5", "llama", "bert"])
def test_detach_restores_the_base(kind: str) -> None:
    shared.detach_restores_base(kind, CONFIG)


def _routed_apart(kind: str):
    """An SMoP model whose router sends the rows of `fixed_ids(6)` to at least two different prompts."""
    adapted = apply(build(kind), CONFIG)
    adapted.eval()
    ids = fixed_ids(batch=6, length=5)
    pooled = masked_mean(adapted.embed(ids), torch.ones_like(ids))
    with torch.no_grad():
        adapted.router.copy_(pooled[:3] * 20)  # prompt j's logit is large for inputs like row j
    return adapted, ids


def test_each_row_gets_its_top_prompt_scaled_by_its_probability() -> None:
    adapted, ids = _routed_apart("t5")
    mask = torch.ones_like(ids)
    with torch.no_grad():
        probs = adapted.routing_probabilities(adapted.embed(ids), mask)
        embeds, _ = adapted.extend_inputs(ids, mask)
    weight, index = probs.max(dim=-1)
    assert len(set(index.tolist())) >= 2, "the constructed router must route rows apart"
    expected = adapted.prompt[index] * weight[:, None, None]
    torch.testing.assert_close(embeds[:, : CONFIG.num_tokens], expected)
    torch.testing.assert_close(embeds[:, CONFIG.num_tokens:], adapted.embed(ids))


@pytest.mark.parametrize("kind", ["t5", "llama"])
def test_a_row_is_routed_the_same_alone_or_in_a_batch(kind: str) -> None:
    adapted, ids = _routed_apart(kind)
    extra = {"decoder_input_ids": ids[:, :2]} if kind == "t5" else {}
    with torch.no_grad():
        together = adapted(input_ids=ids, attention_mask=torch.ones_like(ids), **extra).logits
        for row in range(ids.shape[0]):
            one = {key: value[row : row + 1] for key, value in extra.items()}
            alone = adapted(input_ids=ids[row : row + 1], attention_mask=torch.ones_like(ids[row : row + 1]), **one)
            torch.testing.assert_close(alone.logits, together[row : row + 1], rtol=1e-5, atol=1e-5)


def test_router_is_perturbed_in_training_only() -> None:
    ids = fixed_ids(batch=4, length=5)
    mask = torch.ones_like(ids)

    def probabilities(adapted, train: bool) -> torch.Tensor:
        adapted.train(train)
        with torch.no_grad():
            return adapted.routing_probabilities(adapted.embed(ids), mask)

    adapted = apply(build("llama"), CONFIG)
    torch.manual_seed(0)
    assert torch.equal(probabilities(adapted, False), probabilities(adapted, False))
    assert not torch.equal(probabilities(adapted, True), probabilities(adapted, True))
    still = apply(build("llama"), small_config("smop", router_noise=0.0))
    assert torch.equal(probabilities(still, True), probabilities(still, False))


def test_bad_options_are_named() -> None:
    with pytest.raises(ValueError, match=r"num_prompts.*integer >= 1"):
        SMoPConfig(num_prompts=0)
    with pytest.raises(ValueError, match=r"router_noise.*finite number >= 0"):
        SMoPConfig(router_noise=-1.0)
    with pytest.raises(ValueError, match="experts"):
        SMoPConfig.from_dict({"experts": 4})


def test_prompts_start_from_the_authors_unit_normal() -> None:
    # The released code keeps nn.Embedding's N(0, 1): 3 prompts x 40 tokens x 32 = 3,840 draws; the sample std
    # and mean sit within 5 standard errors (1/sqrt(2 x 3840) = 0.011 and 1/sqrt(3840) = 0.016) of 1 and 0.
    assert SMoPConfig().init_std == 1.0
    adapted = apply(build("t5"), SMoPConfig(num_prompts=3, num_tokens=40))
    assert abs(adapted.prompt.detach().std().item() - 1.0) < 0.06
    assert abs(adapted.prompt.detach().mean().item()) < 0.08


def _hand_routed(adapted, ids: torch.Tensor) -> tuple[list[int], list[float]]:
    """Each row's top-1 prompt and its probability, computed row by row from SMoP's equations."""
    chosen, probs = [], []
    for row in ids:
        mean = adapted.embed(row).sum(dim=0) / row.numel()  # every position is real here
        logits = [float(torch.dot(adapted.router[j], mean)) for j in range(adapted.router.shape[0])]
        top = max(range(len(logits)), key=logits.__getitem__)
        total = sum(torch.tensor(v - logits[top]).exp().item() for v in logits)
        chosen.append(top)
        probs.append(1.0 / total)
    return chosen, probs


@pytest.mark.parametrize("routing", ["per_input", "batch_broadcast"])
def test_both_routings_match_a_per_row_hand_computation(routing: str) -> None:
    apart, ids = _routed_apart("t5")
    adapted = apply(build("t5"), small_config("smop", routing=routing)).eval()
    with torch.no_grad():
        adapted.router.copy_(apart.router)  # the same rows go to at least two different prompts
        embeds, _ = adapted.extend_inputs(ids, torch.ones_like(ids))
        chosen, probs = _hand_routed(adapted, ids)
    assert len(set(chosen)) >= 2
    batch_sum = sum(adapted.prompt[j] for j in chosen)
    for row, (j, p) in enumerate(zip(chosen, probs, strict=True)):
        expected = p * (adapted.prompt[j] if routing == "per_input" else batch_sum)
        torch.testing.assert_close(embeds[row, : CONFIG.num_tokens], expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="routing"):
        SMoPConfig(routing="per_batch")
