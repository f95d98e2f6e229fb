"""Prompt tuning specifics: logits alignment, label handling, the instance token, initialisation."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from capt.baselines import PromptTuningConfig, apply

from .baselines_helpers import build, random_batch


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_decoder_logits_align_and_loss_matches_them(kind: str) -> None:
    adapted = apply(build(kind), PromptTuningConfig(num_tokens=5, init_std=1.0))
    batch = random_batch(kind)
    with torch.no_grad():
        out = adapted(**batch)
    assert out.logits.shape[:2] == batch["input_ids"].shape
    logits, labels = out.logits[:, :-1], batch["labels"][:, 1:]
    manual = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)
    torch.testing.assert_close(out.loss, manual)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_instance_token_never_sees_answer_tokens(kind: str) -> None:
    adapted = apply(build(kind), PromptTuningConfig(num_tokens=2, instance_token=True))
    batch = random_batch(kind, batch=1, length=8)
    other = {k: v.clone() for k, v in batch.items()}
    other["input_ids"][:, 6:] = (other["input_ids"][:, 6:] + 7) % 60 + 3  # change two answer tokens
    other["labels"][:, 6:] = other["input_ids"][:, 6:]
    with torch.no_grad():
        first, second = adapted(**batch).logits, adapted(**other).logits
        # prompt positions (causal: unaffected by later tokens unless the instance token leaks them)
        torch.testing.assert_close(first[:, :6], second[:, :6])
        no_labels = adapted(input_ids=other["input_ids"]).logits
    assert not torch.allclose(no_labels[:, :6], second[:, :6])  # without labels the mean covers all tokens


def test_instance_token_is_training_free_and_input_dependent() -> None:
    plain = apply(build("t5"), PromptTuningConfig(num_tokens=3))
    adapted = apply(build("t5"), PromptTuningConfig(num_tokens=3, instance_token=True))
    assert adapted.num_trainable_parameters() == plain.num_trainable_parameters() == 3 * 32
    batch = random_batch("t5")
    embeds, mask = adapted.extend_inputs(batch["input_ids"], batch["attention_mask"])
    assert embeds.shape[1] == batch["input_ids"].shape[1] + 4 and mask.shape == embeds.shape[:2]
    tokens = adapted.embed(batch["input_ids"])
    row = 2
    real = batch["attention_mask"][row].bool()
    torch.testing.assert_close(embeds[row, 0], tokens[row, real].mean(0))


def test_encoder_prompt_sits_after_cls_and_extends_token_types() -> None:
    adapted = apply(build("bert"), PromptTuningConfig(num_tokens=3, init_std=1.0))
    batch = random_batch("bert")
    embeds, mask = adapted.extend_inputs(batch["input_ids"], batch["attention_mask"])
    torch.testing.assert_close(embeds[:, 0], adapted.embed(batch["input_ids"])[:, 0])
    torch.testing.assert_close(embeds[:, 1:4], adapted.prompt.unsqueeze(0).expand(3, -1, -1))
    with torch.no_grad():
        out = adapted(**batch, token_type_ids=torch.zeros_like(batch["input_ids"]))
    assert out.logits.shape == (3, 3)


def test_vocab_init_copies_token_embeddings() -> None:
    adapted = apply(build("llama"), PromptTuningConfig(num_tokens=4, init="vocab"))
    table = adapted.embed.weight
    for vector in adapted.prompt:
        assert (table - vector).abs().sum(-1).min() == 0


def test_prompt_forward_rejects_cache_continuation() -> None:
    adapted = apply(build("llama"), PromptTuningConfig(num_tokens=2))
    batch = random_batch("llama")
    with pytest.raises(ValueError, match="cache"):
        adapted(input_ids=batch["input_ids"], cache=object())


def test_t5_precomputed_encoder_outputs() -> None:
    adapted = apply(build("t5"), PromptTuningConfig(num_tokens=3, init_std=1.0))
    batch = random_batch("t5")
    with torch.no_grad():
        full = adapted(**batch)
        reused = adapted(encoder_outputs=(full.encoder_last_hidden_state,), attention_mask=batch["attention_mask"],
                         labels=batch["labels"])
    torch.testing.assert_close(reused.logits, full.logits)
