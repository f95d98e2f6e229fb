"""Decoder-only LMs laid out like Llama (`base_model.layers`): Llama, Qwen2/3, Mistral, Gemma."""

from __future__ import annotations

from typing import TYPE_CHECKING

from capt.arch.base import ATTENTION, SEQUENCE, ArchSpec, AttentionSite

if TYPE_CHECKING:
    from torch import nn


def _decoder_layers(model: nn.Module) -> nn.ModuleList:
    return model.base_model.layers  # *ForCausalLM.base_model is the bare *Model


def _self_attention_sites(model: nn.Module) -> dict[str, list[AttentionSite]]:
    """One "decoder" stack; key/value heads are read off k_proj because of grouped-query attention."""
    sites = []
    for layer in _decoder_layers(model):
        attn = layer.self_attn
        head_dim = int(attn.head_dim)
        sites.append(AttentionSite(attn, attn.k_proj.out_features // head_dim, head_dim))
    return {"decoder": sites}


def _adapter_sites(model: nn.Module) -> dict[str, list[nn.Module]]:
    """Every layer's attention output projection `o_proj` and feed-forward down projection `down_proj`."""
    layers = _decoder_layers(model)
    return {"attention": [layer.self_attn.o_proj for layer in layers],
            "feed_forward": [layer.mlp.down_proj for layer in layers]}


SPEC = ArchSpec(
    family="decoder",
    model_types=frozenset({"llama", "qwen2", "qwen3", "mistral", "gemma", "gemma2"}),
    find_layers=_decoder_layers,
    output_axes=(("logits", SEQUENCE), ("hidden_states", SEQUENCE), ("attentions", ATTENTION)),
    attention_sites=_self_attention_sites,
    lora_targets=("q_proj", "v_proj"),
    mean_over_prompt=True,
    shifts_labels=True,
    generation_echoes_prompt=True,
    pad_with_eos=True,
    auto_model_class="AutoModelForCausalLM",
    adapter_sites=_adapter_sites,
)
