"""SMoP's typed config (no torch import: config validation stays light)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from capt.baselines.config import PromptTuningConfig, _is_int, _is_real
from capt.errors import Problems
from capt.optim_defaults import SMALL_STATES, OptimDefault, Setting, measured

ROUTINGS = ("per_input", "batch_broadcast")
"""SMoP routing variants: the paper's per-input prompt, or the released code's batch-wide sum."""
_SMOP_T5 = ("SMoP (Choi et al. 2023; its code's README command for T5-base SuperGLUE): Adafactor at lr 0.5, "
            "weight decay 1e-5, batch 32, 50 epochs, 6 % linear warm-up")


@dataclass(frozen=True)
class SMoPConfig(PromptTuningConfig):
    """SMoP: ``num_prompts`` soft prompts of ``num_tokens`` vectors; a linear router picks one per input."""

    method: ClassVar[str] = "smop"
    optim_defaults: ClassVar[dict[str, OptimDefault]] = {
        "t5": OptimDefault("adafactor", 0.5, _SMOP_T5),
        "decoder": OptimDefault("adamw", 1e-2, SMALL_STATES),
        "encoder": OptimDefault("adamw", 3e-2, measured(
            3e-2, "0.003, 0.01, 0.03", "under the authors' weight decay 1e-5 and no clipping, by 0.003 points of mean "
            "validation over 0.003 (COPA, under the earlier settings, chose 0.003)")),
    }
    provenance: ClassVar[tuple[Setting, ...]] = (
        Setting("prompts x length", ("method.options.num_prompts", "method.options.num_tokens"),
                "Choi et al. 2023; jyjohnchoi/SMoP `README.md` command"),
        Setting("prompt init", ("method.options.init", "method.options.init_std"),
                "jyjohnchoi/SMoP `peft_models/tuners/prompt_routing.py` (`nn.Embedding` default, N(0, 1))"),
        Setting("router noise, routing", ("method.options.router_noise", "method.options.routing"),
                "noise: Choi et al. 2023, Section 2.3 (`GaussianNoise`, relative to the logits, training only); "
                "per-input routing: the paper's equations (a prediction must not depend on its batch), where the "
                "released code sums the batch's chosen prompts (`routing: batch_broadcast`)"),
        Setting("weight decay, clipping", ("optim.weight_decay", "optim.max_grad_norm"),
                "jyjohnchoi/SMoP `scripts/train.py`: weight decay 1e-5, no gradient clipping"),
    )
    training_defaults: ClassVar[dict[str, Any]] = {"optim.weight_decay": 1e-5, "optim.max_grad_norm": None}

    num_tokens: int = 5
    """Length of each soft prompt (the positions every input gains)."""
    num_prompts: int = 4
    """Number of soft prompts the router chooses from."""
    init_std: float = 1.0
    """Standard deviation of the prompts' N(0, init_std) initialisation (the authors' code: nn.Embedding's N(0, 1))."""
    router_noise: float = 1.0
    """Scale of the router perturbation in training: logits + router_noise * N(0, 1) * logits (0: none)."""
    routing: str = "per_input"
    """"per_input": row b gets p_b P_{j_b} (the paper's equations); "batch_broadcast": row b gets
    p_b sum_b' P_{j_b'}, the sum of the whole batch's chosen prompts (the released code, for reproduction)."""

    def _validate(self, check: Problems) -> None:
        super()._validate(check)
        check.require(_is_int(self.num_prompts) and self.num_prompts >= 1, "num_prompts", self.num_prompts,
                      "integer >= 1")
        check.require(_is_real(self.router_noise) and self.router_noise >= 0, "router_noise", self.router_noise,
                      "finite number >= 0 (0: no perturbation)")
        check.require(self.routing in ROUTINGS, "routing", self.routing, f"one of {list(ROUTINGS)}")
