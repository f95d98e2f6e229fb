"""P-Tuning v2 reaches every self-attention stack, changes generation and is padding-invariant."""

from __future__ import annotations

import pytest
import torch

from capt.baselines import PTuningV2Config, apply, prefix_attention

from .baselines_helpers import PAD, build, fixed_ids, random_batch, small_config

LARGE = PTuningV2Config(num_tokens=4, init_std=3.0)
"""A prefix initialised large enough to change outputs visibly."""


def test_prefix_changes_t5_encoder_output() -> None:
    model = build("t5")
    batch = random_batch("t5")
    with torch.no_grad():
        base = model(**batch).encoder_last_hidden_state
        adapted = apply(model, LARGE)
        prefixed = adapted(**batch).encoder_last_hidden_state
        for stack in ("encoder", "decoder"):  # both stacks carry prefixes
            assert adapted.prefixes[stack].prefix.shape[0] == 2
        adapted.prefixes["decoder"].prefix.zero_()
        encoder_only = adapted(**batch).encoder_last_hidden_state
    assert (prefixed - base).abs().max() > 1e-2
    torch.testing.assert_close(encoder_only, prefixed)  # the encoder change does not come from the decoder


def test_prefix_changes_t5_decoder_self_attention() -> None:
    model = build("t5")
    batch = random_batch("t5")
    adapted = apply(model, LARGE)
    with torch.no_grad():
        for site in adapted.sites["encoder"]:  # keep only the decoder prefixes
            prefix_attention.release(site.module)
        with_decoder = adapted(**batch)
        base = adapted.detach()(**batch)
    torch.testing.assert_close(with_decoder.encoder_last_hidden_state, base.encoder_last_hidden_state)
    assert (with_decoder.logits - base.logits).abs().max() > 1e-2


@pytest.mark.parametrize("kind", ["t5", "llama", "qwen2"])
def test_prefix_changes_generate(kind: str) -> None:
    model = build(kind)
    ids = fixed_ids(batch=3, length=6)
    mask = torch.ones_like(ids)
    base = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
    adapted = apply(model, LARGE)
    prefixed = adapted.generate(ids, mask, max_new_tokens=6, do_sample=False)
    assert prefixed.shape == base.shape
    if kind != "t5":
        assert torch.equal(prefixed[:, :6], ids)  # decoder-only: prompt + new tokens
    assert not torch.equal(prefixed, base)


@pytest.mark.parametrize("method", ["ptuning_v2", "prompt_tuning"])
@pytest.mark.parametrize("kind", ["t5", "llama", "qwen2", "bert"])
def test_right_padding_does_not_change_a_row(kind: str, method: str) -> None:
    config = LARGE if method == "ptuning_v2" else small_config(method, instance_token=True)
    adapted = apply(build(kind), config)
    batch = random_batch(kind, batch=3, length=7)
    batch.pop("labels")
    if kind == "t5":
        batch["decoder_input_ids"] = fixed_ids(batch=3, length=4)
    with torch.no_grad():
        full = adapted(**batch)
        for row in (1, 2):
            length = int(batch["attention_mask"][row].sum())
            single = {k: v[row: row + 1] for k, v in batch.items()}
            single["input_ids"] = single["input_ids"][:, :length]
            single["attention_mask"] = single["attention_mask"][:, :length]
            alone = adapted(**single)
            if kind in ("t5", "bert"):
                torch.testing.assert_close(full.logits[row: row + 1], alone.logits, atol=1e-5, rtol=1e-4)
            else:
                torch.testing.assert_close(full.logits[row: row + 1, :length], alone.logits, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("method", ["ptuning_v2", "prompt_tuning"])
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_left_padding_does_not_change_generation(kind: str, method: str) -> None:
    config = LARGE if method == "ptuning_v2" else small_config(method, instance_token=True)
    adapted = apply(build(kind), config)
    ids = fixed_ids(batch=2, length=7)
    mask = torch.ones_like(ids)
    short = ids[1:, 3:]
    padded = ids.clone()
    padded[1, :3], mask[1, :3] = PAD, 0
    both = adapted.generate(padded, mask, max_new_tokens=5, do_sample=False)
    alone = adapted.generate(short, torch.ones_like(short), max_new_tokens=5, do_sample=False)
    first = adapted.generate(ids[:1], torch.ones_like(ids[:1]), max_new_tokens=5, do_sample=False)
    assert torch.equal(both[1:, 7:], alone[:, 4:])
    assert torch.equal(both[:1], first)


def test_dropout_only_in_training() -> None:
    adapted = apply(build("llama"), PTuningV2Config(num_tokens=3, dropout=0.5))
    batch = random_batch("llama")
    with torch.no_grad():
        adapted.eval()
        torch.testing.assert_close(adapted(**batch).logits, adapted(**batch).logits)
        adapted.train()
        assert not torch.allclose(adapted(**batch).logits, adapted(**batch).logits)


@pytest.mark.parametrize("kind", ["t5", "llama"])
def test_gradient_checkpointing_keeps_prefix_gradients(kind: str) -> None:
    grads = []
    for checkpointing in (False, True):
        model = build(kind)
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        adapted = apply(model, LARGE)
        adapted.train()
        adapted(**random_batch(kind)).loss.backward()
        grads.append([p.grad.clone() for p in adapted.trainable_parameters()])
    for plain, checkpointed in zip(*grads, strict=True):
        torch.testing.assert_close(checkpointed, plain)
