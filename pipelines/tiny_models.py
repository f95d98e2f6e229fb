"""Small random-weight models sized for a 2-CPU machine, built from `*Config` objects (no download)."""

from __future__ import annotations

from typing import Any

from torch import nn
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

_WIDTH = {"hidden": 64, "ffn": 128, "layers": 2, "heads": 4}


def build(name: str, tokenizer: Any, num_labels: int) -> nn.Module:
    """The tiny model `name` ("tiny-t5", "tiny-llama", "tiny-qwen2", "tiny-bert") for `tokenizer`'s vocabulary."""
    vocab = len(tokenizer)
    ids = {"pad_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.eos_token_id}
    if name == "tiny-t5":
        config = T5Config(vocab_size=vocab, d_model=_WIDTH["hidden"], d_kv=16, d_ff=_WIDTH["ffn"],
                          num_layers=_WIDTH["layers"], num_heads=_WIDTH["heads"], dropout_rate=0.0,
                          decoder_start_token_id=tokenizer.pad_token_id, **ids)
        return T5ForConditionalGeneration(config)
    if name in ("tiny-llama", "tiny-qwen2"):
        config_cls, model_cls = (LlamaConfig, LlamaForCausalLM) if name == "tiny-llama" else (Qwen2Config, Qwen2ForCausalLM)
        config = config_cls(vocab_size=vocab, hidden_size=_WIDTH["hidden"], intermediate_size=_WIDTH["ffn"],
                            num_hidden_layers=_WIDTH["layers"], num_attention_heads=_WIDTH["heads"],
                            num_key_value_heads=2, max_position_embeddings=1024,
                            bos_token_id=tokenizer.bos_token_id, **ids)
        return model_cls(config)
    if name == "tiny-bert":
        config = BertConfig(vocab_size=vocab, hidden_size=_WIDTH["hidden"], num_hidden_layers=_WIDTH["layers"],
                            num_attention_heads=_WIDTH["heads"], intermediate_size=_WIDTH["ffn"],
                            max_position_embeddings=1024, num_labels=num_labels,
                            pad_token_id=tokenizer.pad_token_id, hidden_dropout_prob=0.0,
                            attention_probs_dropout_prob=0.0)
        return BertForSequenceClassification(config)
    raise ValueError(f"Unknown tiny model {name!r}; allowed: tiny-t5, tiny-llama, tiny-qwen2, tiny-bert.")
