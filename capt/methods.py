"""The method registry: CaPT and every baseline by name, each a (config class, model class) pair.

    from capt.methods import METHODS, apply_method
    config = METHODS["lora"].build_config({"r": 4})
    adapted = apply_method(model, config)             # a `MethodModel`
    adapted.save("out/lora"); base = adapted.detach()
    adapted = METHODS["lora"].model_class.load(base, "out/lora")

Adding a method is one module (its config class and its model class, which implements `MethodModel`)
and one line in `METHODS`. Callers (the pipelines) never branch on a method's name: what differs between
methods is a property or method of `MethodModel`, or a fact its config class declares (`optim_defaults`, its
optimiser and lr per model family; `has_capsule_slot`; `sequence_overhead`, `missing_layers` and
`unsupported_reason`, what validation checks against a model's config), read through `Method`
(`OPTIM_DEFAULTS`, `optim_default`: the declared optimiser defaults of every registered method as one table).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from capt.baselines.adapter.config import AdapterConfig
from capt.baselines.config import FullFinetuneConfig, LoraConfig, PromptTuningConfig, PTuningV2Config
from capt.baselines.dept.config import DeptConfig
from capt.baselines.ept.config import EPTConfig
from capt.baselines.residual_prompt.config import ResidualPromptConfig
from capt.baselines.smop.config import SMoPConfig
from capt.baselines.superpos_prompt.config import SuperPosPromptConfig
from capt.baselines.vfpt.config import VfptConfig
from capt.baselines.xprompt.config import XPromptConfig
from capt.config import CapsuleConfig
from capt.errors import UnknownConfigError, UnknownMethodError
from capt.optim_defaults import FAMILIES, OptimDefault, Setting

if TYPE_CHECKING:
    from torch import Tensor, nn

    from capt.phases import BatchLosses


@runtime_checkable
class MethodModel(Protocol):
    """What every method's adapted model offers: a frozen (or, for full fine-tuning, trainable) base model
    with the method in place, whose `forward` and `generate` mirror the base model's."""

    method: str
    """The method's name (its key in `METHODS`)."""
    base_model: nn.Module
    """The wrapped base model."""

    def trainable_parameters(self) -> Iterator[nn.Parameter]:
        """The parameters the method trains (none of the frozen base model's)."""

    def parameter_groups(self) -> list[tuple[list[nn.Parameter], float | None]]:
        """`trainable_parameters` split into optimiser groups, each with its own learning rate or None for the
        job's `optim.lr` (one group for most methods; DePT trains its low-rank matrices at a second rate)."""

    def save(self, directory: str | os.PathLike, task: str | None = None,
             metrics: Mapping[str, float] | None = None, overwrite: bool = False) -> Path:
        """Write the method's artifact (safetensors + JSON) to `directory`."""

    @classmethod
    def load(cls, base_model: nn.Module, directory: str | os.PathLike) -> MethodModel:
        """Rebuild the method saved in `directory` on `base_model`, refusing an artifact that does not fit it."""

    def detach(self) -> nn.Module:
        """Remove the method and hand back the base model as it was."""

    @property
    def added_positions(self) -> int:
        """`sequence_overhead` of this model's own config: the positions it inserts into every input."""

    def training_phases(self, total_steps: int) -> list[int]:
        """Optimiser steps after which a new training phase begins (increasing, within 1..total_steps-1); empty
        for a method trained in one phase (`capt.phases.SinglePhase`)."""

    def begin_phase(self, index: int, batch_losses: BatchLosses) -> None:
        """Start training phase `index` (1, 2, ...), e.g. prune and rewind, estimating what it needs from
        `batch_losses()` (training losses with their graphs, the same batches on every rank)."""

    def phase_state(self) -> dict[str, Tensor]:
        """Non-trainable tensors the phases have set (masks, rewind points), so a checkpoint can carry them."""

    def load_phase_state(self, state: dict[str, Tensor]) -> None:
        """Restore `phase_state()` from a checkpoint."""


@dataclass(frozen=True)
class Method:
    """One registered method: its typed config and the model class that applies it."""

    config_class: type
    """The method's config class (a frozen dataclass with `from_dict` / `to_dict`, `sequence_overhead`,
    `missing_layers` and the class method `unsupported_reason`: torch-free, as config validation needs them)."""
    model_path: str
    """Where the class implementing `MethodModel` lives, as ``module:Class``. Imported on first use, so that
    reading the registry (names, configs: what config validation needs) loads no torch or transformers."""
    registers_model: bool = False
    """Whether sweeps publish the method's artifacts as registry versions (`capt-<model>-<task>`): capsules, not
    the baselines' adapters. Stated here, not on the model class, so that a sweep's driver decides without torch."""

    @property
    def model_class(self) -> type:
        """The class implementing `MethodModel`; `model_class.apply(model, config)` adapts a base model."""
        module, _, name = self.model_path.partition(":")
        return getattr(importlib.import_module(module), name)

    def __post_init__(self) -> None:
        declared = self.declared_optim_defaults
        unknown = sorted(set(declared) - set(FAMILIES))
        if unknown or not all(isinstance(d, OptimDefault) for d in declared.values()):
            raise ValueError(f"{self.config_class.__name__}.optim_defaults={declared!r}: expected OptimDefault "
                             f"entries keyed by model family ({', '.join(FAMILIES)}); unknown keys: {unknown}")
        stated = {key for row in self.provenance for key in row.keys}
        if unsourced := sorted(set(self.training_defaults) - stated):
            raise ValueError(f"{self.config_class.__name__}.training_defaults: {', '.join(unsourced)} without a "
                             "provenance row saying where the value comes from")

    @property
    def declared_optim_defaults(self) -> Mapping[str, OptimDefault]:
        """Family -> `OptimDefault` as the config class itself declares it (`optim_defaults`). A parent class's
        entries do not count: a method built on another's config (DePT on prompt tuning) trains differently, so a
        method that declares nothing has no defaults rather than borrowed ones."""
        return vars(self.config_class).get("optim_defaults", {})

    @property
    def provenance(self) -> tuple[Setting, ...]:
        """The rows of the baseline-settings table the config class itself declares (`provenance`)."""
        return vars(self.config_class).get("provenance", ())

    @property
    def training_defaults(self) -> Mapping[str, Any]:
        """Job-config keys outside the method's options (``optim.weight_decay``, ``train.batch_size``) with the
        values its authors train with, which a job that sets none of them gets (`training_defaults` of the config
        class itself; every key has a `provenance` row saying where the value comes from)."""
        return vars(self.config_class).get("training_defaults", {})

    def optim_default(self, family: str) -> OptimDefault | None:
        """The optimiser and lr the method declares for model family `family`; None when it declares none."""
        return self.declared_optim_defaults.get(family)

    @property
    def has_capsule_slot(self) -> bool:
        """Whether the method's inputs carry a capsule slot (what an encoder classifier's "capsule" readout
        reads); a config class that does not declare `has_capsule_slot` has none."""
        return bool(getattr(self.config_class, "has_capsule_slot", False))

    def build_config(self, options: Mapping[str, Any]) -> Any:
        """The typed config from plain options (raises naming every bad option)."""
        return self.config_class.from_dict(dict(options))

    def sequence_overhead(self, options: Mapping[str, Any]) -> int:
        """Positions the method with `options` adds to every input sequence (capsule slots, soft-prompt tokens)."""
        return self.build_config(options).sequence_overhead()

    def missing_layers(self, options: Mapping[str, Any], num_layers: int) -> list[int]:
        """Layer indices the method's `options` name that a stack of `num_layers` layers lacks (empty when none)."""
        return self.build_config(options).missing_layers(num_layers)

    def unsupported_reason(self, model_type: str) -> str | None:
        """Why the method cannot run on a model of `config.model_type` `model_type`; None when it can."""
        return self.config_class.unsupported_reason(model_type)


METHODS: dict[str, Method] = {
    "capt": Method(CapsuleConfig, "capt.inject:CapsuleModel", registers_model=True),
    "prompt_tuning": Method(PromptTuningConfig, "capt.baselines.prompt:PromptTuningModel"),
    "ptuning_v2": Method(PTuningV2Config, "capt.baselines.prefix:PTuningV2Model"),
    "lora": Method(LoraConfig, "capt.baselines.lora:LoraModel"),
    "full_finetune": Method(FullFinetuneConfig, "capt.baselines.full:FullFinetuneModel"),
    "adapter": Method(AdapterConfig, "capt.baselines.adapter.model:AdapterModel"),
    "dept": Method(DeptConfig, "capt.baselines.dept.model:DeptModel"),
    "residual_prompt": Method(ResidualPromptConfig, "capt.baselines.residual_prompt.model:ResidualPromptModel"),
    "superpos_prompt": Method(SuperPosPromptConfig, "capt.baselines.superpos_prompt.model:SuperPosPromptModel"),
    "vfpt": Method(VfptConfig, "capt.baselines.vfpt.model:VfptModel"),
    "smop": Method(SMoPConfig, "capt.baselines.smop.model:SMoPModel"),
    "ept": Method(EPTConfig, "capt.baselines.ept.model:EPTModel"),
    "xprompt": Method(XPromptConfig, "capt.baselines.xprompt.model:XPromptModel"),
}
"""Method name -> (config class, model class)."""


class DeclaredDefaults(Mapping[tuple[str, str], OptimDefault]):
    """(method, family) -> `OptimDefault`, read from the registry at each use, so it holds exactly the methods
    registered at that moment."""

    def __getitem__(self, key: tuple[str, str]) -> OptimDefault:
        if not (isinstance(key, tuple) and len(key) == 2 and key[0] in METHODS):
            raise KeyError(key)
        default = METHODS[key[0]].optim_default(key[1])
        if default is None:
            raise KeyError(key)
        return default

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter([(name, family) for name, method in METHODS.items() for family in FAMILIES
                     if method.optim_default(family) is not None])

    def __len__(self) -> int:
        return sum(1 for _ in self)


OPTIM_DEFAULTS: Mapping[tuple[str, str], OptimDefault] = DeclaredDefaults()
"""Every registered method's declared defaults, keyed by (method, family)."""


def optim_default(method: str, family: str) -> OptimDefault:
    """The default `method` declares for `family`; ValueError naming both when it declares none."""
    try:
        return OPTIM_DEFAULTS[(method, family)]
    except KeyError:
        known = ", ".join(sorted({m for m, _ in OPTIM_DEFAULTS}))
        raise ValueError(f"No default optimiser for method {method!r} on model family {family!r} (methods: {known}; "
                         f"families: {', '.join(FAMILIES)}); set optim.name and optim.lr.") from None


def method_names() -> tuple[str, ...]:
    """Every registered method name, in registry order."""
    return tuple(METHODS)


@contextmanager
def registered_method(name: str, method: Method) -> Iterator[Method]:
    """`method` registered as `name` in `METHODS` for the duration of the block, then removed (a method defined
    outside this module, e.g. in a test, runs through everything that reads the registry)."""
    if name in METHODS:
        raise ValueError(f"method name {name!r} is already registered (registered: {', '.join(METHODS)})")
    METHODS[name] = method
    try:
        yield method
    finally:
        del METHODS[name]


def get_method(name: str) -> Method:
    """The registered method `name`, or an error listing the registered names."""
    try:
        return METHODS[name]
    except (KeyError, TypeError):
        raise UnknownMethodError(f"Unknown method {name!r} (allowed: {', '.join(METHODS)}).") from None


def method_of_config(config: Any) -> str:
    """The name of the method whose config class `config` is an instance of."""
    for name, method in METHODS.items():
        if type(config) is method.config_class:
            return name
    raise UnknownConfigError(f"unknown method config {type(config).__name__}; expected one of "
                             f"{[m.config_class.__name__ for m in METHODS.values()]}")


def apply_method(model: nn.Module, config: Any) -> MethodModel:
    """Adapt `model` with the method that `config`'s type selects."""
    return METHODS[method_of_config(config)].model_class.apply(model, config)
