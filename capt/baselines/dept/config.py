"""`DeptConfig`: the options of decomposed prompt tuning (no torch import: config validation stays light)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from capt.baselines.config import PromptTuningConfig, _is_int, _is_real
from capt.errors import Problems
from capt.optim_defaults import SMALL_STATES, OptimDefault, Setting, measured

DEPT_T5 = ("DePT (Shi & Lipani 2024), the authors' train.py and README (T5-Base): AdamW without weight decay, linear "
           "schedule, 500 warm-up steps, batch 32; soft-prompt lr searched in {3e-1, 4e-1}; the low-rank matrices "
           "train at method.options.embedding_lr (README grid {5e-3, 3e-1, 5e-4})")
"""Where DePT's T5 optimiser default comes from (EPT, built on DePT's decomposition, takes it too)."""


@dataclass(frozen=True)
class DeptConfig(PromptTuningConfig):
    """DePT: a soft prompt of `num_tokens` plus a low-rank offset A B of the first `max_length` input embeddings."""

    method: ClassVar[str] = "dept"
    optim_defaults: ClassVar[dict[str, OptimDefault]] = {
        "t5": OptimDefault("adamw", 0.3, DEPT_T5),
        "decoder": OptimDefault("adamw", 1e-2, SMALL_STATES + "; the soft prompt's lr, as for prompt tuning"),
        "encoder": OptimDefault("adamw", 1e-2, measured(
            1e-2, "0.003, 0.01, 0.03", "with the authors' text init (COPA, under the earlier N(0, 0.02) init, chose "
            "0.003). The soft prompt's lr (the offset's is method.options.embedding_lr)")),
    }
    provenance: ClassVar[tuple[Setting, ...]] = (
        Setting("prompt length m, rank r, length s",
                ("method.options.num_tokens", "method.options.rank", "method.options.max_length"),
                "Shi & Lipani 2024, Section 4 (prompt tuning's budget on T5-Base); ZhengxiangShi/DePT `README.md` "
                "also runs m = 40, r = 45"),
        Setting("prompt init", ("method.options.init",),
                "ZhengxiangShi/DePT `train.py` (`text_init`: the tokens of \"Classify this text is postive or not:\" "
                "repeated to m); a plain job gets it from the model's tokenizer"),
        Setting("offset lr, scaling", ("method.options.embedding_lr", "method.options.alpha"),
                "ZhengxiangShi/DePT `train.py` (AdamW, two groups; A and B at 5e-4 of the grid {5e-3, 3e-1, 5e-4}) "
                "and `peft/tuners/prompt_tuning_lora.py` (scaling alpha / sqrt(r))"),
        Setting("schedule, warm-up", ("optim.schedule", "optim.warmup_ratio"),
                "ZhengxiangShi/DePT `train.py` and `README.md`: linear, 500 warm-up steps of 40,000; the ratio "
                "(500 / 40,000) is ours, a job config has no step count"),
    )
    training_defaults: ClassVar[dict[str, Any]] = {"method.options.init": "text", "optim.warmup_ratio": 0.0125}

    inits: ClassVar[tuple[str, ...]] = ("normal", "vocab", "text")

    init: str = "normal"
    """Initialisation: "text" (the authors': the embeddings of `init_text`'s tokens, repeated to num_tokens), "normal"
    (N(0, init_std); the default because a model alone has no tokenizer, README.md's provenance table) or "vocab"."""
    init_text: str = "Classify this text is postive or not:"
    """The sentence of the "text" init (the authors' train.py default, spelling included)."""
    init_text_ids: list[int] | None = None
    """Token ids of init_text under the model's tokenizer; None: tokenise it with the tokenizer of the base model's
    checkpoint (`config.name_or_path`)."""
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
    """Learning rate of A and B (the soft prompt trains at the job's optim.lr): DePT's second learning rate (the
    authors' README grid: {5e-3, 3e-1, 5e-4})."""

    def _validate(self, check: Problems) -> None:
        super()._validate(check)
        check.require(_is_int(self.rank) and self.rank >= 1, "rank", self.rank, "integer >= 1")
        check.require(_is_int(self.max_length) and self.max_length >= 1, "max_length", self.max_length,
                      "integer >= 1")
        check.require(_is_real(self.alpha) and self.alpha > 0, "alpha", self.alpha, "finite number > 0")
        check.require(_is_real(self.embedding_lr) and self.embedding_lr > 0, "embedding_lr", self.embedding_lr,
                      "finite number > 0")
        check.require(isinstance(self.init_text, str) and bool(self.init_text.strip()), "init_text", self.init_text,
                      "a non-empty sentence")
        ids = self.init_text_ids
        check.require(ids is None or (isinstance(ids, list | tuple) and len(ids) > 0
                                      and all(_is_int(i) and i >= 0 for i in ids)),
                      "init_text_ids", ids, "null or a non-empty list of token ids (integers >= 0)")
