"""`ResidualPromptConfig`: the options of Residual Prompt Tuning (no torch import)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from capt.baselines.config import PromptTuningConfig, _is_int
from capt.errors import Problems
from capt.optim_defaults import REPARAM_OTHER, OptimDefault, Setting, measured

_RESPROMPT_T5 = ("Residual Prompt Tuning (Razdaibiedina et al. 2023), the authors' code: AdamW at lr 0.3 (weight "
                 "decay 1e-5) for the prompt and the MLP on T5")


@dataclass(frozen=True)
class ResidualPromptConfig(PromptTuningConfig):
    """Residual Prompt Tuning: prompt P reparameterised as LayerNorm(W_up ReLU(W_down P)) + P during training."""

    method: ClassVar[str] = "residual_prompt"
    optim_defaults: ClassVar[dict[str, OptimDefault]] = {
        "t5": OptimDefault("adamw", 0.3, _RESPROMPT_T5),
        "decoder": OptimDefault("adamw", 1e-2, REPARAM_OTHER),
        "encoder": OptimDefault("adamw", 1e-2, measured(
            1e-2, "0.003, 0.01, 0.03", "under the authors' constant rate, weight decay 1e-5 and no clipping (COPA, "
            "under the earlier linear decay and clipping, chose 0.03)")),
    }
    provenance: ClassVar[tuple[Setting, ...]] = (
        Setting("prompt length, init", ("method.options.num_tokens", "method.options.init"),
                "Razdaibiedina et al. 2023 (main setting); arazd/ResidualPrompts (code)"),
        Setting("bottleneck", ("method.options.bottleneck",),
                "400 ours: DPT (Xiao et al. 2023) reports 925K parameters for the method on T5-Large, which 400 gives; "
                "the presets' 800 is the default of the authors' training script (arazd/ResidualPrompts)"),
        Setting("weight decay, schedule, warm-up, clipping",
                ("optim.weight_decay", "optim.schedule", "optim.warmup_ratio", "optim.max_grad_norm"),
                "arazd/ResidualPrompts `prompt_tuner2.py`: AdamW with weight decay 1e-5 at a constant rate, no "
                "warm-up, no gradient clipping"),
        Setting("batch, epochs", ("train.batch_size", "train.max_epochs"),
                "arazd/ResidualPrompts `README.md`: batch 8, 20 epochs; the presets keep the CaPT paper's batch 32 "
                "and 50 epochs, which every row of its table shares"),
    )
    training_defaults: ClassVar[dict[str, Any]] = {
        "optim.weight_decay": 1e-5, "optim.schedule": "constant", "optim.warmup_ratio": 0.0,
        "optim.max_grad_norm": None, "train.batch_size": 8, "train.max_epochs": 20}

    num_tokens: int = 10
    """Number of soft-prompt vectors (the paper's main setting is 10; it also reports 100)."""
    init: str = "vocab"
    """Initialisation of P: "vocab" (copies of randomly drawn token embeddings, as the paper's code) or "normal"."""
    bottleneck: int = 400
    """Width of the MLP's bottleneck (down-projection d -> bottleneck, up-projection bottleneck -> d); 400 matches the
    one published count (DPT's 925K on T5-Large), the authors' script default is 800."""
    merged: bool = False
    """True when the MLP is already folded into the prompt (P' stored, no MLP): what a saved artifact records."""

    def _validate(self, check: Problems) -> None:
        super()._validate(check)
        check.require(_is_int(self.bottleneck) and self.bottleneck >= 1, "bottleneck", self.bottleneck,
                      "integer >= 1")
        check.require(isinstance(self.merged, bool), "merged", self.merged,
                      "true or false (true: a trained artifact whose MLP is folded into the prompt)")
