"""EPT's typed config (no torch import: config validation stays light)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from capt.baselines.config import _is_int
from capt.baselines.dept.config import DEPT_T5, DeptConfig
from capt.errors import Problems
from capt.optim_defaults import SMALL_STATES, OptimDefault, Setting, measured

_EPT_T5 = ("not tuned: EPT's (Lan et al. 2025) learning rates could not be read; DePT's T5-Base values, whose "
           "decomposition EPT builds on: " + DEPT_T5)


@dataclass(frozen=True)
class EPTConfig(DeptConfig):
    """EPT: DePT's short prompt and low-rank input-embedding offset, plus prompt fusion and multi-space projection."""

    method: ClassVar[str] = "ept"
    optim_defaults: ClassVar[dict[str, OptimDefault]] = {
        "t5": OptimDefault("adamw", 0.3, _EPT_T5),
        "decoder": OptimDefault("adamw", 1e-2, SMALL_STATES + "; the soft prompt's lr, as for DePT"),
        "encoder": OptimDefault("adamw", 3e-3, measured(
            3e-3, "0.003, 0.01, 0.03", "with DePT's text init, tied on validation with 0.01 (66.22 each; the tie "
            "goes to the first listed); COPA, under the earlier N(0, 0.02) init, chose 0.03. The soft prompt's lr, as "
            "for DePT")),
    }
    provenance: ClassVar[tuple[Setting, ...]] = (
        Setting("sizes", ("method.options.num_tokens", "method.options.rank", "method.options.num_spaces",
                          "method.options.space_rank"),
                "not determined: EPT's (Lan et al. 2025) own sizes could not be read here; DePT's m, r plus 4 gated "
                "subspaces of rank 4"),
        Setting("prompt init", ("method.options.init",), "DePT's text init, which EPT builds on (ours)"),
        Setting("schedule, warm-up", ("optim.schedule", "optim.warmup_ratio"),
                "DePT's (500 / 40,000 steps of warm-up), which EPT builds on (ours)"),
    )
    training_defaults: ClassVar[dict[str, Any]] = {"method.options.init": "text", "optim.warmup_ratio": 0.0125}

    num_spaces: int = 4
    """Number of subspaces the fused prompt is projected into (multi-space projection)."""
    space_rank: int = 4
    """Rank of each subspace's projection (d -> space_rank -> d)."""

    def _validate(self, check: Problems) -> None:
        super()._validate(check)
        for key in ("num_spaces", "space_rank"):
            value = getattr(self, key)
            check.require(_is_int(value) and value >= 1, key, value, "integer >= 1")
