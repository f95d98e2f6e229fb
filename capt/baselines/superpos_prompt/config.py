"""`SuperPosPromptConfig`: the options of SuperPos-Prompt (no torch import)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from capt.baselines.config import BaselineConfig, _is_int
from capt.errors import Problems
from capt.optim_defaults import REPARAM_OTHER, OptimDefault, Setting, measured

_SUPERPOS_T5 = ("not tuned: SuperPos-Prompt (Sadraei Javaheri et al. 2024) gives no lr we could confirm; the "
                "prompt-tuning T5 value (Lester et al. 2021: Adafactor at lr 0.3)")


@dataclass(frozen=True)
class SuperPosPromptConfig(BaselineConfig):
    """SuperPos-Prompt: prompt token i = sum_j w_ij (e_j + dE_ij) over `num_sampled` sampled vocabulary embeddings."""

    method: ClassVar[str] = "superpos_prompt"
    optim_defaults: ClassVar[dict[str, OptimDefault]] = {
        "t5": OptimDefault("adafactor", 0.3, _SUPERPOS_T5),
        "decoder": OptimDefault("adamw", 1e-2, REPARAM_OTHER),
        "encoder": OptimDefault("adamw", 3e-2, measured(0.03, "0.003, 0.01, 0.03", "with issue 33's per-token "
                                                        "dE_i; COPA chose 0.003 under the old defaults")),
    }
    provenance: ClassVar[tuple[Setting, ...]] = (
        Setting("prompt length, sampled embeddings", ("method.options.num_tokens", "method.options.num_sampled"),
                "Sadraei Javaheri et al. 2024 (its ablation over m plateaus at 128)"),
        Setting("parameterisation", ("method.options.train_embeddings", "method.options.shared_embeddings"),
                "Sadraei Javaheri et al. 2024: p_i = w_i (E + dE_i), each token its own change dE_i"),
        Setting("base dropout", ("method.options.base_dropout",),
                "Sadraei Javaheri et al. 2024: the frozen model's dropout off"),
    )

    num_tokens: int = 10
    """Number of soft-prompt vectors (the paper uses 10)."""
    instance_token: bool = False
    """Add one training-free token whose embedding is the masked mean of the input token embeddings."""
    num_sampled: int = 128
    """m: vocabulary embeddings sampled (without replacement) and superposed into every prompt token."""
    train_embeddings: bool = True
    """Train changes of the sampled embeddings too (the paper does); false keeps them at the vocabulary's values."""
    shared_embeddings: bool = False
    """False (the paper): every prompt token has its own zero-initialised change dE_i of the frozen sampled
    embeddings; true: one trained copy of the embeddings shared by all tokens (used when train_embeddings is true)."""
    sample_seed: int = 0
    """Seed of the draw of the m token ids (the ids are also stored in the artifact)."""
    base_dropout: bool = False
    """Keep the frozen base model's dropout during training; false keeps the base in eval mode (the paper's advice)."""

    def _validate(self, check: Problems) -> None:
        check.require(_is_int(self.num_tokens) and self.num_tokens >= 1, "num_tokens", self.num_tokens,
                      "integer >= 1")
        check.require(isinstance(self.instance_token, bool), "instance_token", self.instance_token,
                      "true or false")
        check.require(_is_int(self.num_sampled) and self.num_sampled >= 1, "num_sampled", self.num_sampled,
                      "integer >= 1 (at most the vocabulary size)")
        check.require(isinstance(self.train_embeddings, bool), "train_embeddings", self.train_embeddings,
                      "true or false")
        check.require(isinstance(self.shared_embeddings, bool), "shared_embeddings", self.shared_embeddings,
                      "true or false")
        check.require(_is_int(self.sample_seed) and self.sample_seed >= 0, "sample_seed", self.sample_seed,
                      "integer >= 0")
        check.require(isinstance(self.base_dropout, bool), "base_dropout", self.base_dropout, "true or false")

    def sequence_overhead(self) -> int:
        """The virtual tokens: the soft prompt plus the optional instance token."""
        return self.num_tokens + int(self.instance_token)
