"""Model-family detection and the per-family structural facts the baselines need.

This is the one place in ``capt.baselines`` that knows how T5, decoder-only (Llama, Qwen2, ...) and
BERT-family models are laid out: which family a model belongs to, its hidden size and depth, and where
its self-attention modules live. (The project's ``capt.arch`` registry may replace this module later.)
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

T5_TYPES = frozenset({"t5", "mt5"})
DECODER_TYPES = frozenset({"llama", "qwen2", "qwen3", "mistral", "gemma", "gemma2"})
ENCODER_TYPES = frozenset({"bert", "roberta"})
FAMILIES = ("t5", "decoder", "encoder")


@dataclass(frozen=True)
class AttentionSite:
    """One self-attention module and the shape of the keys/values it produces."""

    module: nn.Module
    """The attention module (the first argument transformers passes to the attention function)."""
    num_kv_heads: int
    """Number of key/value heads (fewer than query heads under grouped-query attention)."""
    head_dim: int
    """Width of one head."""


@dataclass(frozen=True)
class ModelInfo:
    """Structural summary of a supported base model."""

    family: str
    """One of ``FAMILIES``."""
    model_type: str
    """``model.config.model_type``."""
    hidden_size: int
    """Width of the token embeddings (``d``)."""
    num_layers: int
    """Layers of the main stack (the encoder for T5)."""


def supported_types() -> list[str]:
    """All model types the baselines accept, sorted."""
    return sorted(T5_TYPES | DECODER_TYPES | ENCODER_TYPES)


def detect_family(model: nn.Module) -> str:
    """Return ``"t5"``, ``"decoder"`` or ``"encoder"`` for a supported model, else raise ``ValueError``."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type in T5_TYPES:
        return "t5"
    if model_type in DECODER_TYPES:
        return "decoder"
    if model_type in ENCODER_TYPES:
        return "encoder"
    raise ValueError(
        f"unsupported model_type {model_type!r} ({type(model).__name__}); supported: {', '.join(supported_types())}"
    )


def model_info(model: nn.Module) -> ModelInfo:
    """Describe ``model`` (family, type, hidden size, depth)."""
    family = detect_family(model)
    config = model.config
    if family == "t5":
        hidden, layers = config.d_model, config.num_layers
    else:
        hidden, layers = config.hidden_size, config.num_hidden_layers
    return ModelInfo(family=family, model_type=config.model_type, hidden_size=int(hidden), num_layers=int(layers))


def _t5_sites(model: nn.Module) -> dict[str, list[AttentionSite]]:
    stacks: dict[str, list[AttentionSite]] = {}
    for name in ("encoder", "decoder"):
        stack = getattr(model, name, None)
        if stack is None:
            continue
        sites = []
        for block in stack.block:
            attn = block.layer[0].SelfAttention
            sites.append(AttentionSite(attn, attn.n_heads, attn.key_value_proj_dim))
        stacks[name] = sites
    return stacks


def _decoder_sites(model: nn.Module) -> dict[str, list[AttentionSite]]:
    sites = []
    for layer in model.model.layers:
        attn = layer.self_attn
        head_dim = int(attn.head_dim)
        sites.append(AttentionSite(attn, attn.k_proj.out_features // head_dim, head_dim))
    return {"decoder": sites}


def _encoder_sites(model: nn.Module) -> dict[str, list[AttentionSite]]:
    sites = []
    for layer in model.base_model.encoder.layer:
        attn = layer.attention.self
        sites.append(AttentionSite(attn, attn.num_attention_heads, attn.attention_head_size))
    return {"encoder": sites}


def attention_sites(model: nn.Module) -> dict[str, list[AttentionSite]]:
    """Self-attention modules per stack: T5 ``encoder`` + ``decoder``, decoder-only ``decoder``, BERT ``encoder``.

    Cross-attention modules are deliberately absent (P-Tuning v2 prefixes self-attention only).
    """
    family = detect_family(model)
    if family == "t5":
        return _t5_sites(model)
    if family == "decoder":
        return _decoder_sites(model)
    return _encoder_sites(model)
