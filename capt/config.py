"""`CapsuleConfig`: the one typed, validated description of a capsule and all its ablations."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from capt.arch import spec_for_model_type, supported_model_types
from capt.errors import CapsuleConfigError, Problems
from capt.optim_defaults import OUTLIER, PROMPT_T5, SMALL_STATES, OptimDefault, Setting, measured

LAYER_PRESETS = ("all", "first_half", "odd")
FUSIONS = ("add", "project", "prepend", "conv")
INITS = ("zeros", "normal")


@dataclass(frozen=True)
class CapsuleConfig:
    """How capsules are placed, initialised and fused; every ablation of the paper is a value here."""

    has_capsule_slot: ClassVar[bool] = True
    """The capsule occupies input positions of its own, which an encoder classifier's "capsule" readout reads."""
    optim_defaults: ClassVar[dict[str, OptimDefault]] = {
        "t5": OptimDefault("adafactor", 0.3, PROMPT_T5),
        "decoder": OptimDefault("adamw", 1e-2, SMALL_STATES),
        "encoder": OptimDefault("adamw", 3e-2, measured(0.03, "0.03, 0.1, 0.3", "COPA and RTE chose 0.3 and 0.1. "
                                                        "AdamW rather than T5's Adafactor: " + OUTLIER)),
    }
    provenance: ClassVar[tuple[Setting, ...]] = (
        Setting("capsule layers, fusion, length", ("method.options.layers", "method.options.fusion",
                                                    "method.options.length"),
                "the CaPT paper: one vector in every layer, added to the instance mean; its ablations are other "
                "values here (`pipelines/configs/ablations.yaml`)"),
        Setting("capsule init", ("method.options.init", "method.options.init_std"),
                "ours: zeros, so step 0 is the pure instance mean; the paper does not state its init"),
    )
    """Optimiser and lr per model family when a job gives none (`capt.optim_defaults`)."""

    layers: str | tuple[int, ...] = "all"
    """Capsule layers: "all", "first_half", "odd" (0-based even indices = the 1st, 3rd, ... layers) or indices."""
    fusion: str = "add"
    """How the task vector p_i and the instance mean combine: "add", "project", "prepend" or "conv"."""
    init: str = "zeros"
    """Initial task vectors: "zeros" (step 0 is the pure instance mean) or "normal"."""
    init_std: float = 0.02
    """Standard deviation of the "normal" initialisation."""
    instance_mean: bool = True
    """Fuse the masked mean of the previous layer's states (the instance-aware part)."""
    task_vector: bool = True
    """Train one vector p_i per capsule layer (False: the training-free instance-only anchor)."""
    length: int = 1
    """Number of capsule tokens k per layer."""
    conv_kernel: int = 3
    """Kernel width of the depthwise convolution used by fusion="conv"."""
    project_rank: int = 8
    """Rank r of the low-rank map of fusion="project" (S = p + m + U V m); at most the hidden size D."""

    def __post_init__(self) -> None:
        if isinstance(self.layers, list):
            object.__setattr__(self, "layers", tuple(self.layers))
        problems = Problems("CapsuleConfig", CapsuleConfigError)
        _field_problems(self, problems)
        _combination_problems(self, problems)
        problems.raise_if_any()

    @property
    def num_slots(self) -> int:
        """Sequence positions the capsule occupies: k, plus one mean slot for "prepend" fusion."""
        return self.length + 1 if self.fusion == "prepend" else self.length

    def sequence_overhead(self) -> int:
        """The capsule slots: `num_slots` positions in every input."""
        return self.num_slots

    def missing_layers(self, num_layers: int) -> list[int]:
        """Explicit capsule layer indices beyond a stack of `num_layers` layers (presets always fit)."""
        return [] if isinstance(self.layers, str) else [i for i in self.layers if i >= num_layers]

    @classmethod
    def unsupported_reason(cls, model_type: str) -> str | None:
        """None for every model type of the `capt.arch` registry."""
        if spec_for_model_type(model_type) is None:
            return f"capt does not support model_type={model_type!r} (supported: {', '.join(supported_model_types())})"
        return None

    def resolve_layers(self, num_layers: int) -> tuple[int, ...]:
        """The 0-based capsule layer indices for a stack of `num_layers` layers."""
        if self.layers == "all":
            return tuple(range(num_layers))
        if self.layers == "first_half":
            return tuple(range(max(1, num_layers // 2)))
        if self.layers == "odd":
            return tuple(range(0, num_layers, 2))
        bad = [i for i in self.layers if not 0 <= i < num_layers]
        if bad:
            raise CapsuleConfigError(
                f"CapsuleConfig.layers={list(self.layers)} names layers {bad} but the model has "
                f"{num_layers} layers (allowed: 0..{num_layers - 1})."
            )
        return tuple(sorted(set(self.layers)))

    def check_hidden_size(self, hidden_size: int) -> None:
        """Raise `CapsuleConfigError` if a field exceeds what a model of hidden size `hidden_size` allows."""
        if self.fusion == "project" and self.project_rank > hidden_size:
            raise CapsuleConfigError(
                f"CapsuleConfig.project_rank={self.project_rank} exceeds the model's hidden size {hidden_size} "
                f"(allowed: 1..{hidden_size}); a rank above D adds parameters without adding expressiveness."
            )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (layers as a list when explicit)."""
        data = dataclasses.asdict(self)
        if isinstance(self.layers, tuple):
            data["layers"] = list(self.layers)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CapsuleConfig:
        """Build from a dict, rejecting unknown keys by name."""
        problems = Problems("CapsuleConfig", CapsuleConfigError)
        problems.unknown_keys(data, sorted(f.name for f in dataclasses.fields(cls)))
        problems.raise_if_any()
        return cls(**data)


def _field_problems(cfg: CapsuleConfig, problems: Problems) -> None:
    """Record every invalid field of `cfg`."""
    layers = cfg.layers
    if isinstance(layers, str):
        problems.require(layers in LAYER_PRESETS, "layers", layers,
                         f"{', '.join(LAYER_PRESETS)} or a list of layer indices")
    elif not layers or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in layers):
        problems.add("layers", list(layers), "a non-empty list of non-negative ints")
    problems.require(cfg.fusion in FUSIONS, "fusion", cfg.fusion, ", ".join(FUSIONS))
    problems.require(cfg.init in INITS, "init", cfg.init, ", ".join(INITS))
    bad_std = not isinstance(cfg.init_std, int | float) or isinstance(cfg.init_std, bool) or cfg.init_std <= 0
    problems.require(not bad_std, "init_std", cfg.init_std, "a float > 0")
    for name in ("instance_mean", "task_vector"):
        problems.require(isinstance(getattr(cfg, name), bool), name, getattr(cfg, name), "true or false")
    for name in ("length", "conv_kernel", "project_rank"):
        value = getattr(cfg, name)
        problems.require(isinstance(value, int) and not isinstance(value, bool) and value >= 1, name, value,
                         "an int >= 1")


def _combination_problems(cfg: CapsuleConfig, problems: Problems) -> None:
    """Record field combinations that describe no capsule."""
    if cfg.instance_mean is False and cfg.task_vector is False:
        problems.add("instance_mean", False, "at least one of them true", given_with="task_vector=False")
    if cfg.task_vector is False and cfg.fusion != "add":
        problems.add("fusion", cfg.fusion, "'add'; the instance-only anchor has no weights",
                     given_with="task_vector=False")
    if cfg.instance_mean is False and cfg.fusion in ("project", "conv", "prepend"):
        problems.add("fusion", cfg.fusion, "'add'; there is no mean to fuse", given_with="instance_mean=False")
