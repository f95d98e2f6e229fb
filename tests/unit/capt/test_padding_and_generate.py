"""Padding invariance, KV-cache generation, and no label leakage in decoder-only models."""

from __future__ import annotations

import pytest
import torch
from tiny_models import BUILDERS, EOS, PAD, VOCAB

import capt

PROMPTS = [[5, 9, 13, 17, 21, 25, 29], [7, 11, 15], [40, 41, 42, 43, 44]]


def _capsule_model(kind):
    return capt.attach(BUILDERS[kind](), capt.CapsuleConfig(init="normal", init_std=0.5))


def _batch(rows, left=False):
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), PAD)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        span = slice(width - len(row), width) if left else slice(0, len(row))
        ids[i, span] = torch.tensor(row)
        mask[i, span] = 1
    return ids, mask


def _row_outputs(model, kind, rows):
    ids, mask = _batch(rows)
    extra = {"decoder_input_ids": torch.tensor([[PAD, 3, 4]] * len(rows))} if kind == "t5" else {}
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, **extra)
    if kind in ("llama", "qwen2"):
        return [out.logits[i, : len(r)] for i, r in enumerate(rows)]
    return list(out.logits)


def test_right_padding_never_changes_a_row(kind):
    model = _capsule_model(kind)
    together = _row_outputs(model, kind, PROMPTS)
    for row, batched in zip(PROMPTS, together, strict=True):
        alone = _row_outputs(model, kind, [row])[0]
        torch.testing.assert_close(batched, alone, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_left_padded_generation_matches_each_row_alone(kind):
    model = _capsule_model(kind)
    ids, mask = _batch(PROMPTS, left=True)
    together = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=5, do_sample=False,
                              pad_token_id=PAD)
    for i, row in enumerate(PROMPTS):
        alone = model.generate(input_ids=torch.tensor([row]), max_new_tokens=5, do_sample=False, pad_token_id=PAD)
        assert together[i, -5:].tolist() == alone[0, -5:].tolist()
        assert together[i, : ids.shape[1]].tolist() == ids[i].tolist()


def _greedy_without_cache(model, kind, ids, steps):
    """Greedy decoding by full forward passes, no cache anywhere."""
    if kind == "t5":
        out = torch.tensor([[PAD]])
        for _ in range(steps):
            logits = model(input_ids=ids, decoder_input_ids=out, use_cache=False).logits
            out = torch.cat([out, logits[:, -1:].argmax(-1)], dim=1)
        return out
    out = ids
    for _ in range(steps):
        logits = model(input_ids=out, use_cache=False).logits
        out = torch.cat([out, logits[:, -1:].argmax(-1)], dim=1)
    return out


@pytest.mark.parametrize("kind", ["t5", "llama"])
def test_cached_generate_equals_uncached_greedy(kind):
    model = _capsule_model(kind)
    ids = torch.tensor([PROMPTS[0]])
    with torch.no_grad():
        expected = _greedy_without_cache(model, kind, ids, steps=6)
    cached = model.generate(input_ids=ids, max_new_tokens=6, min_new_tokens=6, do_sample=False, use_cache=True,
                            eos_token_id=None, pad_token_id=PAD)
    assert cached.tolist() == expected.tolist()
    scored = {"max_new_tokens": 2, "do_sample": False, "return_dict_in_generate": True, "output_scores": True,
              "pad_token_id": PAD}
    with_capsule = model.generate(input_ids=ids, **scored).scores[0]
    without = model.base_model.generate(input_ids=ids, **scored).scores[0]
    assert not torch.allclose(with_capsule, without), "generate must use the capsule"


def test_generate_returns_a_dict_when_asked():
    model = _capsule_model("llama")
    ids = torch.tensor([PROMPTS[1]])
    out = model.generate(input_ids=ids, max_new_tokens=3, do_sample=False, return_dict_in_generate=True,
                         output_scores=True, pad_token_id=PAD)
    assert out.sequences.shape == (1, len(PROMPTS[1]) + 3)
    assert len(out.scores) == 3


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_answer_tokens_never_change_the_capsule(kind):
    model = _capsule_model(kind)
    seen = []
    for layer in model.spec.find_layers(model.base_model):
        layer.register_forward_pre_hook(
            lambda _m, args, kwargs: seen.append((args[0] if args else kwargs["hidden_states"])[:, 0].clone()),
            with_kwargs=True)
    prompt = torch.tensor([[5, 9, 13, 17]])
    prompt_logits = []
    for answer in ([30, EOS], [VOCAB - 1, 3]):
        ids = torch.cat([prompt, torch.tensor([answer])], dim=1)
        labels = torch.cat([torch.full_like(prompt, -100), torch.tensor([answer])], dim=1)
        with torch.no_grad():
            prompt_logits.append(model(input_ids=ids, labels=labels).logits[:, : prompt.shape[1]])
    layers = len(seen) // 2
    for first, second in zip(seen[:layers], seen[layers:], strict=True):
        assert torch.equal(first, second)
    torch.testing.assert_close(prompt_logits[0], prompt_logits[1])


def test_explicit_prompt_mask_overrides_labels():
    model = _capsule_model("llama")
    ids = torch.tensor([[5, 9, 13, 17, 30, 31]])
    labels = torch.tensor([[-100] * 4 + [30, 31]])
    short_prompt = torch.tensor([[1, 1, 0, 0, 0, 0]])
    with torch.no_grad():
        default = model(input_ids=ids, labels=labels).logits
        narrow = model(input_ids=ids, labels=labels, prompt_mask=short_prompt).logits
        by_mask = model(input_ids=ids, prompt_mask=torch.tensor([[1, 1, 1, 1, 0, 0]])).logits
    assert not torch.allclose(default, narrow)
    torch.testing.assert_close(default, by_mask)
