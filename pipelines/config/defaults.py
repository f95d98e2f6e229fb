"""What a job gets where its config names nothing: the optimiser, learning rate and training values its method
declares for the model's family, and the readout of the model's family.

A job's config is resolved before anything trains (`pipelines.config.load`), so result.json, the MLflow params and
the config hash all hold the values actually used, never `None`:

- `optim.name` and `optim.lr` left empty are filled in from the entry its method's config class declares for the
  model's family (`resolve_optim`; where the values come from: `capt.optim_defaults`). `OPTIM_DEFAULTS`
  (`capt.methods`) shows every registered method's entries as one table. `resolve_training` first gives a job the
  rest of its method's authors' training values (`training_defaults`: weight decay, schedule, clipping, batch,
  epochs) where its config sets none.
- `model.readout`, what a job's classifier reads (`resolve_readout`): encoder-only models (BERT family) classify with
  a linear head, which reads one of `capt.arch.readout.READOUTS` (pooler, cls, mean, capsule); T5 and decoder-only
  models produce the label word with their language-model head, the one readout they have (`LM_HEAD`). An unset
  `model.readout` resolves to `ENCODER_READOUT` or `LM_HEAD` by the model's family.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from capt.arch.readout import READOUTS
from capt.methods import METHODS, OPTIM_DEFAULTS, optim_default
from capt.optim_defaults import FAMILIES, OptimDefault
from pipelines.config.schema import LM_HEAD, JobConfig, raw_value
from pipelines.models.shape import model_shape

if TYPE_CHECKING:
    from capt.arch import ArchSpec

__all__ = ["ENCODER_READOUT", "FAMILIES", "LM_HEAD", "OPTIM_DEFAULTS", "OptimDefault", "allowed_readouts",
           "default_readout", "model_family", "optim_default", "readout_problems", "resolve_optim", "resolve_readout",
           "resolve_training"]


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


# `model.readout`

ENCODER_READOUT = "mean"
"""Default readout of encoder-only models, chosen on validation (benchmarks/README.md, "Readout of MiniLM"):
the mean of the token states, the pooling MiniLM (all-MiniLM-L6-v2) was trained with."""


def has_capsule_slot(method: str) -> bool:
    """Whether registered method `method` says its inputs carry a capsule slot (what the "capsule" readout reads)."""
    return isinstance(method, str) and method in METHODS and METHODS[method].has_capsule_slot


def slot_methods() -> tuple[str, ...]:
    """The registered methods with a capsule slot, in registry order."""
    return tuple(name for name in METHODS if has_capsule_slot(name))


def default_readout(spec: ArchSpec) -> str:
    """The readout a job on a model of family `spec` gets when `model.readout` is unset."""
    return ENCODER_READOUT if spec.classifier_head else LM_HEAD


def allowed_readouts(spec: ArchSpec, method: str) -> tuple[str, ...]:
    """The readouts of a (family, method): the classifier readouts ("capsule" only with a slot), else "lm_head"."""
    if not spec.classifier_head:
        return (LM_HEAD,)
    return tuple(r for r in READOUTS if r != "capsule" or has_capsule_slot(method))


def readout_problems(raw: dict[str, Any], spec: ArchSpec) -> list[str]:
    """`model.readout` against the model's family and the method (the schema checks the spelling)."""
    readout, method = raw_value(raw, "model.readout"), raw_value(raw, "method.name")
    if readout is None or readout not in (*READOUTS, LM_HEAD):
        return []
    allowed = allowed_readouts(spec, method)
    if readout in allowed:
        return []
    if not spec.classifier_head:
        why = (f"{spec.family!r} models read the label word from their language-model head, so the readout options are "
               "for encoder-only (BERT-family) classifiers")
    elif readout == LM_HEAD:
        why = "encoder-only models classify with a linear head, not a language-model head"
    else:
        with_slot = slot_methods()
        why = (f"method {method!r} has no capsule slot (only {', '.join(with_slot)} "
               f"{'has' if len(with_slot) == 1 else 'have'} one)")
    return [f"model.readout={readout!r} with model.name={raw_value(raw, 'model.name')!r} and "
            f"method.name={method!r}: {why} (allowed: {', '.join(allowed)}, or leave it unset for "
            f"{default_readout(spec)!r})"]


def resolve_readout(config: JobConfig) -> JobConfig:
    """`config` with `model.readout` filled in from the model's family when unset (unchanged otherwise)."""
    if config.model.readout is not None:
        return config
    model = dataclasses.replace(config.model, readout=default_readout(model_shape(config.model.name).spec))
    return dataclasses.replace(config, model=model)
