"""XPrompt: masked prompt, pruning by importance, artifact with masks, cached generation, detach."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from capt.baselines import AdapterError, apply, load_adapter
from capt.baselines.io import WEIGHTS_NAME
from capt.baselines.xprompt.config import XPromptConfig
from capt.errors import ConfigError, MethodError

from .baselines_helpers import build, fixed_ids, greedy_without_cache, random_batch, small_config

TOKENS, PIECES, WIDTH = 4, 4, 32
"""`small_config("xprompt")` on the tiny models (width 32)."""


def _losses(adapted, batch):
    def batch_losses():
        while True:
            yield adapted(**batch).loss
    return batch_losses


def _pruned(kind: str):
    adapted = apply(build(kind), small_config("xprompt"))
    adapted.begin_phase(1, _losses(adapted, random_batch(kind)))
    return adapted


@pytest.mark.parametrize("kind", ["t5", "llama", "bert"])
@pytest.mark.slow
def test_trains_only_its_prompt_and_the_loss_falls_under_the_masks(kind: str) -> None:
    adapted = _pruned(kind)
    trainable = list(adapted.trainable_parameters())
    assert trainable == [adapted.prompt] and adapted.prompt.numel() == TOKENS * WIDTH
    batch = random_batch(kind)
    optimizer = torch.optim.Adam(trainable, lr=0.1)
    first = adapted(**batch).loss.item()
    for _ in range(20):
        adapted(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    adapted(**batch).loss.backward()
    assert adapted(**batch).loss.item() < first
    for name, param in adapted.named_parameters():
        assert param is adapted.prompt or param.grad is None, f"{name} received a gradient"
    pruned = adapted.current_prompt() == 0
    assert torch.all(adapted.prompt.grad[pruned] == 0) and adapted.prompt.grad[~pruned].abs().sum() > 0


@pytest.mark.parametrize("kind", ["t5", "llama", "bert"])
def test_pruning_removes_the_configured_fractions(kind: str) -> None:
    adapted = _pruned(kind)
    assert adapted.surviving_tokens == TOKENS // 2
    assert adapted.surviving_pieces == round(0.75 * (TOKENS // 2) * PIECES)
    assert adapted.surviving_parameters == adapted.surviving_pieces * WIDTH // PIECES
    dropped = adapted.token_mask == 0
    assert torch.all(adapted.current_prompt()[dropped] == 0) and torch.all(adapted.prompt[dropped] != 0)


def _finite_difference_scores(adapted, batch, epsilon: float = 1e-2) -> torch.Tensor:
    """|dL/d gamma_i| by central differences: the first-order importance the paper defines."""
    scores = []
    with torch.no_grad():
        for index in range(TOKENS):
            losses = []
            for sign in (1, -1):
                adapted.token_mask[index] = 1 + sign * epsilon
                losses.append(adapted(**batch).loss.item())
            adapted.token_mask[index] = 1.0
            scores.append(abs(losses[0] - losses[1]) / (2 * epsilon))
    return torch.tensor(scores)


def test_token_pruning_drops_the_tokens_with_the_smallest_loss_gradient() -> None:
    adapted = apply(build("llama"), small_config("xprompt", piece_prune_fraction=0.0))
    batch = random_batch("llama")
    expected = _finite_difference_scores(adapted, batch)
    scores = adapted._importance(adapted.token_mask, _losses(adapted, batch))
    torch.testing.assert_close(scores.double(), expected.double(), rtol=2e-2, atol=2e-4)
    adapted.begin_phase(1, _losses(adapted, batch))
    dropped = sorted(torch.argsort(expected)[:TOKENS // 2].tolist())
    assert torch.nonzero(adapted.token_mask == 0).flatten().tolist() == dropped
    assert adapted.surviving_pieces == (TOKENS // 2) * PIECES


@pytest.mark.parametrize("kind", ["t5", "llama", "bert"])
def test_round_trip_keeps_the_pruned_prompt(kind: str, tmp_path: Path) -> None:
    adapted = _pruned(kind)
    batch = random_batch(kind)
    with torch.no_grad():
        expected = adapted(**batch).logits
    adapted.save_adapter(tmp_path / "artifact")
    loaded = load_adapter(build(kind), tmp_path / "artifact")
    assert torch.equal(loaded.token_mask, adapted.token_mask) and torch.equal(loaded.piece_mask, adapted.piece_mask)
    with torch.no_grad():
        torch.testing.assert_close(loaded(**batch).logits, expected, rtol=0, atol=0)
        unpruned = apply(loaded.detach(), small_config("xprompt"))
        unpruned.load_adapter_state_dict({"prompt": adapted.prompt, "token_mask": torch.ones(TOKENS),
                                          "piece_mask": torch.ones(TOKENS, PIECES)})
        assert not torch.equal(unpruned(**batch).logits, expected)  # the masks are what makes the difference


def test_wrong_base_and_corrupt_file_give_a_clear_error(tmp_path: Path) -> None:
    _pruned("t5").save_adapter(tmp_path / "artifact")
    with pytest.raises(AdapterError, match="hidden_size"):
        load_adapter(build("t5", hidden=64), tmp_path / "artifact")
    (tmp_path / "artifact" / WEIGHTS_NAME).write_bytes(b"not safetensors")
    with pytest.raises(AdapterError):
        load_adapter(build("t5"), tmp_path / "artifact")


@pytest.mark.parametrize("kind", ["t5", "llama"])
def test_cached_generate_equals_uncached_greedy_after_pruning(kind: str) -> None:
    adapted = _pruned(kind)
    ids = fixed_ids(batch=3, length=5)
    generated = adapted.generate(ids, torch.ones_like(ids), max_new_tokens=6, do_sample=False, use_cache=True)
    assert torch.equal(generated, greedy_without_cache(adapted, kind, ids, 6))


def test_detach_returns_the_base_model_unchanged() -> None:
    model = build("llama")
    batch = random_batch("llama")
    with torch.no_grad():
        before = model(**batch).logits
    adapted = apply(model, small_config("xprompt"))
    adapted.begin_phase(1, _losses(adapted, batch))
    assert adapted.detach() is model
    with torch.no_grad():
        torch.testing.assert_close(model(**batch).logits, before, rtol=0, atol=0)


def test_phases_and_their_state() -> None:
    adapted = apply(build("t5"), small_config("xprompt", pruning_at=0.4))
    assert adapted.training_phases(100) == [40] and adapted.training_phases(1) == []
    with pytest.raises(MethodError, match="not 2"):
        adapted.begin_phase(2, _losses(adapted, random_batch("t5")))
    pruned = _pruned("t5")
    adapted.load_phase_state(pruned.phase_state())
    assert adapted.surviving_tokens == pruned.surviving_tokens


def test_bad_options_are_named() -> None:
    with pytest.raises(ConfigError) as info:
        XPromptConfig(pieces=0, token_prune_fraction=1.0, pruning_at=0.0, score_batches=0)
    for key in ("pieces=0", "token_prune_fraction=1.0", "pruning_at=0.0", "score_batches=0"):
        assert key in str(info.value)
    with pytest.raises(MethodError, match="pieces=5 does not divide the model width d=32"):
        apply(build("t5"), small_config("xprompt", pieces=5))


def test_defaults_are_the_papers_20_tokens_drawn_from_the_vocabulary() -> None:
    config = XPromptConfig(pieces=4)
    assert (config.num_tokens, config.init) == (20, "vocab")
    adapted = apply(build("t5"), config)
    vocabulary = adapted.embed.weight.detach()
    assert adapted.prompt.shape == (20, WIDTH) and adapted.num_trainable_parameters() == 20 * WIDTH
    for row in adapted.prompt.detach():  # each prompt token is a copy of one row of the embedding matrix
        assert (vocabulary == row).all(dim=1).any()


def test_the_paper_presets_select_the_pruning_ratios_on_validation(tmp_path: Path, monkeypatch) -> None:
    from helpers.hub_cache import use_hub_cache

    from pipelines.sweeps.config import load_sweep_config, trials

    use_hub_cache(tmp_path / "hub", monkeypatch)
    monkeypatch.setenv("CAPT_DATA_DIR", str(tmp_path / "data"))  # the real tasks' folder (read by jobs, not here)
    sweep = load_sweep_config(Path(__file__).parents[3] / "pipelines" / "configs" / "paper" / "t5-base.yaml")
    rows = [entry for entry in sweep.methods if entry.name == "xprompt"]
    assert len(rows) == 1
    space = {key.removeprefix("job."): values for key, values in rows[0].select.items()}
    ratios = space["method.options.token_prune_fraction"]
    assert len(ratios) > 1 and all(0 < r < 1 for r in ratios)
    chosen = {t.select["method.options.token_prune_fraction"]: t.job["method"]["options"]["token_prune_fraction"]
              for t in trials(sweep) if t.method == "xprompt"}
    assert sorted(chosen) == sorted(ratios) and all(key == value for key, value in chosen.items())
