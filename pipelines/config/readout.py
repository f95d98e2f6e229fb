"""`model.readout`: what a job's classifier reads, resolved before training and installed on the base model.

Encoder-only models (BERT family) classify with a linear head, which reads one of `capt.arch.readout.READOUTS`
(pooler, cls, mean, capsule); T5 and decoder-only models produce the label word with their language-model head,
the one readout they have ("lm_head"). An unset `model.readout` resolves to `ENCODER_READOUT` or "lm_head" by the
model's family, so result.json and the MLflow params always hold the value used.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from capt.arch.readout import READOUTS
from capt.methods import METHODS
from pipelines.config.schema import LM_HEAD, JobConfig, raw_value
from pipelines.models.shape import model_shape

if TYPE_CHECKING:
    from capt.arch import ArchSpec

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
