"""T5 family: capsules in the encoder blocks; the decoder is untouched and cross-attends to the slot."""

from torch import nn

from capt.arch.base import ATTENTION, CROSS_ATTENTION, SEQUENCE, ArchSpec


def _encoder_blocks(model: nn.Module) -> nn.ModuleList:
    return model.encoder.block  # T5ForConditionalGeneration, T5Model and T5EncoderModel alike


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
)
