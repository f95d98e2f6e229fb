"""`DeptConfig`: the options of decomposed prompt tuning (no torch import: config validation stays light)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from capt.baselines.config import PromptTuningConfig, _is_int, _is_real
from capt.errors import Problems


@dataclass(frozen=True)
class DeptConfig(PromptTuningConfig):
    """DePT: a soft prompt of `num_tokens` plus a low-rank offset A B of the first `max_length` input embeddings."""

    method: ClassVar[str] = "dept"

    num_tokens: int = 60
    """Length m of the soft prompt (DePT's T5-Base default: 60 of the 100-token prompt-tuning budget)."""
    rank: int = 30
    """Rank r of the offset A (max_length x r) B (r x d): 60 x 768 + 30 x (256 + 768) = 76,800, prompt tuning's
    budget at 100 tokens on T5-Base."""
    max_length: int = 256
    """Input positions s that get an offset (the paper's maximum input length); later positions get none."""
    alpha: float = 8.0
    """Scaling numerator: the offset is (alpha / sqrt(rank)) A B, as in the authors' code (lora_alpha 8)."""
    embedding_lr: float = 5e-4
    """Learning rate of A and B (the soft prompt trains at the job's optim.lr): DePT's second learning rate
    (the authors search {1e-4, 5e-4, 1e-3, 5e-3} on T5-Base)."""

    def _validate(self, check: Problems) -> None:
        super()._validate(check)
        check.require(_is_int(self.rank) and self.rank >= 1, "rank", self.rank, "integer >= 1")
        check.require(_is_int(self.max_length) and self.max_length >= 1, "max_length", self.max_length,
                      "integer >= 1")
        check.require(_is_real(self.alpha) and self.alpha > 0, "alpha", self.alpha, "finite number > 0")
        check.require(_is_real(self.embedding_lr) and self.embedding_lr > 0, "embedding_lr", self.embedding_lr,
                      "finite number > 0")
