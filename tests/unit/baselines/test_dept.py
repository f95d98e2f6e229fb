"""DePT (Shi & Lipani 2024): a short soft prompt plus a low-rank offset of the input embeddings, two learning rates;
trains only its own parameters, reloads exactly, generates with the cache as without it, detaches cleanly."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from capt.baselines import AdapterError, apply, load_adapter
from capt.baselines.dept.config import DeptConfig
from capt.baselines.prompt import PromptTuningModel
from capt.errors import ConfigError, MethodError

from .baselines_helpers import (
    build,
    fixed_ids,
    greedy_without_cache,
    logits,
    perturb,
    random_batch,
    small_config,
)

FAMILIES = ("t5", "llama", "bert")


@pytest.mark.parametrize("kind", FAMILIES)
def test_dept_trains_only_its_parameters(kind: str) -> None:
    model = build(kind)
    config = small_config("dept")
    adapted = apply(model, config)
    d = model.config.hidden_size
    trainable = list(adapted.trainable_parameters())
    assert sum(p.numel() for p in trainable) == config.num_tokens * d + config.rank * (config.max_length + d)
    batch = random_batch(kind)
    adapted.train()
    groups = [{"params": params, "lr": 0.1 if lr is None else lr} for params, lr in adapted.parameter_groups()]
    optimizer = torch.optim.Adam(groups)
    first = adapted(**batch).loss
    first.backward()
    ids = {id(p) for p in trainable}
    assert all(p.grad is None for p in adapted.parameters() if id(p) not in ids)
    assert adapted.prompt.grad.abs().sum() > 0 and adapted.embedding_b.grad.abs().sum() > 0
    for _ in range(30):
        optimizer.step()
        optimizer.zero_grad()
        adapted(**batch).loss.backward()
    final = adapted(**batch).loss.item()
    assert final < first.item() * 0.9, f"dept on {kind}: loss {first.item():.4f} -> {final:.4f}"


def test_two_learning_rates_the_prompt_at_the_jobs() -> None:
    adapted = apply(build("t5"), small_config("dept", embedding_lr=3e-4))
    (prompt, prompt_lr), (low_rank, low_rank_lr) = adapted.parameter_groups()
    assert prompt == [adapted.prompt] and prompt_lr is None
    assert low_rank == [adapted.embedding_a, adapted.embedding_b] and low_rank_lr == 3e-4


@pytest.mark.parametrize("kind", FAMILIES)
def test_training_starts_at_prompt_tuning(kind: str) -> None:
    """B starts at zero: DePT's first forward is prompt tuning's with the same prompt."""
    batch = random_batch(kind)
    dept = apply(build(kind), small_config("dept"))
    expected = logits(dept, batch)
    prompt_tuning = apply(build(kind), small_config("prompt_tuning", num_tokens=3))
    with torch.no_grad():
        prompt_tuning.prompt.copy_(dept.prompt)
    torch.testing.assert_close(logits(prompt_tuning, batch), expected, rtol=0, atol=0)
    assert isinstance(dept, PromptTuningModel)


def test_offsets_stop_at_max_length() -> None:
    adapted = apply(build("llama"), small_config("dept", max_length=4))
    perturb(adapted, 0.3)
    with torch.no_grad():
        offsets = adapted.offsets(2, 5)
    assert offsets.shape == (5, 32)
    assert offsets[:2].abs().sum() > 0 and offsets[2:].abs().sum() == 0


@pytest.mark.parametrize("kind", FAMILIES)
def test_round_trip_gives_identical_outputs_and_detach_restores_the_base(kind: str, tmp_path: Path) -> None:
    model, batch = build(kind), random_batch(kind)
    before = logits(model, batch)
    adapted = apply(model, small_config("dept"))
    perturb(adapted, 0.3)
    expected = logits(adapted, batch)
    adapted.save_adapter(tmp_path / "artifact")
    loaded = load_adapter(build(kind), tmp_path / "artifact")
    assert loaded.adapter_config == adapted.adapter_config
    torch.testing.assert_close(logits(loaded, batch), expected, rtol=0, atol=0)
    base = adapted.detach()
    assert all(not m._forward_hooks for m in base.modules())
    torch.testing.assert_close(logits(base, batch), before, rtol=0, atol=0)


def test_artifact_of_another_base_model_or_corrupt_is_refused(tmp_path: Path) -> None:
    apply(build("llama"), small_config("dept")).save_adapter(tmp_path)
    with pytest.raises(AdapterError, match="hidden_size: adapter has 32, model has 48"):
        load_adapter(build("llama", hidden=48), tmp_path)
    (tmp_path / "adapter.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(AdapterError, match="not a readable safetensors file"):
        load_adapter(build("llama"), tmp_path)


@pytest.mark.parametrize("max_length", [16, 7])
@pytest.mark.parametrize("kind", ["t5", "llama"])
def test_cached_generate_equals_uncached_greedy(kind: str, max_length: int) -> None:
    """Generated tokens get their positions' offsets (up to max_length 16; past it from the third one with 7)."""
    adapted = apply(build(kind), small_config("dept", max_length=max_length))
    perturb(adapted, 0.3)
    ids = fixed_ids(batch=3, length=5)
    generated = adapted.generate(ids, torch.ones_like(ids), max_new_tokens=6, do_sample=False, use_cache=True)
    assert torch.equal(generated, greedy_without_cache(adapted, kind, ids, 6))
    assert adapted._next_position is None


def test_bad_options_are_named() -> None:
    with pytest.raises(ConfigError) as error:
        DeptConfig(num_tokens=0, rank=0, max_length=-1, alpha=0, embedding_lr=float("nan"))
    message = str(error.value)
    for key in ("num_tokens", "rank", "max_length", "alpha", "embedding_lr"):
        assert key in message


def test_text_init_is_the_sentence_token_embeddings_repeated_to_the_prompt_length() -> None:
    model = build("t5")
    adapted = apply(model, small_config("dept", num_tokens=7, init="text", init_text_ids=[5, 9, 11]))
    rows = model.get_input_embeddings().weight.detach()
    expected = torch.stack([rows[5], rows[9], rows[11], rows[5], rows[9], rows[11], rows[5]])
    torch.testing.assert_close(adapted.prompt.detach(), expected, rtol=0, atol=0)
    short = apply(build("t5"), small_config("dept", num_tokens=2, init="text", init_text_ids=[5, 9, 11]))
    torch.testing.assert_close(short.prompt.detach(), torch.stack([rows[5], rows[9]]), rtol=0, atol=0)


def test_text_init_tokenises_the_authors_sentence_with_the_checkpoints_tokenizer(monkeypatch) -> None:
    import transformers

    asked = []

    class Tokenizer:
        def __call__(self, text: str) -> dict:
            asked.append(text)
            return {"input_ids": [7, 8, 1]}

    def from_pretrained(name: str) -> Tokenizer:
        asked.append(name)
        return Tokenizer()

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", from_pretrained)
    model = build("t5")
    model.config._name_or_path = "some/checkpoint"
    adapted = apply(model, small_config("dept", num_tokens=4, init="text"))
    assert asked == ["some/checkpoint", "Classify this text is postive or not:"]
    rows = model.get_input_embeddings().weight.detach()
    torch.testing.assert_close(adapted.prompt.detach(), rows[[7, 8, 1, 7]], rtol=0, atol=0)


def test_text_init_without_a_tokenizer_names_the_way_out() -> None:
    model = build("t5")
    model.config._name_or_path = "/nonexistent/checkpoint"
    with pytest.raises(MethodError, match="init_text_ids"):
        apply(model, small_config("dept", init="text"))
    with pytest.raises(ValueError, match="init_text_ids"):
        DeptConfig(init="text", init_text_ids=[])
