"""`ArchSpec`: what `capt` needs to know about one model family, and nothing else."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the specs are read by configuration validation, which must not import torch
    import torch
    from torch import nn

# The three ways a family's outputs carry the capsule-bearing sequence axis.
SEQUENCE = "sequence"  # (B, L, ...) -> slice dim 1
ATTENTION = "attention"  # (B, H, L, L) -> slice dims 2 and 3
CROSS_ATTENTION = "cross_attention"  # (B, H, T_dec, L) -> slice dim 3
TOKEN_LOGITS = "token_logits"  # (B, L, C) when 3-D, untouched when (B, C)


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
class ArchSpec:
    """How one model family is laid out: where its layers and self-attention modules are, which outputs
    carry the slot, and the defaults the baselines (`capt.baselines`) need."""

    family: str
    """Family name: "t5" (encoder-decoder), "decoder" (decoder-only LM) or "encoder" (BERT-like)."""
    model_types: frozenset[str]
    """`config.model_type` values this spec serves."""
    find_layers: Callable[[nn.Module], nn.ModuleList]
    """Returns the layer stack that hosts capsules (T5: the encoder blocks)."""
    output_axes: tuple[tuple[str, str], ...]
    """(output field, axis kind) pairs from which the capsule slots are removed."""
    attention_sites: Callable[[nn.Module], dict[str, list[AttentionSite]]]
    """Self-attention modules per stack name (T5: "encoder" and "decoder"), for P-Tuning v2's prefixes.

    Cross-attention modules are deliberately absent (P-Tuning v2 prefixes self-attention only)."""
    lora_targets: tuple[str, ...]
    """Names of the linear modules LoRA adapts when its config names none (the query and value projections)."""
    slot_offset: int = 0
    """Token position where the slots are inserted (BERT: 1, after [CLS], so the pooler still reads [CLS])."""
    mean_over_prompt: bool = False
    """True when the instance mean covers the prompt only (decoder-only: answers must never leak)."""
    shifts_labels: bool = False
    """True when `labels` are aligned with `input_ids` and shifted inside the model (causal LM loss)."""
    classifier_head: bool = False
    """True when the model classifies with a task head (BERT `*ForSequenceClassification`): it trains with
    cross-entropy on its logits, takes no `labels` in `forward`, and never generates text."""
    encoder_decoder: bool = False
    """True when a separate decoder reads the encoder's states (T5): `labels` build the decoder inputs, so
    scoring an answer passes them to `forward`, and `encoder_outputs` may stand in for `input_ids`."""
    generation_echoes_prompt: bool = False
    """True when `generate` returns prompt + new tokens and the new tokens take positions after the prompt
    (decoder-only LMs)."""
    pad_with_eos: bool = False
    """True when a tokenizer without a pad token pads with its EOS token (decoder-only LMs ship without one)."""
    auto_model_class: str = "AutoModel"
    """The `transformers` Auto class that loads a checkpoint of this family for the tasks."""
    capsule_stack_name: str = "layers"
    """What messages call the layer stack that hosts capsules (T5: "encoder layers")."""
    baseline_types: frozenset[str] | None = None
    """The `model_types` the baselines accept; None: all of them."""
    layers_key: str = "num_hidden_layers"
    """config.json field holding the depth of the capsule stack (T5: `num_layers`, the encoder's depth, which
    transformers' T5 config also answers to as `num_hidden_layers`)."""
    position_limit_key: str | None = "max_position_embeddings"
    """config.json field holding the longest sequence the model has positions for; None: no hard limit (T5's
    relative position buckets)."""
    adapter_sites: Callable[[nn.Module], dict[str, list[nn.Module]]] | None = None
    """Per sub-layer kind ("attention", "cross_attention", "feed_forward"), the output projections of that
    sub-layer in every stack (encoder and decoder alike): bottleneck adapters (Houlsby et al. 2019) transform
    their outputs, before the residual add. None: the family has no adapter placement."""

    def hidden_size(self, model: nn.Module) -> int:
        """Width d of the hidden states (T5 maps `hidden_size` to `d_model`)."""
        return int(model.config.hidden_size)

    def num_layers(self, model: nn.Module) -> int:
        """Depth of the stack that `find_layers` returns (T5: the encoder)."""
        return len(self.find_layers(model))

    def layers_in_config(self, config: Mapping[str, Any]) -> int:
        """Depth of the capsule stack read off a model's config.json fields, no weights needed (equals `num_layers`);
        ValueError when the field is missing."""
        if self.layers_key not in config:
            raise ValueError(f"it has no {self.layers_key!r}, the depth of a {self.family} model's "
                             f"{self.capsule_stack_name}")
        return int(config[self.layers_key])

    def position_limit(self, config: Mapping[str, Any]) -> int | None:
        """Longest input sequence (slots and virtual tokens included) a model's config.json fields give it positions
        for, or None."""
        if self.position_limit_key is None:
            return None
        value = config.get(self.position_limit_key)
        return int(value) if value else None

    def accepts_baselines(self, model_type: str) -> bool:
        """Whether the baseline methods accept `model_type` (a subset of `model_types`)."""
        allowed = self.model_types if self.baseline_types is None else self.baseline_types
        return model_type in allowed


def strip_slots(output, spec: ArchSpec, start: int, stop: int):
    """Remove positions [start, stop) from every slot-bearing field of a model output, in place."""
    for name, axis in spec.output_axes:
        value = getattr(output, name, None)
        if value is None:
            continue
        if isinstance(value, tuple):
            value = tuple(_strip(v, axis, start, stop) for v in value)
        else:
            value = _strip(value, axis, start, stop)
        output[name] = value
    return output


def _drop(tensor: torch.Tensor, dim: int, start: int, stop: int) -> torch.Tensor:
    """`tensor` without positions [start, stop) of `dim`; a view (no copy of the logits) when start == 0."""
    import torch

    if start == 0:
        return tensor.narrow(dim, stop, tensor.shape[dim] - stop)
    return torch.cat([tensor.narrow(dim, 0, start), tensor.narrow(dim, stop, tensor.shape[dim] - stop)], dim=dim)


def _strip(tensor: torch.Tensor, axis: str, start: int, stop: int) -> torch.Tensor:
    if axis == SEQUENCE or (axis == TOKEN_LOGITS and tensor.dim() == 3):
        return _drop(tensor, 1, start, stop)
    if axis == ATTENTION:
        return _drop(_drop(tensor, 2, start, stop), 3, start, stop)
    if axis == CROSS_ATTENTION:
        return _drop(tensor, 3, start, stop)
    return tensor


def normalisation_modules(model: nn.Module) -> dict[str, nn.Module]:
    """Every layer-norm module of `model` by its path: `nn.LayerNorm` and the families' own classes (T5LayerNorm,
    LlamaRMSNorm, ...), recognised by their class name so a new family needs no entry."""
    from torch import nn

    return {name: module for name, module in model.named_modules()
            if isinstance(module, nn.LayerNorm) or type(module).__name__.endswith(("LayerNorm", "RMSNorm"))}
