"""Small random-weight models sized for a 2-CPU machine, built from `*Config` objects (no download)."""

from __future__ import annotations

from typing import Any

from torch import nn
from transformers import BertConfig, LlamaConfig, PretrainedConfig, Qwen2Config, T5Config

_WIDTH = {"hidden": 64, "ffn": 128, "layers": 2, "heads": 4}
_MODEL_CLASSES = {"tiny-t5": "T5ForConditionalGeneration", "tiny-llama": "LlamaForCausalLM",
                  "tiny-qwen2": "Qwen2ForCausalLM", "tiny-bert": "BertForSequenceClassification"}


def build(name: str, tokenizer: Any, num_labels: int) -> nn.Module:
    """The tiny model `name` ("tiny-t5", "tiny-llama", "tiny-qwen2", "tiny-bert") for `tokenizer`'s vocabulary."""
    ids = {"pad_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.eos_token_id,
           "bos_token_id": tokenizer.bos_token_id}
    import transformers  # the model classes import slowly: configs alone (pre-flight checks) do without them

    model_config = config(name, len(tokenizer), ids, num_labels)
    return getattr(transformers, _MODEL_CLASSES[name])(model_config)


def config(name: str, vocab_size: int, ids: dict[str, int | None], num_labels: int = 2) -> PretrainedConfig:
    """The config of tiny model `name` (what pre-flight validation reads: depth, position limit)."""
    if name == "tiny-t5":
        return T5Config(vocab_size=vocab_size, d_model=_WIDTH["hidden"], d_kv=16, d_ff=_WIDTH["ffn"],
                        num_layers=_WIDTH["layers"], num_heads=_WIDTH["heads"], dropout_rate=0.0,
                        decoder_start_token_id=ids["pad_token_id"], pad_token_id=ids["pad_token_id"],
                        eos_token_id=ids["eos_token_id"])
    if name in ("tiny-llama", "tiny-qwen2"):
        config_cls = LlamaConfig if name == "tiny-llama" else Qwen2Config
        return config_cls(vocab_size=vocab_size, hidden_size=_WIDTH["hidden"], intermediate_size=_WIDTH["ffn"],
                          num_hidden_layers=_WIDTH["layers"], num_attention_heads=_WIDTH["heads"],
                          num_key_value_heads=2, max_position_embeddings=1024, **ids)
    if name == "tiny-bert":
        return BertConfig(vocab_size=vocab_size, hidden_size=_WIDTH["hidden"], num_hidden_layers=_WIDTH["layers"],
                          num_attention_heads=_WIDTH["heads"], intermediate_size=_WIDTH["ffn"],
                          max_position_embeddings=1024, num_labels=num_labels,
                          pad_token_id=ids["pad_token_id"], hidden_dropout_prob=0.0,
                          attention_probs_dropout_prob=0.0)
    raise ValueError(f"Unknown tiny model {name!r}; allowed: {', '.join(_MODEL_CLASSES)}.")
