"""Architecture registry: one small spec per model family. A new family is one file and one line here."""

from __future__ import annotations

from torch import nn

from capt.arch import decoder, encoder, t5
from capt.arch.base import ArchSpec, strip_slots
from capt.errors import UnsupportedModelError

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


__all__ = ["ArchSpec", "REGISTRY", "spec_for", "strip_slots", "supported_model_types"]
