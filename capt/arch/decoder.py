"""Decoder-only LMs laid out like Llama (`base_model.layers`): Llama, Qwen2/3, Mistral, Gemma."""

from torch import nn

from capt.arch.base import ATTENTION, SEQUENCE, ArchSpec


def _decoder_layers(model: nn.Module) -> nn.ModuleList:
    return model.base_model.layers  # *ForCausalLM.base_model is the bare *Model


SPEC = ArchSpec(
    family="decoder",
    model_types=frozenset({"llama", "qwen2", "qwen3", "mistral", "gemma", "gemma2"}),
    find_layers=_decoder_layers,
    output_axes=(("logits", SEQUENCE), ("hidden_states", SEQUENCE), ("attentions", ATTENTION)),
    mean_over_prompt=True,
    shifts_labels=True,
)
