"""Small random-weight models sized for a 2-CPU machine, built from `*Config` objects (no download).

The one tiny-model factory: jobs build `tiny-*` models here, and the tests build theirs from the same
configs (tests/tiny_models.py) with a smaller width and a few fields changed. Importing this module imports no
torch or transformers: configuration validation reads `config_fields`, plain config.json fields.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn
    from transformers import PretrainedConfig

TINY_MODELS = ("tiny-t5", "tiny-llama", "tiny-qwen2", "tiny-bert")
"""The built-in tiny model names (`model.name`)."""
HEADS = 4
"""Attention heads of every tiny model (the key/value width is hidden / HEADS)."""
_MODEL_CLASSES = {"tiny-t5": "T5ForConditionalGeneration", "tiny-llama": "LlamaForCausalLM",
                  "tiny-qwen2": "Qwen2ForCausalLM", "tiny-bert": "BertForSequenceClassification"}


def instantiate(name: str, model_config: PretrainedConfig) -> nn.Module:
    """A random-weight model of tiny model `name` from `model_config` (drawn from torch's global RNG)."""
    import transformers  # the model classes import slowly: configs alone (pre-flight checks) do without them

    return getattr(transformers, _MODEL_CLASSES[name])(model_config)


def config(name: str, vocab_size: int, ids: dict[str, int | None], num_labels: int = 2, hidden: int = 64,
           layers: int = 2, **changes: Any) -> PretrainedConfig:
    """The transformers config of tiny model `name`, built from `config_fields` (same arguments)."""
    from transformers import AutoConfig  # imports torch: only building a model needs the config object

    fields = config_fields(name, vocab_size, ids, num_labels, hidden, layers, **changes)
    return AutoConfig.for_model(fields.pop("model_type"), **fields)


def config_fields(name: str, vocab_size: int, ids: dict[str, int | None], num_labels: int = 2, hidden: int = 64,
                  layers: int = 2, **changes: Any) -> dict[str, Any]:
    """The config.json fields of tiny model `name`, `model_type` included (what pre-flight validation reads:
    depth, position limit).

    `hidden` sets the width (feed-forward 2 x hidden), `layers` the depth; `changes` set any other field
    of the transformers config (the tests' smaller position limit or larger initialiser scale).
    """
    if name == "tiny-t5":
        fields = {"model_type": "t5", "vocab_size": vocab_size, "d_model": hidden, "d_kv": hidden // HEADS,
                  "d_ff": 2 * hidden, "num_layers": layers, "num_heads": HEADS, "dropout_rate": 0.0,
                  "decoder_start_token_id": ids["pad_token_id"], "pad_token_id": ids["pad_token_id"],
                  "eos_token_id": ids["eos_token_id"]}
    elif name in ("tiny-llama", "tiny-qwen2"):
        fields = {"model_type": name.removeprefix("tiny-"), "vocab_size": vocab_size, "hidden_size": hidden,
                  "intermediate_size": 2 * hidden, "num_hidden_layers": layers, "num_attention_heads": HEADS,
                  "num_key_value_heads": 2, "max_position_embeddings": 1024, **ids}
    elif name == "tiny-bert":
        fields = {"model_type": "bert", "vocab_size": vocab_size, "hidden_size": hidden, "num_hidden_layers": layers,
                  "num_attention_heads": HEADS, "intermediate_size": 2 * hidden, "max_position_embeddings": 1024,
                  "num_labels": num_labels, "pad_token_id": ids["pad_token_id"], "hidden_dropout_prob": 0.0,
                  "attention_probs_dropout_prob": 0.0}
    else:
        raise ValueError(f"Unknown tiny model {name!r}; allowed: {', '.join(_MODEL_CLASSES)}.")
    return {**fields, **changes}
