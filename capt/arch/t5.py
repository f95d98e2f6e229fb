"""T5 family: capsules in the encoder blocks; the decoder is untouched and cross-attends to the slot."""

from __future__ import annotations

from typing import TYPE_CHECKING

from capt.arch.base import ATTENTION, CROSS_ATTENTION, SEQUENCE, ArchSpec, AttentionSite

if TYPE_CHECKING:
    from torch import nn


def _encoder_blocks(model: nn.Module) -> nn.ModuleList:
    return model.encoder.block  # T5ForConditionalGeneration, T5Model and T5EncoderModel alike


def _self_attention_sites(model: nn.Module) -> dict[str, list[AttentionSite]]:
    """Encoder and decoder self-attention (layer[0] of every block); T5EncoderModel has no decoder."""
    stacks: dict[str, list[AttentionSite]] = {}
    for name in ("encoder", "decoder"):
        stack = getattr(model, name, None)
        if stack is None:
            continue
        attentions = [block.layer[0].SelfAttention for block in stack.block]
        stacks[name] = [AttentionSite(a, a.n_heads, a.key_value_proj_dim) for a in attentions]
    return stacks


def _adapter_sites(model: nn.Module) -> dict[str, list[nn.Module]]:
    """Encoder and decoder blocks: self-attention `o` (layer[0]), cross-attention `o` (decoder layer[1]) and the
    feed-forward `wo` (the last layer; T5 v1.1 / mT5's gated feed-forward names it `wo` too)."""
    sites: dict[str, list[nn.Module]] = {"attention": [], "cross_attention": [], "feed_forward": []}
    for name in ("encoder", "decoder"):
        stack = getattr(model, name, None)
        for block in stack.block if stack is not None else ():
            sites["attention"].append(block.layer[0].SelfAttention.o)
            if block.is_decoder:
                sites["cross_attention"].append(block.layer[1].EncDecAttention.o)
            sites["feed_forward"].append(block.layer[-1].DenseReluDense.wo)
    return sites


SPEC = ArchSpec(
    family="t5",
    model_types=frozenset({"t5", "mt5", "umt5"}),
    find_layers=_encoder_blocks,
    output_axes=(
        ("encoder_last_hidden_state", SEQUENCE),
        ("last_hidden_state", SEQUENCE),  # T5EncoderModel
        ("encoder_hidden_states", SEQUENCE),
        ("hidden_states", SEQUENCE),  # T5EncoderModel
        ("encoder_attentions", ATTENTION),
        ("cross_attentions", CROSS_ATTENTION),
    ),
    attention_sites=_self_attention_sites,
    lora_targets=("q", "v"),
    # The baselines were written and tested for t5 and mt5 only; umt5 stays refused there until tested.
    baseline_types=frozenset({"t5", "mt5"}),
    layers_key="num_layers",
    position_limit_key=None,  # relative position buckets: any length runs (`n_positions` is only a hint)
    encoder_decoder=True,
    auto_model_class="AutoModelForSeq2SeqLM",
    capsule_stack_name="encoder layers",
    adapter_sites=_adapter_sites,
)
