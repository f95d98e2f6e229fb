"""Architecture registry: one small spec per model family. A new family is one file and one line here."""

from __future__ import annotations

from typing import TYPE_CHECKING

from capt.arch import decoder, encoder, t5
from capt.arch.base import ArchSpec, AttentionSite, strip_slots
from capt.errors import UnsupportedModelError

if TYPE_CHECKING:  # configuration validation reads the registry and must not import torch
    from torch import nn

REGISTRY: tuple[ArchSpec, ...] = (t5.SPEC, decoder.SPEC, encoder.SPEC)


def supported_model_types() -> list[str]:
    """Every `config.model_type` that `capt` can host capsules in."""
    return sorted(t for spec in REGISTRY for t in spec.model_types)


def spec_for(model: nn.Module) -> ArchSpec:
    """The spec serving `model`, or an error listing the supported model types."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    for spec in REGISTRY:
        if model_type in spec.model_types:
            return spec
    raise UnsupportedModelError(
        f"Model {type(model).__name__} (model_type={model_type!r}) is not supported by capt; "
        f"supported model types: {', '.join(supported_model_types())}."
    )


def spec_for_model_type(model_type: str) -> ArchSpec | None:
    """The spec serving a `config.model_type` (read from a config alone, no model built), None when unsupported."""
    return next((spec for spec in REGISTRY if model_type in spec.model_types), None)


def head_parameters(model: nn.Module) -> list[nn.Parameter]:
    """Task-head parameters outside the backbone (BERT classifiers' `classifier`); empty for LMs.

    Encoder-only classifiers train a linear head with every method; language-model heads stay frozen.
    """
    if not spec_for(model).classifier_head or model.base_model is model:
        return []
    backbone = {id(p) for p in model.base_model.parameters()}
    return [p for p in model.parameters() if id(p) not in backbone]


__all__ = ["ArchSpec", "AttentionSite", "REGISTRY", "head_parameters", "spec_for",
           "spec_for_model_type", "strip_slots", "supported_model_types"]
