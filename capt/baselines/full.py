"""Full fine-tuning: an identity wrapper in which every base-model parameter trains."""

from __future__ import annotations

import logging

from torch import nn

from capt.baselines.adapted import AdaptedModel
from capt.baselines.config import FullFinetuneConfig

logger = logging.getLogger(__name__)


class FullFinetuneModel(AdaptedModel):
    """All parameters trainable; forward and generate are the base model's."""

    def __init__(self, base: nn.Module, config: FullFinetuneConfig) -> None:
        super().__init__(base, config)
        for param in base.parameters():
            param.requires_grad_(True)
        logger.info("full fine-tuning of %s (%d parameters)", self.info.model_type, self.num_trainable_parameters())

    def adapter_parameters(self) -> dict[str, nn.Parameter]:
        """Every base parameter (tied weights once), named by its path in the base model."""
        return dict(self.base.named_parameters())
