"""The capsule artifact: `capsule.safetensors` + `capsule.json`. Nothing is ever unpickled.

This module reads, writes and checks the files and returns plain data (tensors, the validated config and
`CapsuleMetadata`); it builds no capsule or model: `capt.capsule.read_capsule` and `CapsuleModel.load` /
`save` do that from what it returns.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
from torch import nn

from capt import artifact
from capt.arch import spec_for
from capt.config import CapsuleConfig
from capt.errors import CapsuleArtifactError, CapsuleConfigError, CapsuleExistsError, CapsuleIntegrityError
from capt.fingerprint import fingerprint

logger = logging.getLogger(__name__)

WEIGHTS_NAME = "capsule.safetensors"
METADATA_NAME = "capsule.json"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class CapsuleMetadata:
    """What `capsule.json` records about a capsule and the base model it was trained on."""

    format_version: int
    """Artifact format version."""
    capt_version: str
    """Version of the `capt` package that wrote the artifact."""
    config: dict[str, Any]
    """The `CapsuleConfig` as a dict."""
    layers: list[int]
    """Resolved 0-based capsule layer indices."""
    base_model: str
    """Base model name or path (`config._name_or_path`)."""
    model_type: str
    """The base model's `config.model_type`."""
    num_layers: int
    """Layers in the capsule-hosting stack of the base model."""
    hidden_size: int
    """Hidden size d of the base model."""
    fingerprint: str
    """Fingerprint of the base model's parameter names, shapes and sampled values."""
    task: str | None = None
    """Task the capsule was trained for."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Evaluation metrics recorded at save time."""

    @classmethod
    def from_json(cls, data: Any, path: Path) -> CapsuleMetadata:
        """Build from the parsed `capsule.json` at `path`, naming unknown and missing keys and wrong types."""
        if not isinstance(data, dict):
            raise CapsuleArtifactError(f"{path}: expected a JSON object, got {type(data).__name__}.")
        problems = artifact.schema_problems(CAPSULE, data)
        if problems:
            raise CapsuleArtifactError(f"{path} is not a valid capsule description: {'; '.join(problems)}.")
        return cls(**data)


def _value_problems(data: dict[str, Any]) -> list[str]:
    """Layers that are not ints, and a format newer than this package reads."""
    problems = []
    if isinstance(data.get("layers"), list) and not all(isinstance(i, int) for i in data["layers"]):
        problems.append(f"layers={data['layers']!r} (allowed: a list of ints)")
    if isinstance(data.get("format_version"), int) and data["format_version"] > FORMAT_VERSION:
        problems.append(f"format_version={data['format_version']} (this capt reads up to {FORMAT_VERSION})")
    return problems


CAPSULE = artifact.ArtifactKind(
    name="capsule", weights_name=WEIGHTS_NAME, metadata_name=METADATA_NAME,
    field_types={
        "format_version": (int,), "capt_version": (str,), "config": (dict,), "layers": (list,),
        "base_model": (str,), "model_type": (str,), "num_layers": (int,), "hidden_size": (int,),
        "fingerprint": (str,), "task": (str, type(None)), "metrics": (dict,),
    },
    required=frozenset(f.name for f in fields(CapsuleMetadata)
                       if f.default is MISSING and f.default_factory is MISSING),
    error=CapsuleArtifactError, exists_error=CapsuleExistsError, value_problems=_value_problems,
    integrity_error=CapsuleIntegrityError,
)
"""The capsule artifact: `capsule.safetensors` + `capsule.json`."""


def describe(base: nn.Module, config: CapsuleConfig, layers: Sequence[int], task: str | None = None,
             metrics: Mapping[str, float] | None = None) -> CapsuleMetadata:
    """The metadata of a capsule with `config` on `layers` of `base`: what `capsule.json` records."""
    from capt import __version__

    spec = spec_for(base)
    return CapsuleMetadata(
        format_version=FORMAT_VERSION,
        capt_version=__version__,
        config=config.to_dict(),
        layers=list(layers),
        base_model=str(getattr(base.config, "_name_or_path", "") or type(base).__name__),
        model_type=base.config.model_type,
        num_layers=spec.num_layers(base),
        hidden_size=spec.hidden_size(base),
        fingerprint=fingerprint(base),
        task=task,
        metrics={k: float(v) for k, v in (metrics or {}).items()},
    )


def write_capsule(directory: str | os.PathLike, tensors: Mapping[str, torch.Tensor], metadata: CapsuleMetadata,
                  overwrite: bool = False) -> Path:
    """Write a capsule's tensors (float32 on the CPU) and metadata; refuses to replace an artifact unless asked."""
    tensors = {name: t.detach().to("cpu", torch.float32).contiguous() for name, t in tensors.items()}
    artifact.write_artifact(CAPSULE, directory, tensors, asdict(metadata), {"format": "pt"}, overwrite)
    logger.info("Saved capsule (%d parameters) to %s", sum(t.numel() for t in tensors.values()), directory)
    return Path(directory)


def read_metadata(directory: str | os.PathLike) -> CapsuleMetadata:
    """Parse and validate `capsule.json` of an artifact directory without touching any model."""
    return CapsuleMetadata(**artifact.read_metadata(CAPSULE, directory))


def read_config(base_model: nn.Module, directory: str | os.PathLike, strict: bool = True
                ) -> tuple[CapsuleConfig, CapsuleMetadata]:
    """The validated config and metadata of the artifact in `directory`, refused unless it fits `base_model`.

    `strict=False` accepts a base model whose weights differ (same architecture) with a warning.
    """
    metadata = read_metadata(directory)
    _check_base(base_model, metadata, Path(directory), strict)
    try:
        config = CapsuleConfig.from_dict(metadata.config)
        expected = config.resolve_layers(metadata.num_layers)
        config.check_hidden_size(metadata.hidden_size)
    except CapsuleConfigError as err:
        raise CapsuleArtifactError(f"{Path(directory) / METADATA_NAME}: {err}") from err
    if tuple(metadata.layers) != expected:  # checked before a capsule is built from them
        raise CapsuleArtifactError(
            f"{Path(directory) / METADATA_NAME}: layers={metadata.layers} does not match its config (layers="
            f"{config.to_dict()['layers']!r} on a {metadata.num_layers}-layer model gives {list(expected)}); "
            "the artifact is corrupt.")
    return config, metadata


def verify(directory: str | os.PathLike) -> str | None:
    """Verify the capsule's files against its digest manifest (`capt.digest`); its artifact digest, or None
    (with a warning) for a capsule written before manifests."""
    return artifact.verify_artifact(CAPSULE, directory)


def read_tensors(directory: str | os.PathLike, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    """The capsule tensors in `directory` (CPU), which must be exactly `shapes` (name -> shape) and finite."""
    return artifact.read_tensors(CAPSULE, directory, shapes)


def _check_base(base: nn.Module, meta: CapsuleMetadata, directory: Path, strict: bool) -> None:
    spec = spec_for(base)
    actual = {"model_type": base.config.model_type, "num_layers": spec.num_layers(base),
              "hidden_size": spec.hidden_size(base)}
    artifact.check_base(CAPSULE, directory, asdict(meta), actual, trained_on=meta.base_model)
    _check_fingerprint(fingerprint(base), meta, directory, strict)


def _check_fingerprint(current: str, meta: CapsuleMetadata, directory: Path, strict: bool) -> None:
    saved_structure, _, saved_values = meta.fingerprint.partition(":")
    structure, _, values = current.partition(":")
    if structure != saved_structure:
        raise CapsuleArtifactError(
            f"The capsule in {directory} was trained on {meta.base_model!r}, whose parameter names or shapes "
            "differ from this model's; load it onto that base model."
        )
    if "meta" in (values, saved_values) or values == saved_values:
        return
    message = (f"The capsule in {directory} was trained on {meta.base_model!r}, whose weights differ from this "
               "model's (same architecture, other checkpoint)")
    if strict:
        raise CapsuleArtifactError(message + "; pass strict=False to load it anyway.")
    logger.warning("%s; loading anyway because strict=False.", message)
