"""EPT's typed config (no torch import: config validation stays light)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from capt.baselines.config import PromptTuningConfig, _is_int
from capt.errors import Problems


@dataclass(frozen=True)
class EPTConfig(PromptTuningConfig):
    """EPT: a short soft prompt, a low-rank update of the input embeddings, prompt fusion, multi-space projection."""

    method: ClassVar[str] = "ept"

    num_tokens: int = 60
    """Length of the short soft prompt (the positions every input gains)."""
    rank: int = 30
    """Rank r of the input-embedding update A (max_positions x r) B (r x d)."""
    max_positions: int = 256
    """Input positions the low-rank update covers (rows of A); later positions are not updated."""
    num_spaces: int = 4
    """Number of subspaces the fused prompt is projected into (multi-space projection)."""
    space_rank: int = 4
    """Rank of each subspace's projection (d -> space_rank -> d)."""

    def _validate(self, check: Problems) -> None:
        super()._validate(check)
        for key in ("rank", "max_positions", "num_spaces", "space_rank"):
            value = getattr(self, key)
            check.require(_is_int(value) and value >= 1, key, value, "integer >= 1")
