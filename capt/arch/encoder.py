"""Encoder-only BERT family: capsules in every encoder layer, inserted after [CLS]."""

from __future__ import annotations

from typing import TYPE_CHECKING

from capt.arch.base import ATTENTION, SEQUENCE, TOKEN_LOGITS, ArchSpec, AttentionSite

if TYPE_CHECKING:
    from torch import nn


def _encoder_layers(model: nn.Module) -> nn.ModuleList:
    return model.base_model.encoder.layer  # BertModel and every Bert*For* head model


def _self_attention_sites(model: nn.Module) -> dict[str, list[AttentionSite]]:
    """One "encoder" stack of `attention.self` modules."""
    sites = []
    for layer in _encoder_layers(model):
        attn = layer.attention.self
        sites.append(AttentionSite(attn, attn.num_attention_heads, attn.attention_head_size))
    return {"encoder": sites}


def _adapter_sites(model: nn.Module) -> dict[str, list[nn.Module]]:
    """Every layer's `attention.output.dense` and `output.dense`: the projections before dropout, the residual
    add and LayerNorm (Houlsby et al.'s placement in BERT)."""
    layers = _encoder_layers(model)
    return {"attention": [layer.attention.output.dense for layer in layers],
            "feed_forward": [layer.output.dense for layer in layers]}


SPEC = ArchSpec(
    family="encoder",
    model_types=frozenset({"bert", "roberta"}),
    find_layers=_encoder_layers,
    output_axes=(
        ("last_hidden_state", SEQUENCE),
        ("hidden_states", SEQUENCE),
        ("attentions", ATTENTION),
        ("logits", TOKEN_LOGITS),
    ),
    attention_sites=_self_attention_sites,
    lora_targets=("query", "value"),
    slot_offset=1,
    classifier_head=True,
    auto_model_class="AutoModelForSequenceClassification",
    adapter_sites=_adapter_sites,
)
