"""Typed, validated configurations of the baseline methods.

Every config is a frozen dataclass. Construction validates all fields at once and raises `ConfigError`
(a ``ValueError``) naming every bad key, its value and what is allowed (`capt.errors.Problems`). ``from_dict``
additionally rejects unknown keys.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

from capt.arch import REGISTRY, spec_for_model_type
from capt.errors import Problems
from capt.optim_defaults import PROMPT_T5, SMALL_STATES, UNMEASURED, OptimDefault, Setting, measured

_PTUNING = ("P-Tuning v2 (Liu et al. 2022) tunes lr in 5e-3..1e-2; the paper presets use 1e-2 with the "
            "CaPT paper's optimiser for prompt methods (Adafactor)")
_LORA = "LoRA (Hu et al. 2021): AdamW, lr 4e-4..5e-4 on RoBERTa GLUE"
_LORA_OTHER = _LORA + "; " + UNMEASURED


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


class BaselineConfig:
    """Shared behaviour of the baseline configs (serialisation, unknown-key checks)."""

    method: ClassVar[str] = ""
    has_capsule_slot: ClassVar[bool] = False
    """Whether the method's inputs carry a capsule slot, which an encoder classifier's "capsule" readout reads."""
    optim_defaults: ClassVar[dict[str, OptimDefault]] = {}
    """Optimiser and lr per model family when a job gives none (`capt.optim_defaults`). Each method declares its
    own: `capt.methods.Method.optim_default` never reads a parent class's, whose method trains differently."""

    def _validate(self, check: Problems) -> None:
        """Record problems of this config's fields (overridden per method)."""

    def sequence_overhead(self) -> int:
        """Positions the method adds to every input sequence (none unless overridden)."""
        return 0

    def missing_layers(self, num_layers: int) -> list[int]:
        """Baselines name no layer indices: always empty."""
        return []

    @classmethod
    def unsupported_reason(cls, model_type: str) -> str | None:
        """Why the baselines refuse ``model_type`` (None when they accept it)."""
        if any(spec.accepts_baselines(model_type) for spec in REGISTRY):
            return None
        capsules = " (CaPT does)" if spec_for_model_type(model_type) is not None else ""
        return f"the baselines do not support model_type={model_type!r}{capsules}"

    def __post_init__(self) -> None:
        check = Problems(type(self).__name__)
        self._validate(check)
        check.raise_if_any()

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-serialisable dict of the fields."""
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        """Build from a dict, rejecting unknown keys (listed with the allowed ones) and invalid values."""
        problems = Problems(cls.__name__)
        if not isinstance(data, dict):
            problems.add("options", data, f"a mapping of {cls.__name__} fields, not a {type(data).__name__}")
        else:
            problems.unknown_keys(data, [f.name for f in dataclasses.fields(cls)])  # type: ignore[arg-type]
        problems.raise_if_any()
        return cls(**data)


@dataclass(frozen=True)
class PromptTuningConfig(BaselineConfig):
    """Prompt tuning: ``num_tokens`` trainable vectors prepended at the input embeddings."""

    method: ClassVar[str] = "prompt_tuning"
    optim_defaults: ClassVar[dict[str, OptimDefault]] = {
        "t5": OptimDefault("adafactor", 0.3, PROMPT_T5),
        "decoder": OptimDefault("adamw", 1e-2, SMALL_STATES),
        "encoder": OptimDefault("adamw", 3e-3, measured(3e-3, "0.003, 0.01, 0.03", "COPA and RTE chose it too")),
    }
    provenance: ClassVar[tuple[Setting, ...]] = (
        Setting("prompt length", ("method.options.num_tokens",),
                "Lester et al. 2021 (T5, Adafactor); the CaPT paper's baseline"),
        Setting("prompt init", ("method.options.init", "method.options.init_std"),
                "ours: Lester et al. report sampled-vocabulary and class-label inits above random ones "
                "(`init: vocab` samples vocabulary rows)"),
        Setting("schedule, warm-up", ("optim.schedule", "optim.warmup_ratio"),
                "Lester et al. 2021, Section 3: a constant learning rate (0.3 with Adafactor on T5), no decay"),
    )
    training_defaults: ClassVar[dict[str, Any]] = {"optim.schedule": "constant", "optim.warmup_ratio": 0.0}

    inits: ClassVar[tuple[str, ...]] = ("normal", "vocab")
    """Values `init` may take (a method with more initialisations widens it)."""

    num_tokens: int = 100
    """Number of soft-prompt vectors (each of width d)."""
    init: str = "normal"
    """Initialisation: "normal" (N(0, init_std)) or "vocab" (copies of randomly drawn token embeddings)."""
    init_std: float = 0.02
    """Standard deviation of the "normal" initialisation."""
    instance_token: bool = False
    """Add one training-free token whose embedding is the masked mean of the input token embeddings."""

    def _validate(self, check: Problems) -> None:
        check.require(_is_int(self.num_tokens) and self.num_tokens >= 1, "num_tokens", self.num_tokens,
                      "integer >= 1")
        check.require(self.init in self.inits, "init", self.init, " or ".join(repr(i) for i in self.inits))
        check.require(_is_real(self.init_std) and self.init_std > 0, "init_std", self.init_std,
                      "finite number > 0")
        check.require(isinstance(self.instance_token, bool), "instance_token", self.instance_token,
                      "true or false")

    def sequence_overhead(self) -> int:
        """The virtual tokens: the soft prompt plus the optional instance token."""
        return self.num_tokens + int(self.instance_token)


@dataclass(frozen=True)
class PTuningV2Config(BaselineConfig):
    """P-Tuning v2: learned key/value prefixes in every self-attention layer."""

    method: ClassVar[str] = "ptuning_v2"
    optim_defaults: ClassVar[dict[str, OptimDefault]] = {
        "t5": OptimDefault("adafactor", 1e-2, _PTUNING),
        "decoder": OptimDefault("adamw", 1e-2, "P-Tuning v2 (Liu et al. 2022): AdamW, lr 5e-3..1e-2; not tuned for "
                                "decoder-only models"),
        "encoder": OptimDefault("adamw", 3e-2, measured(0.03, "0.003, 0.01, 0.03", "COPA and RTE chose it too; "
                                                        "above P-Tuning v2's own 5e-3..1e-2 (Liu et al. 2022) at "
                                                        "this short budget")),
    }
    provenance: ClassVar[tuple[Setting, ...]] = (
        Setting("prefix length, init", ("method.options.num_tokens", "method.options.init_std"),
                "ours: P-Tuning v2 (Liu et al. 2022) chooses the length per task"),
        Setting("reparameterisation, prefix dropout", ("method.options.reparameterize", "method.options.dropout"),
                "ours: Liu et al. 2022 find the reparameterisation helps on some tasks and hurts on others"),
    )

    num_tokens: int = 20
    """Prefix length (keys/values added to every self-attention layer)."""
    reparameterize: bool = False
    """Produce the prefixes from an embedding through a 2-layer MLP instead of learning them directly."""
    reparam_hidden: int = 512
    """Hidden width of the reparameterisation MLP (used only when reparameterize is true)."""
    dropout: float = 0.0
    """Dropout applied to the prefix keys/values during training."""
    init_std: float = 1.0
    """Standard deviation of the normal initialisation of the prefixes (or of the MLP input embedding)."""
    instance_tokens: int = 0
    """Training-free instance-aware tokens added at inference (eval mode, generate), never in training steps: the
    instance-only capsule (the masked mean of the previous layer's states, `task_vector=False`); T5 and decoder-only."""

    def _validate(self, check: Problems) -> None:
        check.require(_is_int(self.num_tokens) and self.num_tokens >= 1, "num_tokens", self.num_tokens,
                      "integer >= 1")
        check.require(_is_int(self.instance_tokens) and self.instance_tokens >= 0, "instance_tokens",
                      self.instance_tokens, "integer >= 0 (0: none)")
        check.require(isinstance(self.reparameterize, bool), "reparameterize", self.reparameterize,
                      "true or false")
        check.require(_is_int(self.reparam_hidden) and self.reparam_hidden >= 1, "reparam_hidden",
                      self.reparam_hidden, "integer >= 1")
        check.require(_is_real(self.dropout) and 0.0 <= self.dropout < 1.0, "dropout", self.dropout,
                      "number in [0, 1)")
        check.require(_is_real(self.init_std) and self.init_std > 0, "init_std", self.init_std,
                      "finite number > 0")

    def sequence_overhead(self) -> int:
        """The inference-time instance tokens (`capt.baselines.instance_tokens`); the prefixes live in the KV cache."""
        return self.instance_tokens


@dataclass(frozen=True)
class LoraConfig(BaselineConfig):
    """LoRA (through PEFT): low-rank updates of the targeted linear layers."""

    method: ClassVar[str] = "lora"
    optim_defaults: ClassVar[dict[str, OptimDefault]] = {
        "t5": OptimDefault("adamw", 5e-4, _LORA_OTHER),
        "decoder": OptimDefault("adamw", 5e-4, _LORA_OTHER),
        "encoder": OptimDefault("adamw", 1e-4, measured(1e-4, "1e-4, 5e-4, 2e-3", "COPA chose it too, RTE 2e-3; "
                                                        + _LORA)),
    }
    provenance: ClassVar[tuple[Setting, ...]] = (
        Setting("r, alpha, targets", ("method.options.r", "method.options.alpha", "method.options.target_modules"),
                "targets: Hu et al. 2021 (Wq, Wv; none given: each family's query and value projections); r and "
                "alpha ours"),
        Setting("dropout", ("method.options.dropout",), "ours (not determined from Hu et al. 2021)"),
    )

    r: int = 8
    """Rank of the update."""
    alpha: float = 16
    """Scaling numerator (the update is scaled by alpha / r)."""
    dropout: float = 0.0
    """Dropout on the LoRA branch input."""
    target_modules: list[str] | None = field(default=None)
    """Names of the linear modules to adapt; None picks the family default (``capt.arch`` ``ArchSpec.lora_targets``)."""

    def _validate(self, check: Problems) -> None:
        check.require(_is_int(self.r) and self.r >= 1, "r", self.r, "integer >= 1")
        check.require(_is_real(self.alpha) and self.alpha > 0, "alpha", self.alpha, "finite number > 0")
        check.require(_is_real(self.dropout) and 0.0 <= self.dropout < 1.0, "dropout", self.dropout,
                      "number in [0, 1)")
        targets = self.target_modules
        ok = targets is None or (
            isinstance(targets, list | tuple) and len(targets) > 0
            and all(isinstance(t, str) and t.strip() for t in targets)
        )
        check.require(ok, "target_modules", targets, "null or a non-empty list of module names")


@dataclass(frozen=True)
class FullFinetuneConfig(BaselineConfig):
    """Full fine-tuning: every parameter of the base model trains (no extra parameters)."""

    method: ClassVar[str] = "full_finetune"
    optim_defaults: ClassVar[dict[str, OptimDefault]] = {
        "t5": OptimDefault("adafactor", 1e-3, "T5 (Raffel et al. 2020) fine-tunes with Adafactor at a constant lr "
                           "1e-3"),
        "decoder": OptimDefault("adamw", 5e-5, UNMEASURED + " (the BERT paper's top value, as for encoders)"),
        "encoder": OptimDefault("adamw", 5e-5, measured(5e-5, "2e-5, 5e-5, 1e-4", "COPA chose 1e-4. BERT (Devlin "
                                                        "et al. 2019) fine-tunes with Adam at lr in {5e-5, 3e-5, "
                                                        "2e-5}")),
    }

