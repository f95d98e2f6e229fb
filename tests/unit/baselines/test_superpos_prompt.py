"""SuperPos-Prompt: p_i = w_i (E + dE_i) over m sampled vocabulary embeddings; the ids travel in the artifact
as int64."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from capt.baselines import AdapterError, apply, load_adapter
from capt.baselines.io import META_NAME, WEIGHTS_NAME
from capt.digest import seal
from capt.errors import MethodError

from . import soft_prompt_checks as checks
from .baselines_helpers import GENERATIVE, VOCAB, build, random_batch, small_config, tiny_model


@pytest.mark.parametrize("kind", ["t5", "llama", "bert"])
def test_trains_only_its_weights_and_per_token_changes(kind: str) -> None:
    config = small_config("superpos_prompt")
    count = config.num_tokens * config.num_sampled + config.num_tokens * config.num_sampled * 32
    checks.trains_only_its_parameters(kind, config, count, lr=0.1)


def test_shared_embeddings_variant_trains_one_copy() -> None:
    config = small_config("superpos_prompt", shared_embeddings=True)
    checks.trains_only_its_parameters("t5", config, config.num_tokens * config.num_sampled + config.num_sampled * 32,
                                      lr=0.1)


def test_each_token_superposes_its_own_changed_embeddings() -> None:
    # The paper's p_i = sum_j w_ij (e_j + dE_ij), written out token by token and piece by piece.
    model = build("t5")
    adapted = apply(model, small_config("superpos_prompt"))
    n, m = adapted.weights.shape
    assert adapted.deltas.shape == (n, m, 32) and torch.count_nonzero(adapted.deltas) == 0  # zero at the start
    with torch.no_grad():
        adapted.deltas.normal_()
    vocab = model.get_input_embeddings().weight.detach()
    for i in range(n):
        expected = sum(adapted.weights[i, j] * (vocab[adapted.token_ids[j]] + adapted.deltas[i, j]) for j in range(m))
        torch.testing.assert_close(adapted.current_prompt()[i], expected, rtol=1e-5, atol=1e-5)
    # One token's change moves that token's prompt vector only.
    before = adapted.current_prompt().detach().clone()
    with torch.no_grad():
        adapted.deltas[1] += 1.0
    moved = (adapted.current_prompt().detach() - before).abs().sum(dim=1)
    assert moved[1] > 0 and torch.count_nonzero(moved) == 1


def test_frozen_embeddings_variant_trains_only_the_weights() -> None:
    config = small_config("superpos_prompt", train_embeddings=False)
    checks.trains_only_its_parameters("t5", config, config.num_tokens * config.num_sampled, lr=0.3)


@pytest.mark.parametrize("train_embeddings", [True, False])
def test_prompt_is_a_superposition_of_the_sampled_embeddings(train_embeddings: bool) -> None:
    model = build("llama")
    adapted = apply(model, small_config("superpos_prompt", train_embeddings=train_embeddings))
    ids = adapted.token_ids
    assert ids.dtype == torch.int64 and len(set(ids.tolist())) == 16 and int(ids.max()) < VOCAB
    vocab = model.get_input_embeddings().weight
    torch.testing.assert_close(adapted.current_prompt(), adapted.weights @ vocab[ids])
    again = apply(build("llama"), small_config("superpos_prompt", train_embeddings=train_embeddings))
    other = apply(build("t5"), small_config("superpos_prompt", sample_seed=1))
    assert torch.equal(again.token_ids, ids) and not torch.equal(other.token_ids, ids)


@pytest.mark.parametrize("kind", ["t5", "llama", "bert"])
def test_round_trip_stores_the_sampled_ids(kind: str, tmp_path: Path) -> None:
    config = small_config("superpos_prompt")
    saved, loaded = checks.round_trip(kind, config, tmp_path / "artifact")
    tensors = load_file(str(tmp_path / "artifact" / WEIGHTS_NAME))
    assert tensors["token_ids"].dtype == torch.int64 and torch.equal(tensors["token_ids"], saved.token_ids)
    assert set(tensors) == {"weights", "deltas", "token_ids"}


def test_stored_ids_win_over_the_seeded_draw(tmp_path: Path) -> None:
    config = small_config("superpos_prompt", train_embeddings=False)
    adapted = apply(build("t5"), config)
    with torch.no_grad():
        adapted.token_ids.copy_(torch.arange(16) + 20)  # not the seeded draw: the file must carry them
        expected = adapted.current_prompt()
    adapted.save_adapter(tmp_path / "artifact")
    loaded = load_adapter(build("t5"), tmp_path / "artifact")
    assert torch.equal(loaded.token_ids, torch.arange(16) + 20)
    torch.testing.assert_close(loaded.current_prompt(), expected, rtol=0, atol=0)


def test_ids_outside_the_vocabulary_are_refused(tmp_path: Path) -> None:
    directory = apply(build("t5"), small_config("superpos_prompt")).save_adapter(tmp_path / "artifact")
    tensors = load_file(str(directory / WEIGHTS_NAME))
    save_file({**tensors, "token_ids": tensors["token_ids"] + VOCAB}, str(directory / WEIGHTS_NAME))
    seal(directory)  # sealed as written by a faulty writer: the digest holds, the values are still checked
    with pytest.raises(AdapterError, match="outside the vocabulary"):
        load_adapter(build("t5"), directory)
    assert json.loads((directory / META_NAME).read_text())["tensors"]["token_ids"] == [16]


def test_wrong_base_and_corrupt_files_are_refused(tmp_path: Path) -> None:
    checks.refuses_wrong_base_and_corrupt_files(small_config("superpos_prompt"), tmp_path)


def test_more_samples_than_the_vocabulary_is_a_clear_error() -> None:
    with pytest.raises(MethodError, match=f"num_sampled=1000.*vocabulary of {VOCAB}"):
        apply(build("t5"), small_config("superpos_prompt", num_sampled=1000))


@pytest.mark.parametrize("kind", GENERATIVE)
def test_cached_generate_equals_uncached_greedy(kind: str) -> None:
    checks.cached_generate_is_greedy(kind, small_config("superpos_prompt"))


def test_base_dropout_is_off_while_training_unless_asked_for() -> None:
    model = tiny_model("t5", dropout_rate=0.3)
    batch = random_batch("t5")
    adapted = apply(model, small_config("superpos_prompt")).train()
    assert adapted.training and not model.training
    with torch.no_grad():  # training mode, yet deterministic: no dropout left in the frozen model
        torch.testing.assert_close(adapted(**batch).logits, adapted(**batch).logits, rtol=0, atol=0)
    adapted.detach()
    kept = apply(model, small_config("superpos_prompt", base_dropout=True)).train()
    assert model.training
    with torch.no_grad():
        assert not torch.equal(kept(**batch).logits, kept(**batch).logits)


def test_detach_restores_the_base_model() -> None:
    checks.detach_restores_base("bert", small_config("superpos_prompt"))
