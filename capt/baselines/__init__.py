"""Baselines of the CaPT paper behind one interface: prompt tuning, P-Tuning v2, LoRA, full fine-tuning, and (one
folder each, PEFT-style: ``<method>/config.py`` + ``<method>/model.py``) Adapter, DePT, EPT, ResPrompt, SMoP,
SuperPos-Prompt, VFPT and XPrompt.

    from capt.baselines import METHODS, apply, load_adapter
    adapted = apply(model, METHODS["ptuning_v2"](num_tokens=20))
    loss = adapted(input_ids=..., attention_mask=..., labels=...).loss
    optimizer = torch.optim.AdamW(adapted.trainable_parameters())
    adapted.save_adapter("out/adapter"); model = adapted.detach()
    adapted = load_adapter(model, "out/adapter")

Supported models: the T5, decoder-only and BERT-classifier families of the ``capt.arch`` registry, which holds all
their structural knowledge (``supported_types()`` lists the model types). ``apply`` freezes the base model except
the method's parameters (full fine-tuning freezes nothing); classification heads are left to the caller. Every
wrapper's forward and generate accept an optional ``prompt_mask`` (B, n) marking the prompt tokens of decoder-only
inputs; only prompt tuning's instance token uses it (else it falls back to labels == -100, then the attention mask).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from capt.baselines.config import (
    BaselineConfig,
    FullFinetuneConfig,
    LoraConfig,
    PromptTuningConfig,
    PTuningV2Config,
)
from capt.errors import AdapterError, UnknownConfigError

if TYPE_CHECKING:
    from torch import nn

    from capt.baselines.adapted import AdaptedModel

_LAZY = {"AdaptedModel": "capt.baselines.adapted", "detect_family": "capt.baselines.info",
         "model_info": "capt.baselines.info", "supported_types": "capt.baselines.info",
         "load_adapter": "capt.baselines.adapted"}
"""Torch-backed names, imported on first use: the configs (all that config validation needs) stay light."""


def apply(model: nn.Module, config: BaselineConfig) -> AdaptedModel:
    """Wrap ``model`` with the baseline method that ``config``'s type selects."""
    from capt.methods import apply_method

    if not isinstance(config, BaselineConfig):
        raise UnknownConfigError(f"unknown baseline config {type(config).__name__}; expected one of "
                                 f"{[c.__name__ for c in _baseline_configs().values()]}")
    return apply_method(model, config)


def _baseline_configs() -> dict[str, type[BaselineConfig]]:
    from capt.baselines.adapted import AdaptedModel
    from capt.methods import METHODS

    return {name: m.config_class for name, m in METHODS.items() if issubclass(m.model_class, AdaptedModel)}


def __getattr__(name: str) -> Any:
    """``METHODS`` (baseline method name -> config class, read off the one registry, ``capt.methods``) and the
    torch-backed names of `_LAZY`."""
    if name == "METHODS":
        return _baseline_configs()
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'capt.baselines' has no attribute {name!r}")


__all__ = [
    "METHODS", "AdaptedModel", "AdapterError", "BaselineConfig", "FullFinetuneConfig", "LoraConfig",
    "PTuningV2Config", "PromptTuningConfig", "apply", "detect_family", "load_adapter", "model_info",
    "supported_types",
]
