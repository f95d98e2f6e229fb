"""Helpers shared by the baseline tests (tiny models come from tests/tiny_models.py)."""

from __future__ import annotations

from typing import Any

import torch
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    T5Config,
    T5ForConditionalGeneration,
)

from capt.baselines import (
    FullFinetuneConfig,
    LoraConfig,
    PromptTuningConfig,
    PTuningV2Config,
)

KINDS = ("t5", "llama", "qwen2", "bert")
VOCAB, PAD, EOS, BOS = 64, 0, 1, 2
INIT = 0.15
"""Initialiser scale of the tiny decoder-only and BERT models: larger than the default so logits are not flat."""
T5_BRANCH_SCALE = 4.0
"""Factor on T5's residual-branch output weights, so the tiny T5 does not just repeat its input token."""


def _t5(layers: int, hidden: int) -> T5ForConditionalGeneration:
    model = T5ForConditionalGeneration(T5Config(
        vocab_size=VOCAB, d_model=hidden, d_kv=hidden // 4, d_ff=2 * hidden, num_layers=layers,
        num_decoder_layers=2, num_heads=4, dropout_rate=0.0, initializer_factor=1.0,
        decoder_start_token_id=PAD, pad_token_id=PAD, eos_token_id=EOS))
    with torch.no_grad():  # stronger residual branches: a tied T5 at init otherwise echoes its input token
        for name, param in model.named_parameters():
            if name.endswith(("SelfAttention.o.weight", "EncDecAttention.o.weight", "wo.weight")):
                param.mul_(T5_BRANCH_SCALE)
    return model


def _decoder(cls: type, config_cls: type, layers: int, hidden: int) -> torch.nn.Module:
    return cls(config_cls(
        vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, initializer_range=INIT,
        pad_token_id=PAD, eos_token_id=EOS, bos_token_id=BOS))


def _bert(layers: int, hidden: int) -> BertForSequenceClassification:
    return BertForSequenceClassification(BertConfig(
        vocab_size=VOCAB, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4,
        intermediate_size=2 * hidden, max_position_embeddings=128, num_labels=3, pad_token_id=PAD,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, initializer_range=INIT))


BUILDERS = {
    "t5": _t5,
    "llama": lambda layers, hidden: _decoder(LlamaForCausalLM, LlamaConfig, layers, hidden),
    "qwen2": lambda layers, hidden: _decoder(Qwen2ForCausalLM, Qwen2Config, layers, hidden),
    "bert": _bert,
}
GENERATIVE = ("t5", "llama")


def small_config(method: str, **overrides: Any) -> Any:
    """A small config of ``method`` suitable for tiny models."""
    if method == "prompt_tuning":
        return PromptTuningConfig(**{"num_tokens": 4, "init_std": 0.5, **overrides})
    if method == "ptuning_v2":
        return PTuningV2Config(**{"num_tokens": 3, **overrides})
    if method == "lora":
        return LoraConfig(**{"r": 2, **overrides})
    return FullFinetuneConfig(**overrides)


def build(kind: str, seed: int = 0, layers: int = 2, hidden: int = 32) -> torch.nn.Module:
    """A tiny model of ``kind`` in eval mode (deterministic per seed); generation never stops at EOS."""
    torch.manual_seed(seed)
    model = BUILDERS[kind](layers, hidden).eval()
    if hasattr(model, "generation_config"):
        model.generation_config.eos_token_id = None
        model.generation_config.pad_token_id = PAD
    return model


def random_batch(kind: str, batch: int = 3, length: int = 7, seed: int = 1) -> dict[str, torch.Tensor]:
    """Right-padded inputs (row i has length - i real tokens) with labels suited to ``kind``."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (batch, length), generator=generator)
    mask = torch.ones(batch, length, dtype=torch.long)
    for row in range(batch):
        mask[row, length - row:] = 0
        ids[row, length - row:] = PAD
    inputs = {"input_ids": ids, "attention_mask": mask}
    if kind == "t5":
        inputs["labels"] = torch.randint(3, VOCAB, (batch, 3), generator=generator)
    elif kind == "bert":
        inputs["labels"] = torch.randint(0, 3, (batch,), generator=generator)
    else:
        labels = ids.clone()
        labels[:, : length // 2] = -100  # the prompt part
        labels[mask == 0] = -100
        inputs["labels"] = labels
    return inputs


def fixed_ids(batch: int = 2, length: int = 6, seed: int = 3) -> torch.Tensor:
    """Random token ids without special tokens."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (batch, length), generator=generator)


def kv_width(model: torch.nn.Module) -> int:
    """Width of one layer's keys (kv_heads x head_dim) of a tiny model."""
    config = model.config
    if config.model_type == "t5":
        return config.num_heads * config.d_kv
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    return heads * (config.hidden_size // config.num_attention_heads)


def attention_layers(model: torch.nn.Module) -> int:
    """Self-attention layers with a prefix: T5 encoder + decoder, else the one stack."""
    config = model.config
    if config.model_type == "t5":
        return config.num_layers + config.num_decoder_layers
    return config.num_hidden_layers


def greedy_without_cache(adapted: Any, kind: str, ids: torch.Tensor, steps: int, **extra: Any) -> torch.Tensor:
    """Greedy decoding by re-running the wrapper's forward on the whole sequence each step (no cache)."""
    with torch.no_grad():
        if kind == "t5":
            seq = torch.full((ids.shape[0], 1), adapted.base.config.decoder_start_token_id)
            for _ in range(steps):
                logits = adapted(input_ids=ids, attention_mask=torch.ones_like(ids), decoder_input_ids=seq,
                                 use_cache=False).logits
                seq = torch.cat([seq, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
            return seq
        seq = ids
        for _ in range(steps):
            mask = torch.ones_like(seq)
            prompt_mask = torch.zeros_like(seq)
            prompt_mask[:, : ids.shape[1]] = 1
            kwargs = {"prompt_mask": prompt_mask} if extra.get("pass_prompt_mask") else {}
            logits = adapted(input_ids=seq, attention_mask=mask, use_cache=False, **kwargs).logits
            seq = torch.cat([seq, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        return seq
