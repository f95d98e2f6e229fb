"""Trainable capsule parameters at the real architectures' sizes, on the meta device (no weights)."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    T5Config,
    T5ForConditionalGeneration,
)

import capt

# Public config values of the checkpoints (config.json on the hub), and their public parameter counts.
REAL = {
    "t5-base": (T5ForConditionalGeneration, T5Config(
        vocab_size=32128, d_model=768, d_kv=64, d_ff=3072, num_layers=12, num_heads=12,
        relative_attention_num_buckets=32, feed_forward_proj="relu", tie_word_embeddings=True), 12, 768),
    "t5-large": (T5ForConditionalGeneration, T5Config(
        vocab_size=32128, d_model=1024, d_kv=64, d_ff=4096, num_layers=24, num_heads=16,
        relative_attention_num_buckets=32, feed_forward_proj="relu", tie_word_embeddings=True), 24, 1024),
    "llama-3.2-1b": (LlamaForCausalLM, LlamaConfig(
        vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=32, num_key_value_heads=8, head_dim=64, tie_word_embeddings=True), 16, 2048),
    "qwen2.5-1.5b": (Qwen2ForCausalLM, Qwen2Config(
        vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
        num_attention_heads=12, num_key_value_heads=2, tie_word_embeddings=True), 28, 1536),
}
PUBLIC_TOTALS = {"t5-base": 222_903_552, "t5-large": 737_668_096, "llama-3.2-1b": 1_235_814_400,
                 "qwen2.5-1.5b": 1_543_714_304}


@pytest.mark.parametrize("name", sorted(REAL))
def test_capsule_budget_matches_the_paper(name):
    cls, config, layers, hidden = REAL[name]
    with torch.device("meta"):
        model = cls(config)
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
    cls, config, layers, hidden = REAL["t5-base"]
    with torch.device("meta"):
        model = cls(config)
    capsule_model = capt.attach(model, capt.CapsuleConfig(fusion="project", project_rank=rank))
    trainable = sum(p.numel() for p in capsule_model.trainable_parameters())
    assert trainable == layers * hidden + layers * 2 * rank * hidden
    assert trainable == {4: 12 * 768 + 73_728, 64: 12 * 768 + 1_179_648}[rank]
