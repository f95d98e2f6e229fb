"""The optimiser and learning rate a job gets when its config names none: what its method declares for the model's
family.

A job's config is resolved before anything trains (`resolve_optim`): `optim.name` and `optim.lr` left empty are
filled in from the entry its method's config class declares for the model's family (`optim_defaults`; where the
values come from: `capt.optim_defaults`), so result.json, the MLflow params and the config hash all hold the
values actually used, never `None`. `OPTIM_DEFAULTS` shows every registered method's entries as one table.
`resolve_training` first gives a job the rest of its method's authors' training values (`training_defaults`:
weight decay, schedule, clipping, batch, epochs) where its config sets none.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

from capt.methods import METHODS
from capt.optim_defaults import FAMILIES, OptimDefault
from pipelines.config.schema import JobConfig
from pipelines.models.shape import model_shape

__all__ = ["FAMILIES", "OPTIM_DEFAULTS", "OptimDefault", "model_family", "optim_default", "resolve_optim",
           "resolve_training"]


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


def model_family(model_name: str) -> str:
    """The family of base model `model_name`, read from its config alone (no weights loaded)."""
    return model_shape(model_name).family


def resolve_training(config: JobConfig, given: Mapping[str, Any]) -> JobConfig:
    """`config` with its method's authors' training values (`Method.training_defaults`: weight decay, schedule,
    clipping, batch, epochs) in every key that `given`, the job's merged sources, leaves unset; a key the job's
    config sets keeps its value."""
    changes: dict[str, dict[str, Any]] = {}
    given_options = (given.get("method") or {}).get("options") or {}
    for key, value in METHODS[config.method.name].training_defaults.items():
        section, _, field = key.rpartition(".")
        if section == "method.options":
            if field not in given_options:
                options = {**config.method.options, field: value}
                config = dataclasses.replace(config, method=dataclasses.replace(config.method, options=options))
        elif field not in (given.get(section) or {}):
            changes.setdefault(section, {})[field] = value
    for section, fields in changes.items():
        config = dataclasses.replace(config, **{section: dataclasses.replace(getattr(config, section), **fields)})
    return config


def resolve_optim(config: JobConfig) -> JobConfig:
    """`config` with `optim.name` and `optim.lr`, when empty, filled in from the method's default for the model's
    family (unchanged otherwise).

    ValueError when only `optim.name` is given and it is not the default optimiser (its lr would not fit).
    """
    optim = config.optim
    if optim.name is not None and optim.lr is not None:
        return config
    family = model_family(config.model.name)
    default = optim_default(config.method.name, family)
    if optim.lr is None and optim.name not in (None, default.optimizer):
        raise ValueError(f"optim.name={optim.name!r} with optim.lr unset: the default lr of method "
                         f"{config.method.name!r} on model.name={config.model.name!r} (family {family!r}) is "
                         f"{default.lr:g} for {default.optimizer}, not for {optim.name}; set optim.lr too")
    resolved = dataclasses.replace(optim, name=optim.name or default.optimizer, lr=optim.lr or default.lr)
    return dataclasses.replace(config, optim=resolved)
