"""T5 family: capsules in the encoder blocks; the decoder is untouched and cross-attends to the slot."""

from torch import nn

from capt.arch.base import ATTENTION, CROSS_ATTENTION, SEQUENCE, ArchSpec, AttentionSite


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
    position_limit_key=None,  # relative position buckets: any length runs (`n_positions` is only a hint)
    encoder_decoder=True,
    auto_model_class="AutoModelForSeq2SeqLM",
    capsule_stack_name="encoder layers",
)
