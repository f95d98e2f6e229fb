"""EPT's typed config (no torch import: config validation stays light)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from capt.baselines.config import _is_int
from capt.baselines.dept.config import DeptConfig
from capt.errors import Problems


@dataclass(frozen=True)
class EPTConfig(DeptConfig):
    """EPT: DePT's short prompt and low-rank input-embedding offset, plus prompt fusion and multi-space projection."""

    method: ClassVar[str] = "ept"

    num_spaces: int = 4
    """Number of subspaces the fused prompt is projected into (multi-space projection)."""
    space_rank: int = 4
    """Rank of each subspace's projection (d -> space_rank -> d)."""

    def _validate(self, check: Problems) -> None:
        super()._validate(check)
        for key in ("num_spaces", "space_rank"):
            value = getattr(self, key)
            check.require(_is_int(value) and value >= 1, key, value, "integer >= 1")
