"""LoRA through PEFT (imported lazily: ``import peft`` is slow).

PEFT's LoRA is correct with transformers 5.x for T5, decoder-only and BERT models: it replaces the targeted
``nn.Linear`` modules in place, so the wrapper calls the (modified) Hugging Face model directly for
``forward`` and ``generate``. No ``task_type`` is given, so PEFT adds no ``modules_to_save``: classification
heads stay frozen (the training job unfreezes heads itself). Artifacts use this package's own format
(safetensors + JSON), not PEFT's ``save_pretrained``.
"""

from __future__ import annotations

import logging
from typing import Any

from torch import nn

from capt.baselines.adapted import AdaptedModel
from capt.baselines.config import LoraConfig

logger = logging.getLogger(__name__)

ADAPTER_NAME = "default"


class LoraModel(AdaptedModel):
    """LoRA wrapper around a PEFT-injected model; only the LoRA matrices train."""

    def __init__(self, base: nn.Module, config: LoraConfig) -> None:
        super().__init__(base, config)
        import peft  # lazy: about 5 s on a cold start

        targets = list(config.target_modules or self.spec.lora_targets)
        peft_config = peft.LoraConfig(r=config.r, lora_alpha=config.alpha, lora_dropout=config.dropout,
                                      target_modules=targets, bias="none")
        self.freeze_base()
        peft_model = peft.get_peft_model(base, peft_config, adapter_name=ADAPTER_NAME)
        # Keep the PeftModel out of the module tree (self.base already holds the injected layers).
        object.__setattr__(self, "_peft_model", peft_model)
        logger.info("LoRA r=%d alpha=%s on %s %s (%d trainable parameters)", config.r, config.alpha,
                    self.info.model_type, targets, self.num_trainable_parameters())

    @property
    def peft_model(self) -> Any:
        """The ``peft.PeftModel`` (for PEFT's own utilities, e.g. ``get_nb_trainable_parameters``)."""
        return self._peft_model

    def adapter_parameters(self) -> dict[str, nn.Parameter]:
        """The LoRA A/B matrices, named by their path in the base model."""
        return {name: p for name, p in self.base.named_parameters() if ".lora_" in name}

    def _release(self) -> None:
        self._peft_model.unload()  # removes the LoRA layers without merging them
