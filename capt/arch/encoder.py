"""Encoder-only BERT family: capsules in every encoder layer, inserted after [CLS]."""

from torch import nn

from capt.arch.base import ATTENTION, SEQUENCE, TOKEN_LOGITS, ArchSpec


def _encoder_layers(model: nn.Module) -> nn.ModuleList:
    return model.base_model.encoder.layer  # BertModel and every Bert*For* head model


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
    slot_offset=1,
)
