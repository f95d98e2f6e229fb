"""Which models the baselines accept, and the structural summary stored with their artifacts.

Everything family-specific (model types, layer stacks, attention modules, LoRA targets) comes from the
`capt.arch` registry; this module only adds the baselines' view of it.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from capt.arch import REGISTRY, ArchSpec
from capt.errors import UnsupportedModelError


@dataclass(frozen=True)
class ModelInfo:
    """Structural summary of a supported base model."""

    family: str
    """``"t5"``, ``"decoder"`` or ``"encoder"`` (``ArchSpec.family``)."""
    model_type: str
    """``model.config.model_type``."""
    hidden_size: int
    """Width of the token embeddings (``d``)."""
    num_layers: int
    """Layers of the main stack (the encoder for T5)."""


def supported_types() -> list[str]:
    """All model types the baselines accept, sorted."""
    return sorted(t for spec in REGISTRY for t in spec.model_types if spec.accepts_baselines(t))


def baseline_spec(model: nn.Module) -> ArchSpec:
    """The ``capt.arch`` spec of ``model``; ``UnsupportedModelError`` (a ``ValueError``) if the baselines refuse it."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    spec = next((s for s in REGISTRY if s.accepts_baselines(model_type)), None)
    if spec is None:
        raise UnsupportedModelError(
            f"unsupported model_type {model_type!r} ({type(model).__name__}); "
            f"supported: {', '.join(supported_types())}"
        )
    return spec


def detect_family(model: nn.Module) -> str:
    """Return ``"t5"``, ``"decoder"`` or ``"encoder"`` for a supported model, else raise ``ValueError``."""
    return baseline_spec(model).family


def model_info(model: nn.Module) -> ModelInfo:
    """Describe ``model`` (family, type, hidden size, depth)."""
    spec = baseline_spec(model)
    return ModelInfo(family=spec.family, model_type=model.config.model_type,
                     hidden_size=spec.hidden_size(model), num_layers=spec.num_layers(model))
